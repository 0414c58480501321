"""Review of commit 809e9a7 (recovery reused the last write-ahead log, appending to it): durability
at every step of an open that carries the last log over and of the writes after it. Finding 1
(appending after pages a failed fsync had marked clean could turn them into corruption before
the tail at a power loss) is fixed: the last log's records are now copied into a new log
(engine/recovery.py, step 4); the tests below hold for that design.

Two fault-injection layers over engine/faultfs.py, both defined here:

- :class:`_ReviewFS.kill` ends the simulated *process* while the machine stays up
  (``FaultInjectionFS.crash("process")``, added for this review): everything the OS accepted
  stays, and the layer still remembers which bytes were never fsynced, so a later power loss
  (``crash("drop")``) drops them. (``crash("keep")`` forgets that: afterwards every byte counts
  as synced, so with it no test can see whether the reopen fsyncs what it carries over.)
- ``fsync_loses_pages=True`` models what Linux (ext4, xfs) does when an fsync fails: the dirty
  pages are marked clean, so the bytes written since the file's last good fsync never reach the
  disk, and a later fsync of the file reports success without writing them (PostgreSQL's
  "fsyncgate", 2018; Rebello et al., "Can Applications Recover from fsync Failures?", USENIX
  ATC 2020). At a power loss those bytes read as zeros; bytes synced after them survive.

Real files, real DB, no mocks of our components. Deterministic (seeded).
"""

from __future__ import annotations

import errno
import os
import random

import pytest

from engine import DB, StorageIOError
from engine import filenames
from engine.errors import CorruptionError
from engine.faultfs import FaultInjectionFS, InjectedCrash
from engine.filenames import FileKind, list_files
from engine.vfs import FileSystem

from .test_db_durability import _abandon, matches_a_prefix  # dropped without a clean close


class _ReviewFS(FaultInjectionFS):
    """FaultInjectionFS plus a process kill that keeps the unsynced bookkeeping, a switch that
    fails the fsync of log files only, and optionally Linux's page-cache behaviour after a
    failed fsync (see the module docstring)."""

    def __init__(self, *, seed: int = 0, fsync_loses_pages: bool = False):
        super().__init__(seed=seed)
        self.fsync_loses_pages = fsync_loses_pages
        self.fail_log_sync = False  # fsync of *.log files fails with EIO while set
        self.lost: list[tuple[str, tuple[int, int], int, int]] = []  # path, file, [start, end)

    def kill(self) -> None:
        """The process dies; the machine does not. Unsynced bytes stay unsynced."""
        self.crash("process")

    def _check_sync(self, path: str) -> None:
        try:
            if self.fail_log_sync and path.endswith(".log"):
                raise StorageIOError("fsync failed (injected, logs only)", path=path,
                                     errno_=errno.EIO)
            super()._check_sync(path)
        except StorageIOError:
            if self.fsync_loses_pages and os.path.isfile(path):
                st = os.stat(path)
                key = (st.st_dev, st.st_ino)
                start = self._synced.get(key, 0)
                if start < st.st_size:
                    self.lost.append((path, key, start, st.st_size))
            raise

    def _forget_lost(self, path: str) -> None:
        """Truncating or unlinking a file discards its pages, the lost ones too."""
        self.lost = [x for x in self.lost if x[0] != path]

    def open_writable(self, path: str):
        with self._mu:
            self._forget_lost(path)
            return super().open_writable(path)

    def remove(self, path: str) -> None:
        with self._mu:
            self._forget_lost(path)
            super().remove(path)

    def crash(self, unsynced: str = "drop") -> None:
        with self._mu:
            super().crash(unsynced)
            self.fail_log_sync = False
            if unsynced in ("keep", "process"):
                return  # the pages a failed fsync lost are still in the OS's cache
            lost, self.lost = self.lost, []
            zero_lost_pages(lost)


def zero_lost_pages(lost) -> None:
    """Power loss after a failed fsync (Linux): the bytes it lost, ``(path, (dev, ino), start,
    end)``, read back as zeros, if the file is still the same one and still that long."""
    for path, key, start, end in lost:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        if (st.st_dev, st.st_ino) != key or start >= st.st_size:
            continue
        with open(path, "r+b") as f:
            f.seek(start)
            f.write(b"\0" * (min(end, st.st_size) - start))


