"""Review of 4989954 ("multi_get reads at one moment"), 6eecf8a ("Scans are point-in-time
reads") and 787aa8e (MemTable.add's new-key test; releases counted where a record is kept).

Checked and holds (plain tests below, or by reading):

- Records reach a memtable in sequence order, one batch at a time, so "records with seq <= S
  are what the memtable held at S" holds for a writable DB. Every ``MemTable.add`` of a DB
  is the fast path (under ``_mu``, only while the group-commit queue is empty) or a
  group-commit leader (``_commit``: numbers taken under ``_mu``, which it then releases for
  the log I/O; the leader stays at the head of the queue until ``mem.add`` returned, so no
  other leader and no fast-path writer runs meanwhile). The memtable is switched only by
  ``_make_room_for_write``, called by a queue head (``_prepare_commit``, or ``flush()``'s
  solo writer), never while a leader is between taking its numbers and applying them; the
  leader reads ``self._mem`` after its prepare. So no add lands in a frozen memtable and no
  two adds interleave. The history is written under the memtable lock before the one
  ``dict.update``, so lock-free gets still see a batch whole.
- ``last_seq`` after a writable reopen: the carried memtable is filled by ``add`` from one
  log, whose records are in order, so it is the newest number stored (a scan of a reopened
  DB sees every carried key, and is point-in-time under overwrites). A read-only DB is right
  too while its logs are in sequence order across files, which every state but finding 1's
  leaves them in.
- Scans: one spanning a memtable switch, a flush and a full compaction returns the DB as it
  was at ``scan()``; an unexhausted scan dropped, a scan never started, a scan stopped by
  ``limit`` / ``end``, a scan failing on a read error and a scan still open while the DB
  closes (ClosedError) all release their snapshot; 40 scans open at once are counted and
  all released; the shard's Scan handler releases the snapshot when the client cancels the
  stream (the servicer generator is finalized, its ``finally`` closes the DB iterator).
  A random model (batches of puts and deletes over 120 keys, every state recorded, two
  scanners and one multi_get reader, memtable switches, flushes and compactions under a
  1 us switch interval) finds every scan and multi_get equal to one recorded state; the
  same model against 4047456 (before these commits) fails within its first reads.
- Memory: a scan held open while one key is overwritten cannot grow the history past the
  memtable's size: every overwrite is charged to ``approximate_bytes``, so the memtable is
  switched at ``memtable_bytes`` and the new one keeps no history. tracemalloc, CPython
  3.11, keys of 2-16 bytes, values of 0-100: an overwrite kept for a snapshot costs 173-281
  traced bytes against charges of 178-292 (len(key) + len(value) + 176: a margin of 3-11
  bytes), and inserts are charged 41-50 bytes more than they take, so a memtable under a
  snapshot stays within its charge (pinned below as a whole, for the worst case measured).
  A frozen memtable with history is freed once its scans ended and it is flushed (the
  flush thread holds the memtable it flushed last until it takes the next one:
  pre-existing, at most one memtable, within "1 + max_frozen_memtables").
- multi_get: every key is checked before any is read (an invalid key is
  InvalidArgumentError even after values that exceed ``max_bytes``; before 4989954 the
  ResultTooLargeError came first); duplicate keys, a tombstone in the active or a frozen
  memtable over a value in a table, and ``max_bytes`` (same key index in the message) are
  unchanged. ``list(map(dict.get, keys))`` runs no Python code: keys are exact ``bytes``
  (``_check_key`` refuses bytes subclasses), and it allocates no GC-tracked object.
- Docstrings: nothing in engine/, shard/, router/, docs/, README.md or tests/ still says
  scans or multi_gets are not snapshots. Inexact, not pinned: engine/memtable.py's module
  docstring said "The last release drops the history" and "A frozen memtable keeps whatever
  history its open scans need" (the drop waits for the next snapshot or replacing write,
  which a frozen memtable never gets: it keeps the history until freed); the class docstring
  said "Newest-only"; DB.scan's "kept ... until the iterator is exhausted, closed or
  dropped" likewise. All four were corrected in session 18.

Findings (each fixed in session 18; the test was a strict xfail until then):

1. A read-only open replays every log into ONE memtable, and ``MemTable.last_seq`` is the
   number of the last record *applied*, not the newest stored. Logs are not always in
   sequence order across files: recovery copies the last log's records into a new log
   (engine/recovery.py, "carried") before the manifest names it, and a crash during that
   copy leaves the old log whole beside a new log holding a prefix of it. read_only.py's
   own ``last_seq = max(...)`` allows for this; the memtable does not. The read-only scan's
   snapshot is then the prefix's last number, and every key written after it is skipped as
   "written after the snapshot": get() finds it, scan() does not. ``sievekv cluster
   reshard`` copies a stopped shard with exactly this scan (router/cli/reshard_cmd.py,
   ``_copy_shard``) and its count check reads the copy back the same way, so acknowledged
   keys would be dropped from the resharded cluster without an error. A regression of
   6eecf8a: the test passes on 4047456, whose scan read the memtable without a snapshot.
   (test_a_read_only_scan_after_a_crash_while_recovery_copied_the_last_log_sees_every_key)
"""

