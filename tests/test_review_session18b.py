"""Review of c64d4b2 ("DB.snapshot(): get, multi_get and scan as of one moment, until closed"):
engine/snapshot.py, DB.snapshot / _scan_of / _scan(..., sequence), MemTable.record_at, README.

Checked and holds (plain tests below, or by reading):

- What a snapshot reads. A Snapshot holds the ReadState of its moment (its active memtable,
  frozen memtables and tables) and one memtable snapshot; frozen memtables and tables never
  change, and the active memtable keeps what later writes replace. A random model (puts,
  deletes, re-puts of deleted keys, batches, memtable switches, flushes, background and full
  ``compact()`` compactions whose bottom level drops the tombstones, snapshots taken and closed
  at random) finds every open snapshot's get, multi_get and scan (random start / end / limit)
  equal to the state recorded when it was taken. A snapshot taken on an empty new memtable
  (sequence 0) hides everything written to it later. A read-only DB's snapshot reads as its
  gets do.
- Tables. ReadState.build opens every table it lists (``TableSet.get``) and takes a reference
  before it is published; a Snapshot keeps that ReadState, so its references; nothing closes a
  table with references but ``TableSet.close`` (DB close). Compaction unlinks the files of the
  tables it replaced, but every later read of them goes through the descriptor or mappings
  opened then (``RandomAccessFile.read_at`` / ``map``: the filter region and the data region are
  mapped lazily, from the open descriptor, never by path), so a snapshot reads compacted,
  unlinked tables, pread or mapped, including their first filter probe and first data mapping
  after the unlink. File numbers are never reused, so a table set entry is never shared by
  an old and a new file.
- ``MemTable.record_at``'s lock-free path: ``dict.get`` is atomic; in a writable DB a key's
  record only gets newer and a memtable's records arrive in sequence order (test_review_
  session18's first point), so a record <= S read at any time after S is the newest <= S; a
  record > S sends it under the lock to the history, which holds every record replaced since
  S, oldest first. A key deleted and put again after the snapshot, and a key absent at the
  snapshot then put, deleted and put again, read as at the snapshot, also while a writer
  thread rewrites them under a 1 us switch interval.
- Lifetime: close() is idempotent; a dropped snapshot releases its memtable snapshot and its
  tables (the table set's thread closes them); a scan opened from a snapshot reads on after
  the snapshot is closed; DB.close with snapshots open does not wait or hang, closes every
  table (the descriptors of compacted tables a snapshot held included) and later reads raise
  ClosedError; a snapshot outliving its DB only keeps its memtables' memory until it is closed
  or dropped; a snapshot of a DB in its failed state reads as the DB does; 50 snapshots at
  once; one snapshot read by several threads.
- Arguments: the same checks and error classes as DB.get / multi_get / scan (they share
  ``_check_key`` and ``_scan_of``): bytearray and memoryview keys, ``limit=0`` and
  ``start >= end`` give an empty iterator, a bool limit is InvalidArgumentError, max_bytes
  raises ResultTooLargeError with the same message as DB.multi_get.
- Docs: the README and engine/snapshot.py say a snapshot keeps its tables (open and on disk:
  unlinked, their space not given back, as tested) and its memtable's replaced records until
  closed; true. Inexact, not pinned: engine/memtable.py's "a frozen memtable takes neither"
  (snapshots): a scan from a Snapshot whose memtable has been frozen since now takes one
  (harmless: the Snapshot's own count keeps the history). Not pinned (speed): a read through
  an old snapshot of a key overwritten n times since walks the kept records newest first
  under the memtable lock, O(n) while writers wait (n is bounded by the memtable's size).
  Notes: ``Snapshot.sequence`` was public but is the largest sequence number in the active
  memtable then, not the DB's (0 for a snapshot taken right after a flush): now private
  (``_seq``); snapshot reads were not counted in ``stats()["gets"]``: now they are (scans
  are not). ``stats()`` shows neither the open
  snapshots nor the tables they hold after compaction (RocksDB reports num-snapshots and
  oldest-snapshot-time).

Findings (each fixed in session 18, and a strict xfail until then; the interleavings are
made exact with a per-thread ``sys.settrace`` that holds one thread at a chosen line while
another acts: the same switch the GIL may make there, without depending on timing):

1. ``Snapshot.close`` is not safe against a second close at the same time: both threads read
   ``self._rs`` before either clears it, and both call ``rs.mem.release()``. The memtable's
   count drops by two, so another snapshot (or scan) still open on that memtable loses the
   kept records at the next write, and reads wrong values or raises AttributeError. The
   module docstring calls snapshots thread-safe and close() idempotent.
   (test_two_threads_closing_one_snapshot_release_it_once)
2. A read that overlaps close() on the same snapshot does not fail with ClosedError, nor
   read the snapshot's moment: ``_state()`` passes, the close releases the memtable snapshot,
   and the read then uses ``self.sequence`` without holding anything. A scan's own
   ``mem.snapshot()`` then finds no snapshot open, drops the kept records and starts an empty
   history: keys overwritten since the snapshot are silently missing. A get after a write
   meanwhile finds ``_history`` None: AttributeError from ``_as_of``.
   (test_a_scan_overlapping_close_reads_the_moment_or_raises_closed,
   test_a_get_overlapping_close_reads_the_moment_or_raises_closed)
3. Pre-existing (engine/recovery.py and engine/read_only.py, not c64d4b2; found checking
   snapshots of a read-only DB): after a crash while recovery copied the last log's records
   into a new log (the old log whole, the new one a prefix of it), the next open replays the
   old log and then the prefix, so a key overwritten after the prefix gets its *older* record
   back. A read-only open puts both in one memtable, the older record replayed last: get,
   scan and snapshots return the overwritten value. A writable open flushes the old log to an
   L0 table and carries the prefix as the memtable: get returns the old value, scan the new
   one, and a compaction flips get back. Session 18's finding 1 (test_review_session18) used
   distinct keys, so it could not see this.
   (test_a_read_only_open_after_a_crash_in_the_carried_log_copy_reads_the_last_write,
   test_a_writable_open_after_a_crash_in_the_carried_log_copy_reads_the_last_write)
"""