def _logs(path: str) -> list[int]:
    return sorted(n for k, n, _ in list_files(FileSystem(), path) if k is FileKind.LOG)


def _log_size(path: str, number: int) -> int:
    return os.path.getsize(filenames.log_file_name(path, number))


# Finding 1 (fixed): records carried over from the last log are written to a new log,
# never appended to the old one, whose pages a failed fsync may have marked clean unwritten.
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["failed_synced_write", "failed_reuse_fsync_at_open"])
def test_acknowledged_writes_survive_a_failed_fsync_then_reopen_then_power_loss(tmp_path, where):
    fs = _ReviewFS(seed=11, fsync_loses_pages=True)
    path = str(tmp_path / "db")
    db = DB.open(path, fs=fs)
    for i in range(5):
        db.put(b"a%d" % i, b"durable-%d" % i, sync=True)
    for i in range(5):
        db.put(b"b%d" % i, b"unsynced-%d" % i)  # in the OS, not yet on disk
    if where == "failed_synced_write":
        # The DB says: "refuses writes after an earlier failure ...; reopen it to recover".
        fs.fail_log_sync = True
        with pytest.raises(StorageIOError):
            db.put(b"doomed", b"x", sync=True)
        fs.fail_log_sync = False
        db.close()  # failed state: the log is not synced again
    else:
        _abandon(db, fs)
        fs.kill()
        fs.fail_log_sync = True
        with pytest.raises(StorageIOError) as failed:
            DB.open(path, fs=fs)  # the new log's fsync fails: the open is refused
        assert failed.value.path.endswith(".log")
        fs.fail_log_sync = False
    if where == "failed_synced_write":
        assert fs.lost, "the failed fsync was not modelled"
    else:  # the failed fsync hit only the new log, which the failed open removed
        assert not fs.lost
    db = DB.open(path, fs=fs)  # recovers from the page cache into a new, fsynced log
    assert db.get(b"b4") == b"unsynced-4"  # served to readers from now on
    db.put(b"after", b"acknowledged", sync=True)
    _abandon(db, fs)
    fs.crash("drop")  # power loss
    try:
        db = DB.open(path, fs=fs)
    except CorruptionError as exc:  # before the fix: in the reused log, a bad record then a
        assert exc.path.endswith(".log"), exc  # valid one; other corruption is not this finding
        raise
    with db:
        assert db.get(b"after") == b"acknowledged"
        assert [db.get(b"a%d" % i) for i in range(5)] == [b"durable-%d" % i for i in range(5)]


# ---------------------------------------------------------------------------------------------
# Passing guards: these fail if the reuse logic regresses.
# ---------------------------------------------------------------------------------------------
def test_writes_recovered_at_a_reuse_open_survive_a_later_power_loss(tmp_path):
    """A dead process's unsynced writes, once a reopen has served them, must not vanish at the
    next power loss: the reopen copies them into a new log and fsyncs it (before 809e9a7 a
    synced table did it). Fails if recovery.py's ``log.sync()`` of the new log is removed."""
    fs = _ReviewFS(seed=3)
    path = str(tmp_path / "db")
    db = DB.open(path, fs=fs)
    db.put(b"k-synced", b"s", sync=True)
    for i in range(20):
        db.put(b"k%02d" % i, b"v%d" % i)
    _abandon(db, fs)
    fs.kill()  # process crash: the 20 writes are in the OS only
    [number] = _logs(path)
    db = DB.open(path, fs=fs)
    [new] = _logs(path)
    assert new > number and db.stats()["recovered_tables"] == 0  # carried over, no table
    assert [db.get(b"k%02d" % i) for i in range(20)] == [b"v%d" % i for i in range(20)]
    _abandon(db, fs)  # no write, no clean close: only the reopen's own fsync protects them
    fs.crash("drop")
    with DB.open(path, fs=fs) as db:
        assert db.get(b"k-synced") == b"s"
        assert [db.get(b"k%02d" % i) for i in range(20)] == [b"v%d" % i for i in range(20)]