from __future__ import annotations

import gc
import random
import shutil
import sys
import threading
import tracemalloc

import grpc
import pytest

from engine import DB
from engine.errors import ClosedError, InvalidArgumentError, ResultTooLargeError, StorageIOError
from engine.faultfs import FaultInjectionFS, InjectedCrash
from engine.format import KIND_VALUE
from engine.memtable import MemTable
from engine.wal import read_log
from shard.server import create_server
from sievekv_proto import sievekv_pb2 as pb
from sievekv_proto import sievekv_pb2_grpc as pbg

from .conftest import wait_until


def _open_snapshots(mem: MemTable) -> int:
    """Snapshots taken on ``mem`` and not yet released (counted or not)."""
    return mem._snapshots - len(mem._released)


def _alive(mem_id: int) -> bool:
    return any(id(o) == mem_id for o in gc.get_objects() if type(o) is MemTable)


def _random_batch(rng, keys, cur: dict, tag: bytes, most: int, deletes: float,
                  longest: int) -> list:
    """1 to ``most`` puts (values ``tag`` + up to ``longest`` bytes) and deletes (each key with
    probability ``deletes``) of distinct ``keys``, applied to the model ``cur`` as well."""
    batch = []
    for k in rng.sample(keys, rng.randint(1, most)):
        if rng.random() < deletes:
            batch.append((k, None))
            cur.pop(k, None)
        else:
            v = tag + b"x" * rng.randint(0, longest)
            batch.append((k, v))
            cur[k] = v
    return batch


def _crash_inside_the_carried_log_copy(tmp_path, n_records: int):
    """A copy of ``tmp_path/'base'`` reopened with a crash that left the last log whole beside
    a new log holding a proper prefix of its records (finding 1 below; also used by
    tests/test_review_session18b.py)."""
    base = tmp_path / "base"
    for n in range(1, 300):
        d = tmp_path / f"crash{n}"
        shutil.copytree(base, d)
        fs = FaultInjectionFS(seed=n)
        fs.crash_after(n)
        try:
            DB.open(d, fs=fs, table_workers=0).close()
        except InjectedCrash:
            pass
        else:
            pytest.fail("the open never crashed inside the copy of the carried log")
        fs.crash("keep")  # the process died; everything it wrote stays
        logs = sorted(p for p in d.iterdir() if p.suffix == ".log")
        if len(logs) == 2 and 0 < len(read_log(fs, str(logs[1])).records) < n_records:
            return d
        shutil.rmtree(d)
    pytest.fail("no crash left a partial copy")


# ---------------------------------------------------------------------------------------------
# Findings (fixed in session 18)