from __future__ import annotations

import gc
import inspect
import os
import random
import sys
import threading

import pytest

from engine import DB
from engine.db import DB as _DB
from engine.errors import ClosedError, InvalidArgumentError, ResultTooLargeError, StorageIOError
from engine.faultfs import FaultInjectionFS
from engine.snapshot import Snapshot

from .conftest import wait_until
from .test_review_session18 import _crash_inside_the_carried_log_copy, _random_batch


def _open_snapshots(mem) -> int:
    """Snapshots taken on ``mem`` and not yet released (counted or not)."""
    return mem._snapshots - len(mem._released)


def _line_of(func, text: str) -> int:
    """The line number of the first line of ``func``'s source holding ``text``."""
    lines, first = inspect.getsourcelines(func)
    for i, line in enumerate(lines):
        if text in line:
            return first + i
    raise AssertionError(f"{text!r} not in {func.__qualname__}")


class _HoldAt:
    """Run ``fn`` in a thread that stops at ``func``'s line holding ``text`` (before it runs),
    until :meth:`resume`. A per-thread trace function: nothing else is slowed or stopped."""

    def __init__(self, func, text: str, fn):
        self._code = getattr(func, "__code__", None)
        self._line = _line_of(func, text)
        self._fn = fn
        self.at = threading.Event()
        self._go = threading.Event()
        self.result = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="held")

    def _trace(self, frame, event, arg):
        if event == "call" and frame.f_code is self._code:
            return self._local
        return None

    def _local(self, frame, event, arg):
        if event == "line" and frame.f_lineno == self._line and not self.at.is_set():
            self.at.set()
            self._go.wait(30)
        return self._local

    def _run(self) -> None:
        sys.settrace(self._trace)
        try:
            self.result = self._fn()
        except BaseException as exc:  # noqa: BLE001 - looked at by the test
            self.error = exc
        finally:
            sys.settrace(None)
            self.at.set()

    def start(self) -> "_HoldAt":
        self._thread.start()
        assert self.at.wait(30), "the thread never reached the line"
        return self

    def resume(self):
        self._go.set()
        self._thread.join(30)
        assert not self._thread.is_alive()
        return self


# ---------------------------------------------------------------------------------------------
# Findings