def test_failed_reuse_fsync_refuses_the_open_and_appends_nothing(tmp_path):
    fs = _ReviewFS(seed=4)
    path = str(tmp_path / "db")
    db = DB.open(path, fs=fs)
    for i in range(10):
        db.put(b"k%d" % i, b"v%d" % i)
    _abandon(db, fs)
    fs.kill()
    [number] = _logs(path)
    size = _log_size(path, number)
    fs.fail_log_sync = True
    with pytest.raises(StorageIOError) as failed:
        DB.open(path, fs=fs)
    assert failed.value.path.endswith(".log")  # the new log's fsync
    assert failed.value.path != filenames.log_file_name(path, number)
    assert _logs(path) == [number]  # the failed open removed the new log
    assert _log_size(path, number) == size  # the old log is left as it was
    fs.fail_log_sync = False
    with DB.open(path, fs=fs) as db:  # the lock was released; the retry carries the log over
        [new] = _logs(path)
        assert new > number
        assert [db.get(b"k%d" % i) for i in range(10)] == [b"v%d" % i for i in range(10)]
        db.put(b"new", b"n", sync=True)
    fs.crash("drop")
    with DB.open(path, fs=fs) as db:
        assert db.get(b"new") == b"n" and db.get(b"k9") == b"v9"


@pytest.mark.parametrize("tail", [b"\0" * 4096, b"\0" * 5, b"\x01\x02\x03\x04\x05\x06\x07\x08"])
def test_zero_or_partial_header_tail_is_never_appended_after(tmp_path, tail):
    """A machine crash can leave zero-filled pages or half a header at the end of the log: the
    reopen must start a new log (appending after them would turn them into corruption before
    the tail), and the writes after it must survive a power loss."""
    fs = _ReviewFS(seed=5)
    path = str(tmp_path / "db")
    with DB.open(path, fs=fs) as db:
        for i in range(10):
            db.put(b"k%d" % i, b"v%d" % i, sync=True)
    [old] = _logs(path)
    with open(filenames.log_file_name(path, old), "ab") as f:
        f.write(tail)
        f.flush()
        os.fsync(f.fileno())
    fs.crash("keep")  # the layer takes the file as it is now as durable
    db = DB.open(path, fs=fs)
    assert _logs(path)[-1] > old and old not in _logs(path)
    assert db.stats()["recovered_tables"] == 0  # the clean prefix is carried to the new log
    db.put(b"after", b"a", sync=True)
    _abandon(db, fs)
    fs.crash("drop")
    with DB.open(path, fs=fs) as db:
        assert db.get(b"after") == b"a"
        assert [db.get(b"k%d" % i) for i in range(10)] == [b"v%d" % i for i in range(10)]


def test_failed_append_right_after_reuse_keeps_the_reused_writes(tmp_path):
    """The first append to the reused log fails half-way (ENOSPC): the next write switches to a
    new log; the reused log's records (a dead process's unsynced writes) and the new synced
    write survive a power loss, and the half record never surfaces."""
    fs = _ReviewFS(seed=6)
    path = str(tmp_path / "db")
    db = DB.open(path, fs=fs)
    for i in range(10):
        db.put(b"k%d" % i, b"v%d" % i)
    _abandon(db, fs)
    fs.kill()
    [reused] = _logs(path)
    db = DB.open(path, fs=fs)
    fs.fail_writes_with(errno.ENOSPC, after_bytes=5)
    with pytest.raises(StorageIOError):
        db.put(b"doomed", b"x" * 100)
    fs.fail_writes_with(None)
    db.put(b"next", b"n", sync=True)
    assert _logs(path)[-1] > reused
    _abandon(db, fs)
    fs.crash("drop")
    for _ in range(2):  # the torn reused log is replayed into a table once, not again
        with DB.open(path, fs=fs) as db:
            assert db.get(b"doomed") is None and db.get(b"next") == b"n"
            assert [db.get(b"k%d" % i) for i in range(10)] == [b"v%d" % i for i in range(10)]
    assert reused not in _logs(path)