# Fixed in session 18; was a strict xfail: "a read-only DB replays every log into one
# memtable, whose last_seq was the last record applied, not the newest stored; after a crash
# while recovery copied the last log, the copy (a prefix) is replayed last, and the scan's
# snapshot hid every key after it". MemTable.last_seq is now the largest number stored.
def test_a_read_only_scan_after_a_crash_while_recovery_copied_the_last_log_sees_every_key(
        tmp_path):
    base = tmp_path / "base"
    keys = [b"k%02d" % i for i in range(10)]
    with DB.open(base, table_workers=0) as db:
        for k in keys:  # ten log records, left in the log (no flush) and carried at the next open
            db.put(k, b"v-" + k)
    d = _crash_inside_the_carried_log_copy(tmp_path, len(keys))
    with DB.open(d, read_only=True) as ro:
        assert [k for k in keys if ro.get(k) is not None] == keys
        assert [k for k, _v in ro.scan()] == keys


# ---------------------------------------------------------------------------------------------
# Checked and holds: scans

def test_a_scan_spans_a_switch_a_flush_and_a_compaction(tmp_path):
    with DB.open(tmp_path / "db", table_workers=0, memtable_bytes=16 * 1024) as db:
        db.write([(b"t%04d" % i, b"table") for i in range(0, 600, 2)])
        db.flush()
        db.write([(b"t%04d" % i, b"mem") for i in range(0, 600, 3)])
        db.delete(b"t0004")
        expected = dict(db.scan())
        it = db.scan()
        first = [next(it) for _ in range(5)]
        mem = db._rs.mem
        for r in range(3):  # overwrite, delete, insert: several switches (16 KiB memtables)
            db.write([(b"t%04d" % i, b"new%d" % r) for i in range(0, 600, 5)])
            db.write([(b"t%04d" % i, None) for i in range(0, 600, 7)])
            db.write([(b"t%04d" % i, b"ins") for i in range(1, 600, 4)])
        assert db._rs.mem is not mem  # switched while the scan is open
        db.flush()
        db.compact()
        assert dict(first + list(it)) == expected
        assert _open_snapshots(mem) == 0


def test_scans_stopped_any_way_release_their_snapshot(tmp_path):
    with DB.open(tmp_path / "db", table_workers=0) as db:
        db.write([(b"k%03d" % i, b"1") for i in range(200)])
        mem = db._rs.mem
        assert [k for k, _ in db.scan(limit=3)] == [b"k000", b"k001", b"k002"]
        assert len(list(db.scan(end=b"k010"))) == 10
        it = db.scan()
        next(it)
        it.close()
        assert list(db.scan(start=b"k5", end=b"k4")) == [] and list(db.scan(limit=0)) == []
        scans = [db.scan() for _ in range(40)]  # many open at once, some read part-way
        for s in scans[::3]:
            next(s)
        db.write([(b"k%03d" % i, b"2") for i in range(200)])
        assert _open_snapshots(mem) == 40
        assert all(dict(s)[b"k150"] == b"1" for s in scans[::2])
        del scans, s
        assert _open_snapshots(mem) == 0
        db.put(b"k000", b"3")  # a replacing write counts the releases
        assert mem._history is None


def test_a_scan_failing_on_a_read_error_releases_its_snapshot(tmp_path):
    fs = FaultInjectionFS()
    with DB.open(str(tmp_path / "db"), fs=fs, table_workers=0, block_cache_bytes=0,
                 mmap_reads=False) as db:
        db.write([(b"k%05d" % i, b"v" * 200) for i in range(3000)])
        db.flush()
        mem = db._rs.mem
        it = db.scan()
        next(it)
        fs.fail_reads_with(5)  # EIO from here on
        try:
            with pytest.raises(StorageIOError):
                for _ in it:
                    pass
        finally:
            fs.fail_reads_with(None)
        assert _open_snapshots(mem) == 0


def test_a_scan_open_while_the_db_closes_raises_closed_error_and_releases(tmp_path):
    db = DB.open(tmp_path / "db", table_workers=0)
    db.write([(b"k%03d" % i, b"1") for i in range(100)])
    mem = db._rs.mem
    started, unstarted = db.scan(), db.scan()
    next(started)
    db.close()
    for it in (started, unstarted):
        with pytest.raises(ClosedError):
            list(it)
    assert _open_snapshots(mem) == 0