# Fixed in session 18; was a strict xfail: "Snapshot.close is not atomic: two threads closing
# one snapshot both release its memtable snapshot, and another snapshot still open on that
# memtable loses its kept records". close() now takes and clears the read state under a lock;
# the hold point moved from "self._rs = None" (now under that lock) to the release after it.
def test_two_threads_closing_one_snapshot_release_it_once(tmp_path):
    keys = [b"k%02d" % i for i in range(20)]
    with DB.open(tmp_path / "db", table_workers=0) as db:
        db.write([(k, b"1") for k in keys])
        mem = db._rs.mem
        other = db.snapshot()  # used correctly elsewhere in the program
        snap = db.snapshot()
        try:
            # Thread 1 has taken snap._rs and stops before releasing it; thread 2 closes.
            held = _HoldAt(Snapshot.close, "if rs is not None:", snap.close).start()
            closer = threading.Thread(target=snap.close)
            closer.start()
            closer.join(30)
            held.resume()
            assert held.error is None
            db.write([(k, b"2") for k in keys])  # counts the releases; keeps what "other" needs
            assert other.multi_get(keys) == [b"1"] * len(keys)  # AttributeError: history gone
            assert _open_snapshots(mem) == 1
        finally:
            other.close()


# Fixed in session 18; was a strict xfail: "a scan that overlaps close() of its snapshot reads
# at the snapshot's sequence without holding the kept records: keys overwritten since are
# silently missing". Snapshot reads hold the memtable themselves (Snapshot._hold).
def test_a_scan_overlapping_close_reads_the_moment_or_raises_closed(tmp_path):
    keys = [b"k%02d" % i for i in range(20)]
    with DB.open(tmp_path / "db", table_workers=0) as db:
        db.write([(k, b"1") for k in keys])
        snap = db.snapshot()
        db.write([(k, b"2") for k in keys[::2]])  # kept for the snapshot
        # The scan has passed _state() and stops before its own mem.snapshot(); another
        # thread closes the snapshot meanwhile.
        held = _HoldAt(_DB._scan, "snapshot = mem.snapshot()", lambda: list(snap.scan())).start()
        snap.close()
        held.resume()
        if held.error is not None:
            assert isinstance(held.error, ClosedError), repr(held.error)
        else:
            assert held.result == [(k, b"1") for k in keys]


# Fixed in session 18; was a strict xfail: "a get that overlaps close() of its snapshot finds
# the kept records dropped: AttributeError from MemTable._as_of (or an older value), not
# ClosedError".
def test_a_get_overlapping_close_reads_the_moment_or_raises_closed(tmp_path):
    with DB.open(tmp_path / "db", table_workers=0) as db:
        db.put(b"k", b"1")
        snap = db.snapshot()
        db.put(b"k", b"2")
        held = _HoldAt(Snapshot.get, "e = self._find(rs, key)", lambda: snap.get(b"k")).start()
        snap.close()
        db.put(b"k", b"3")  # a replacing write counts the release and drops the history
        held.resume()
        if held.error is not None:
            assert isinstance(held.error, ClosedError), repr(held.error)
        else:
            assert held.result == b"1"


def _overwritten_at_the_end(tmp_path) -> int:
    with DB.open(tmp_path / "base", table_workers=0) as db:
        db.put(b"k", b"old")
        for i in range(9):
            db.put(b"f%02d" % i, b"x")
        db.put(b"k", b"new")  # acknowledged; the last record of the log
    return 11


# Fixed in session 18; was a strict xfail: "pre-existing: after a crash during recovery's
# copy of the last log, a read-only open replays the prefix copy last and a key overwritten
# after the prefix reads its old value". Replay skips the writes an earlier log held
# (engine/recovery.py, new_records).
def test_a_read_only_open_after_a_crash_in_the_carried_log_copy_reads_the_last_write(tmp_path):
    d = _crash_inside_the_carried_log_copy(tmp_path, _overwritten_at_the_end(tmp_path))
    with DB.open(d, read_only=True) as ro:
        with ro.snapshot() as snap:
            assert (ro.get(b"k"), dict(ro.scan())[b"k"], snap.get(b"k")) == (b"new",) * 3


# Fixed in session 18; was a strict xfail: "pre-existing: after a crash during recovery's
# copy of the last log, a writable open carries the prefix as its memtable over the whole
# log's L0 table: get returns the overwritten value (scan the new one)".
def test_a_writable_open_after_a_crash_in_the_carried_log_copy_reads_the_last_write(tmp_path):
    d = _crash_inside_the_carried_log_copy(tmp_path, _overwritten_at_the_end(tmp_path))
    with DB.open(d, table_workers=0) as db:
        assert dict(db.scan())[b"k"] == b"new"
        assert db.get(b"k") == b"new"


