"""MemTable snapshots: what makes a scan a point-in-time read (engine/memtable.py, "Snapshots").

Pure unit tests of the memtable: a snapshot returns the newest sequence number; while it is
open, records replaced by writes are kept, and ``iterate(snapshot=S)`` shows the memtable as
it was at S; the last release drops them. DB-level checks with concurrent writers are in
tests/test_batch_visibility.py.
"""

from __future__ import annotations

import threading

from engine import DB
from engine.format import KIND_DELETE, KIND_VALUE
from engine.memtable import MemTable

V, D = KIND_VALUE, KIND_DELETE


def _view(m: MemTable, **kw) -> dict:
    return {k: (kind, v) for k, _seq, kind, v in m.iterate(**kw)}


def test_a_snapshot_hides_later_writes_of_every_kind():
    m = MemTable()
    m.add(1, [(V, b"a", b"1"), (V, b"b", b"1"), (V, b"c", b"1")])
    s = m.snapshot()
    assert s == 3
    m.add(4, [(V, b"a", b"2"), (V, b"new", b"2")])  # overwrite, insert
    m.add(6, [(D, b"b", b"")])  # delete
    m.add(7, [(V, b"a", b"3")])  # a second overwrite of the same key
    assert _view(m, snapshot=s) == {b"a": (V, b"1"), b"b": (V, b"1"), b"c": (V, b"1")}
    assert _view(m) == {b"a": (V, b"3"), b"b": (D, b""), b"c": (V, b"1"), b"new": (V, b"2")}
    m.release()
    m.add(8, [(V, b"c", b"4")])
    assert m._history is None  # the last release dropped the kept records
    assert _view(m)[b"c"] == (V, b"4")


def test_nested_snapshots_each_see_their_own_moment():
    m = MemTable()
    m.add(1, [(V, b"k", b"1")])
    s1 = m.snapshot()
    m.add(2, [(V, b"k", b"2")])
    s2 = m.snapshot()
    m.add(3, [(V, b"k", b"3")])
    m.release()  # either one: the count matters
    m.add(4, [(V, b"k", b"4")])
    assert _view(m, snapshot=s1) == {b"k": (V, b"1")}
    assert _view(m, snapshot=s2) == {b"k": (V, b"2")}
    m.release()
    m.add(5, [(V, b"k", b"5")])
    assert m._history is None


def test_chunks_of_keys_written_after_the_snapshot_are_skipped_not_an_end():
    """A chunk whose every key was inserted after S yields nothing; the iterator must still
    go on to the keys after it (the chunk is counted in keys visited, not entries kept)."""
    m = MemTable()
    m.add(1, [(V, b"a", b"old")])
    m.add(2, [(V, b"z", b"old")])
    s = m.snapshot()
    m.add(3, [(V, b"m%04d" % i, b"new") for i in range(1000)])  # 1,000 keys between a and z
    for chunk in (1, 2, 16):
        assert list(m.iterate(chunk=chunk, snapshot=s)) == [
            (b"a", 1, V, b"old"), (b"z", 2, V, b"old")]
        assert len(list(m.iterate(chunk=chunk))) == 1002
    m.release()


def test_release_takes_no_lock():
    """A scan's generator releases its snapshot when finalized, which the garbage collector
    may do in a thread inside add() holding the memtable's lock: release must not wait."""
    m = MemTable()
    m.snapshot()
    done = threading.Event()
    with m.lock:
        t = threading.Thread(target=lambda: (m.release(), done.set()))
        t.start()
        t.join(10)
        assert done.is_set()
    m.add(1, [(V, b"k", b"v")])
    m.add(2, [(V, b"k", b"w")])  # a write that replaces a record counts the release
    assert m._history is None


def test_a_dropped_scan_releases_its_snapshot(tmp_path):
    with DB.open(tmp_path / "db", table_workers=0) as db:
        db.write([(b"k%02d" % i, b"1") for i in range(50)])
        mem = db._rs.mem
        it = db.scan()
        assert next(it) == (b"k00", b"1")
        db.write([(b"k%02d" % i, b"2") for i in range(50)])
        assert [v for _k, v in it] == [b"1"] * 49  # the rest as it was at scan()
        db.put(b"k00", b"3")
        assert mem._history is None  # exhausted: released
        it = db.scan()
        next(it)
        del it  # dropped mid-way
        unstarted = db.scan()  # never read: the snapshot is taken by scan() itself
        db.put(b"k01", b"4")
        assert [v for _k, v in unstarted][:2] == [b"3", b"2"]
        del unstarted
        db.put(b"k00", b"5")
        assert mem._history is None