def test_the_shard_releases_the_snapshot_of_a_cancelled_scan_stream(tmp_path):
    db = DB.open(tmp_path / "db", table_workers=0, memtable_bytes=64 << 20)
    serving, port = create_server(db, "127.0.0.1:0", name="s18")
    serving.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        for i in range(250):  # 25 MB, more than the HTTP/2 windows: the handler blocks sending
            db.put(b"big-%04d" % i, b"v" * 100_000)
        mem = db._rs.mem
        kv = pbg.KVStub(channel)
        for _ in range(3):
            stream = kv.Scan(pb.ScanRequest(start=b"big-"), timeout=60)
            next(stream)
            assert _open_snapshots(mem) == 1
            stream.cancel()
            wait_until(lambda: _open_snapshots(mem) == 0, "the cancelled scan's release")
        assert sum(len(r.keys) for r in kv.Scan(pb.ScanRequest(), timeout=60)) == 250
        assert _open_snapshots(mem) == 0
    finally:
        channel.close()
        serving.stop(0)
        db.close()


def test_a_scan_held_open_does_not_grow_the_history_past_the_memtable(tmp_path):
    """One key overwritten 3,000 times under an open scan: each overwrite is charged, so the
    memtable switches at its size and the new one keeps nothing; the pinned one's history is
    bounded by its charge."""
    size = 64 * 1024
    with DB.open(tmp_path / "db", table_workers=0, memtable_bytes=size) as db:
        db.put(b"hot", b"0")
        mem = db._rs.mem
        it = db.scan()
        for i in range(3000):
            db.put(b"hot", b"%040d" % i)
        kept = sum(len(v) for v in mem._history.values())
        assert mem.frozen and kept * (3 + 40 + 176) <= mem.approximate_bytes <= size + 3 + 40 + 176
        assert db._rs.mem._history is None
        assert list(it) == [(b"hot", b"0")]


def test_a_memtable_under_a_snapshot_stays_within_its_charge():
    """tracemalloc: inserts, then one overwrite of every key while a snapshot keeps the
    replaced records (the worst case: empty values, short keys); the memory traced stays
    under approximate_bytes (which the flush trigger compares)."""
    keys = [i.to_bytes(4, "big") for i in range(20000)]
    m = MemTable()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        seq = 1
        for k in keys:
            m.add(seq, [(KIND_VALUE, k, b"")])
            seq += 1
        m.snapshot()
        for k in keys:
            m.add(seq, [(KIND_VALUE, k, b"")])
            seq += 1
        traced = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    traced += sum(sys.getsizeof(k) for k in keys)  # the keys were made before tracing
    assert len(m._history) == len(keys)
    assert traced <= m.approximate_bytes, (traced, m.approximate_bytes)
    m.release()


def test_a_frozen_memtable_with_history_is_freed_after_its_scan_and_flush(tmp_path):
    with DB.open(tmp_path / "db", table_workers=0, disable_auto_compactions=True) as db:
        db.write([(b"k%03d" % i, b"1") for i in range(100)])
        mem_id = id(db._rs.mem)
        it = db.scan()
        db.write([(b"k%03d" % i, b"2") for i in range(100)])  # kept for the scan
        assert next(it) == (b"k000", b"1")
        db.flush()  # frozen and flushed while the scan reads it
        assert dict(it)[b"k099"] == b"1"
        del it
        db.put(b"other", b"x")
        db.flush()  # the flush thread lets go of the memtable it flushed before
        gc.collect()
        assert not _alive(mem_id)


def test_a_reopened_db_scans_its_carried_memtable_at_one_moment(tmp_path):
    """last_seq of the memtable that recovery filled from the last log is its newest number:
    a scan of the reopened DB sees the carried keys, as they were at scan()."""
    keys = [b"k%02d" % i for i in range(30)]
    with DB.open(tmp_path / "db", table_workers=0) as db:
        for k in keys:
            db.put(k, b"1")
    with DB.open(tmp_path / "db", table_workers=0) as db:
        assert len(db._rs.mem) == 30 and db._rs.mem.last_seq == 30
        it = db.scan()
        db.write([(k, b"2") for k in keys])
        db.delete(keys[0])
        assert list(it) == [(k, b"1") for k in keys]
    with DB.open(tmp_path / "db", read_only=True) as ro:
        assert list(ro.scan()) == [(k, b"2") for k in keys[1:]]