# ---------------------------------------------------------------------------------------------
# Checked and holds: what a snapshot reads

def _check(snap, state: dict, keys: list, rng: random.Random) -> None:
    assert {k: snap.get(k) for k in keys} == {k: state.get(k) for k in keys}
    assert snap.multi_get(keys) == [state.get(k) for k in keys]
    rows = sorted(state.items())
    assert list(snap.scan()) == rows
    for _ in range(3):
        start, end = sorted(rng.sample(keys, 2))
        limit = rng.choice([None, 1, 3, 50])
        want = [(k, v) for k, v in rows if start <= k < end]
        assert list(snap.scan(start, end, limit)) == want[:limit]


def test_random_snapshots_read_their_moment_through_compactions_that_drop_tombstones(tmp_path):
    keys = [b"r%03d" % i for i in range(150)]
    rng = random.Random(1818)
    with DB.open(tmp_path / "db", table_workers=0, memtable_bytes=8 * 1024,
                 l0_compaction_trigger=2, mmap_reads=False, block_cache_bytes=0) as db:
        cur: dict = {}
        open_snaps: list = []
        checked = 0
        try:
            for step in range(400):
                batch = _random_batch(rng, keys, cur, b"%d-" % step, most=12, deletes=0.35,
                                      longest=60)
                db.write(batch)
                r = rng.random()
                if r < 0.08:
                    open_snaps.append((db.snapshot(), dict(cur)))
                elif r < 0.12 and open_snaps:
                    snap, _ = open_snaps.pop(rng.randrange(len(open_snaps)))
                    snap.close()
                elif r < 0.14:
                    db.flush()
                elif r < 0.16:
                    db.compact()  # one level: tombstones dropped under the open snapshots
                if step % 50 == 49:
                    for snap, state in open_snaps:
                        _check(snap, state, keys, rng)
                        checked += 1
            db.compact()
            assert sum(lv["tombstones"] for lv in db.stats()["levels"]) == 0  # all dropped
            for snap, state in open_snaps:
                _check(snap, state, keys, rng)
            assert checked >= 20 and open_snaps
        finally:
            for snap, _ in open_snaps:
                snap.close()
        assert _open_snapshots(db._rs.mem) == 0


def _deleted_fds(path) -> list[str]:
    out = []
    d = f"/proc/{os.getpid()}/fd"
    for fd in os.listdir(d):
        try:
            target = os.readlink(os.path.join(d, fd))
        except OSError:
            continue
        if target.startswith(str(path)) and target.endswith(" (deleted)"):
            out.append(target)
    return out


@pytest.mark.parametrize("mmap_reads", [False, True])
def test_a_snapshot_reads_unlinked_tables_first_touched_after_their_compaction(tmp_path,
                                                                              mmap_reads):
    """The snapshot's tables are compacted away and their files unlinked before any get reads
    them (no filter partition probed, no data region mapped for gets yet): the lazy mappings
    and preads use the descriptors opened before; the files stay held (space not given back)
    until the snapshot is closed."""
    path = tmp_path / "db"
    keys = [b"t%05d" % i for i in range(3000)]
    with DB.open(path, table_workers=0, mmap_reads=mmap_reads, block_cache_bytes=0,
                 disable_auto_compactions=True) as db:
        for part in range(3):
            db.write([(k, b"%d" % part + b"x" * 50) for k in keys[part::3]])
            db.flush()
        db.write([(k, None) for k in keys[::10]])
        db.flush()
        expected = {k: (b"%d" % (i % 3) + b"x" * 50) for i, k in enumerate(keys) if i % 10}
        snap = db.snapshot()
        db.write([(k, b"new") for k in keys[::7]])
        db.compact()  # tombstones and the values they hid dropped; the old files unlinked
        live = {f for f in os.listdir(path) if f.endswith(".sst")}
        assert not live & {os.path.basename(t.path) for t in snap._rs.l0}
        assert len(_deleted_fds(path)) >= 4
        rng = random.Random(3)
        probe = rng.sample(keys, 200)
        assert [snap.get(k) for k in probe] == [expected.get(k) for k in probe]
        assert dict(snap.scan()) == expected
        snap.close()
        del snap
        gc.collect()
        wait_until(lambda: not _deleted_fds(path), "the compacted tables' release")