def test_tombstone_in_a_reused_log_is_flushed_once_and_sequences_only_grow(tmp_path):
    """A delete that lives only in the reused log hides the table's value through the reuse,
    its flush and a compaction; the reused log is obsolete after the flush (never replayed
    again); the last sequence never goes back across reopens."""
    fs = _ReviewFS(seed=8)
    path = str(tmp_path / "db")
    seqs = []
    db = DB.open(path, fs=fs)
    db.put(b"gone", b"old", sync=True)
    db.put(b"kept", b"1", sync=True)
    db.flush()  # both in a table
    db.delete(b"gone")
    db.put(b"kept", b"2")
    seqs.append(db.stats()["last_sequence"])
    _abandon(db, fs)
    fs.kill()
    [reused] = _logs(path)
    with DB.open(path, fs=fs) as db:
        assert db.stats()["recovered_entries"] == 2 and db.get(b"gone") is None
        seqs.append(db.stats()["last_sequence"])
        db.put(b"third", b"3")
        db.flush()  # the reused memtable goes to L0; its log is now obsolete
        assert reused not in _logs(path)
        db.compact()
        seqs.append(db.stats()["last_sequence"])
    fs.crash("drop")
    for i in range(2):
        with DB.open(path, fs=fs) as db:
            # Nothing replayed twice: the first open finds an empty log, the second only the
            # probe the first one wrote.
            assert db.stats()["recovered_entries"] == i
            assert db.get(b"gone") is None and db.get(b"kept") == b"2"
            assert db.get(b"third") == b"3"
            seqs.append(db.stats()["last_sequence"])
            db.put(b"probe", b"p", sync=True)
            seqs.append(db.stats()["last_sequence"])
    # Never back; each probe gets a number above what its open recovered.
    assert seqs == sorted(seqs) and seqs[-1] > seqs[-2] and seqs[-3] > seqs[-4], seqs


# ---------------------------------------------------------------------------------------------
# A two-process crash sweep: process 1 dies (machine up), process 2 reuses the log, writes and
# hits a power loss (or dies during its own open first). What process 2 read at open must
# survive, plus a prefix of its own writes that holds every acknowledged synced one.
# ---------------------------------------------------------------------------------------------
TINY = dict(memtable_bytes=2048, target_file_size=1024, max_bytes_for_level_base=4096,
            block_size=256, l0_compaction_trigger=2, level_size_multiplier=2.0)


def _ops(rnd, n, tag):
    out = []
    for i in range(n):
        r = rnd.random()
        if r < 0.03:
            out.append(("flush", None))
        else:
            size = rnd.randrange(1, 4) if r < 0.25 else 1
            out.append(("write", [(b"k%03d" % rnd.randrange(60),
                                   None if rnd.random() < 0.3 else b"%s%d." % (tag, i))
                                  for _ in range(size)]))
    return out


def _run(db, ops, sync_every):
    """Run ops until the injected crash; return (durable, started)."""
    durable = started = 0
    try:
        for i, op in enumerate(ops):
            started = i + 1
            if op[0] == "write":
                sync = i % sync_every == sync_every - 1
                db.write(op[1], sync=sync)
                if sync:
                    durable = i + 1
            else:
                db.flush()
                durable = i + 1
    except (InjectedCrash, StorageIOError):
        pass
    try:
        db.close()
    except (InjectedCrash, StorageIOError):
        pass
    return durable, started


def _reuse_trial(tmp_path, seed):
    rnd = random.Random(seed)
    fs = _ReviewFS(seed=seed)
    path = str(tmp_path / f"db{seed}")
    db = DB.open(path, fs=fs, **TINY)
    fs.crash_after(rnd.randrange(20, 200))
    _run(db, _ops(rnd, 150, b"p"), sync_every=5)
    fs.kill()  # process 1 dies; its unsynced writes stay in the OS, unsynced
    if rnd.random() < 0.3:  # process 2 dies during its open
        fs.crash_after(rnd.randrange(1, 12))
        try:
            DB.open(path, fs=fs, **TINY).close()
        except (InjectedCrash, StorageIOError):
            pass
        fs.kill()
    db = DB.open(path, fs=fs, **TINY)
    base = dict(db.scan())  # what readers were served right after the reuse open
    ops = _ops(rnd, 150, b"q")
    fs.crash_after(rnd.randrange(1, 150))
    durable, started = _run(db, ops, sync_every=4)
    fs.crash(rnd.choice(["drop", "torn"]))
    with DB.open(path, fs=fs, **TINY) as db:
        got = dict(db.scan())
    assert matches_a_prefix(got, base, ops, durable, started), (
        f"seed {seed}: state after the carry-over open, then a power loss, is not what that "
        f"open served plus a prefix of the later writes")


def test_power_loss_after_a_reuse_open_keeps_what_it_served_and_every_synced_write(tmp_path):
    for seed in range(16):
        _reuse_trial(tmp_path, seed)