# ---------------------------------------------------------------------------------------------
# Checked and holds: multi_get

def test_multi_get_duplicates_tombstones_and_max_bytes(tmp_path):
    with DB.open(tmp_path / "db", table_workers=0) as db:
        db.write([(b"a", b"table-a"), (b"b", b"table-b"), (b"c", b"table-c")])
        db.flush()
        db.delete(b"a")  # active memtable tombstone over a table value
        db.write([(b"c", b"mem-c")])
        assert db.multi_get([b"a", b"b", b"c", b"c", b"zz", b"b"]) == [
            None, b"table-b", b"mem-c", b"mem-c", None, b"table-b"]
        db.flush()
        db.delete(b"b")
        db.flush()  # tombstones now in tables above values in older tables
        assert db.multi_get([b"b", b"a", b"c"]) == [None, None, b"mem-c"]
        db.write([(b"x%d" % i, b"0123456789") for i in range(5)])
        with pytest.raises(ResultTooLargeError, match="by key 4 "):
            db.multi_get([b"x0", b"a", b"x1", b"x2", b"x3"], max_bytes=25)
        assert db.multi_get([b"x0", b"x0"], max_bytes=20) == [b"0123456789"] * 2


def test_multi_get_checks_every_key_before_reading(tmp_path):
    with DB.open(tmp_path / "db", table_workers=0) as db:
        db.write([(b"x%d" % i, b"0123456789") for i in range(5)])
        for bad in ("str", b"", b"k" * (64 * 1024 + 1), None):
            with pytest.raises(InvalidArgumentError):
                db.multi_get([b"x0", b"x1", b"x2", bad], max_bytes=5)
        assert db.multi_get([bytearray(b"x1"), memoryview(b"x2")]) == [b"0123456789"] * 2


# ---------------------------------------------------------------------------------------------
# Checked and holds: a random model of scans and multi_gets under writes, switches, flushes
# and compactions

def test_scans_and_multi_gets_each_see_one_recorded_state(tmp_path):
    keys = [b"m%03d" % j for j in range(120)]
    ver = b"~ver"  # every batch sets it: which state a read saw
    rng = random.Random(18)
    states: list[dict] = [{}]
    bad: list = []
    stop = threading.Event()
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with DB.open(tmp_path / "db", table_workers=0, memtable_bytes=16 * 1024,
                     l0_compaction_trigger=2) as db:
            def reader(kind: str) -> None:
                try:
                    read(kind)
                except BaseException as exc:  # noqa: BLE001 - reported by the test
                    bad.append((kind, repr(exc)))
                    stop.set()

            def read(kind: str) -> None:
                while not stop.is_set():
                    if kind == "scan":
                        got = dict(db.scan())
                    else:
                        got = {k: v for k, v in zip(keys + [ver], db.multi_get(keys + [ver]))
                               if v is not None}
                    v = got.pop(ver, None)
                    i = int(v) if v is not None else 0
                    if got != states[i]:
                        bad.append((kind, i, sorted(set(got.items()) ^ set(states[i].items()))[:4]))
                        stop.set()

            threads = [threading.Thread(target=reader, args=(k,)) for k in ("scan", "scan", "mg")]
            for t in threads:
                t.start()
            try:
                cur: dict = {}
                for i in range(1, 601):
                    if stop.is_set():
                        break
                    batch = _random_batch(rng, keys, cur, b"%d-" % i, most=30, deletes=0.3,
                                          longest=200)
                    batch.append((ver, b"%d" % i))
                    states.append(dict(cur))  # recorded before a reader can see it
                    db.write(batch)
                    if i % 200 == 0:
                        db.flush()
                    if i % 300 == 0:
                        db.compact()
            finally:
                stop.set()
                for t in threads:
                    t.join()
            assert not bad, f"a read saw no recorded state: {bad[0]}"
            mem = db._rs.mem
            assert _open_snapshots(mem) == 0
    finally:
        sys.setswitchinterval(old)