def test_a_snapshot_on_a_new_empty_memtable_hides_what_is_written_there(tmp_path):
    with DB.open(tmp_path / "db", table_workers=0) as db:
        db.write([(b"a", b"1"), (b"b", b"1")])
        db.flush()
        with db.snapshot() as snap:
            assert snap._seq == 0  # the new memtable's largest number (module notes)
            db.write([(b"a", b"2"), (b"c", b"2")])
            db.delete(b"b")
            db.put(b"b", b"3")
            assert snap.multi_get([b"a", b"b", b"c"]) == [b"1", b"1", None]
            assert list(snap.scan()) == [(b"a", b"1"), (b"b", b"1")]


def test_deleted_then_put_again_after_the_snapshot(tmp_path):
    with DB.open(tmp_path / "db", table_workers=0) as db:
        db.put(b"x", b"1")
        with db.snapshot() as snap:
            db.delete(b"x")
            db.put(b"x", b"2")
            db.put(b"y", b"1")  # absent at the snapshot: put, deleted, put again
            db.delete(b"y")
            db.write([(b"y", b"2"), (b"x", None), (b"x", b"3")])
            assert (snap.get(b"x"), snap.get(b"y")) == (b"1", None)
            assert list(snap.scan()) == [(b"x", b"1")]
            assert (db.get(b"x"), db.get(b"y")) == (b"3", b"2")


def test_record_at_under_a_writer_rewriting_the_keys(tmp_path):
    keys = [b"w%02d" % i for i in range(40)]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with DB.open(tmp_path / "db", table_workers=0, memtable_bytes=1 << 20) as db:
            db.write([(k, b"0") for k in keys[::2]])  # odd keys absent at the snapshot
            want = [b"0" if i % 2 == 0 else None for i in range(len(keys))]
            stop = threading.Event()
            bad: list = []
            with db.snapshot() as snap:
                def writer():
                    i = 0
                    while not stop.is_set():
                        i += 1
                        k = keys[i % len(keys)]
                        if i % 3 == 0:
                            db.delete(k)
                        else:
                            db.put(k, b"%d" % i)

                def reader():
                    while not stop.is_set():
                        got = [snap.get(k) for k in keys]
                        if got != want or snap.multi_get(keys) != want:
                            bad.append(got)
                            stop.set()

                threads = [threading.Thread(target=f) for f in (writer, reader, reader)]
                for t in threads:
                    t.start()
                try:
                    mem = snap._rs.mem
                    wait_until(lambda: len(mem._history or ()) == len(keys) or stop.is_set(),
                               "every key rewritten")
                    for _ in range(200):
                        if stop.is_set():
                            break
                        assert [v for _k, v in snap.scan()] == [b"0"] * (len(keys) // 2)
                finally:
                    stop.set()
                    for t in threads:
                        t.join()
            assert not bad, bad[0]
    finally:
        sys.setswitchinterval(old)


def test_a_read_only_db_snapshot_reads_as_its_gets(tmp_path):
    with DB.open(tmp_path / "db", table_workers=0) as db:
        db.write([(b"k%02d" % i, b"t") for i in range(30)])
        db.flush()
        db.write([(b"k%02d" % i, b"m") for i in range(0, 30, 3)])
        db.delete(b"k01")
    with DB.open(tmp_path / "db", read_only=True) as ro:
        keys = [b"k%02d" % i for i in range(31)]
        with ro.snapshot() as snap:
            assert snap.multi_get(keys) == [ro.get(k) for k in keys]
            assert list(snap.scan(b"k05", b"k20", limit=4)) == list(ro.scan(b"k05", b"k20", 4))
            assert list(snap.scan()) == list(ro.scan())


# ---------------------------------------------------------------------------------------------
# Checked and holds: lifetime

def test_db_close_with_snapshots_open_closes_their_tables_and_does_not_wait(tmp_path):
    path = tmp_path / "db"
    db = DB.open(path, table_workers=0, disable_auto_compactions=True)
    db.write([(b"k%03d" % i, b"1") for i in range(200)])
    db.flush()
    snaps = [db.snapshot() for _ in range(50)]
    it = snaps[0].scan()
    next(it)
    db.write([(b"k%03d" % i, b"2") for i in range(200)])
    db.compact()  # the first table compacted away: held by the snapshots
    assert _deleted_fds(path)
    db.close()
    assert not _deleted_fds(path) and not db._tables.open_tables()
    for s in snaps[:3]:
        with pytest.raises(ClosedError, match="DB is closed"):
            s.multi_get([b"k001"])
    with pytest.raises(ClosedError):
        list(it)
    for s in snaps:
        s.close()


def test_a_snapshot_of_a_failed_db_reads_as_the_db(tmp_path):
    fs = FaultInjectionFS(seed=5)
    with DB.open(str(tmp_path / "db"), fs=fs, table_workers=0) as db:
        db.write([(b"k%02d" % i, b"1") for i in range(20)], sync=True)
        fs.fail_sync(True)
        with pytest.raises(StorageIOError):
            db.put(b"k00", b"2", sync=True)
        fs.fail_sync(False)
        with pytest.raises(StorageIOError, match="refuses writes"):
            db.put(b"k01", b"2")
        keys = [b"k%02d" % i for i in range(21)]
        with db.snapshot() as snap:
            assert snap.multi_get(keys) == db.multi_get(keys)
            assert list(snap.scan()) == list(db.scan())


def test_one_snapshot_read_by_threads_while_others_come_and_go(tmp_path):
    keys = [b"s%02d" % i for i in range(30)]
    with DB.open(tmp_path / "db", table_workers=0, memtable_bytes=16 * 1024) as db:
        db.write([(k, b"base") for k in keys])
        mem = db._rs.mem
        snap = db.snapshot()
        stop = threading.Event()
        bad: list = []

        def reader():
            while not stop.is_set():
                if snap.multi_get(keys) != [b"base"] * 30 or len(list(snap.scan())) != 30:
                    bad.append(1)
                    stop.set()
                with db.snapshot() as s2:  # others opened and closed on the same memtable
                    s2.get(keys[0])

        threads = [threading.Thread(target=reader) for _ in range(3)]
        for t in threads:
            t.start()
        try:
            for i in range(300):
                db.write([(k, b"%d" % i) for k in keys[i % 3::3]])
        finally:
            stop.set()
            for t in threads:
                t.join()
        snap.close()
        assert not bad
        assert _open_snapshots(mem) == 0


def test_a_dropped_snapshot_gives_back_its_compacted_tables(tmp_path):
    path = tmp_path / "db"
    with DB.open(path, table_workers=0, disable_auto_compactions=True) as db:
        db.write([(b"k%03d" % i, b"1") for i in range(100)])
        db.flush()
        snap = db.snapshot()
        db.write([(b"k%03d" % i, b"2") for i in range(100)])
        db.compact()
        assert _deleted_fds(path)
        del snap
        gc.collect()
        wait_until(lambda: not _deleted_fds(path), "the dropped snapshot's tables closed")


# ---------------------------------------------------------------------------------------------
# Checked and holds: arguments, as DB.get / multi_get / scan

def test_arguments_match_the_db_reads(tmp_path):
    with DB.open(tmp_path / "db", table_workers=0) as db:
        db.write([(b"a", b"x" * 10), (b"b", b"y" * 10), (b"c", b"z")])
        with db.snapshot() as snap:
            assert snap.get(bytearray(b"a")) == snap.get(memoryview(b"a")) == b"x" * 10
            assert snap.multi_get([bytearray(b"b"), memoryview(b"c")]) == [b"y" * 10, b"z"]
            assert list(snap.scan(bytearray(b"b"), memoryview(b"c"))) == [(b"b", b"y" * 10)]
            assert list(snap.scan(limit=0)) == [] and list(snap.scan(b"c", b"b")) == []
            assert list(snap.scan(b"b", b"b")) == []
            assert list(snap.scan(b"")) == list(db.scan(b""))
            for bad in (True, 1.0, -1, "2"):
                with pytest.raises(InvalidArgumentError, match="scan limit"):
                    snap.scan(limit=bad)
            for key in (b"", "a", None, b"k" * (64 * 1024 + 1)):
                with pytest.raises(InvalidArgumentError) as e1:
                    snap.get(key)
                with pytest.raises(InvalidArgumentError) as e2:
                    db.get(key)
                assert str(e1.value) == str(e2.value)
            with pytest.raises(ResultTooLargeError) as e1:
                snap.multi_get([b"c", b"a", b"b"], max_bytes=15)
            with pytest.raises(ResultTooLargeError) as e2:
                db.multi_get([b"c", b"a", b"b"], max_bytes=15)
            assert str(e1.value) == str(e2.value)
