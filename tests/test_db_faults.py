"""The DB under engine.faultfs.FaultInjectionFS: power loss (unsynced data dropped or torn),
ENOSPC, failing fsync, and a crash at every kind of operation. After each, the DB is reopened
and must hold every acknowledged synced write, and the writes it holds must be a prefix of
the writes made (no hole, no half batch)."""

import errno
import random

import pytest

from engine import DB, StorageIOError
from engine.faultfs import FaultInjectionFS, InjectedCrash

SMALL = dict(memtable_bytes=4096, target_file_size=4096, max_bytes_for_level_base=16384,
             block_size=512, l0_compaction_trigger=2)


def key(i):
    return b"k%06d" % i


def value(i):
    return b"value-%d-" % i + b"x" * (i % 50)


def _kill(db, fs):
    """The process dies: every operation from now on fails; the DB object is abandoned."""
    fs.crash_after(1)
    try:
        db.put(b"zz-last-words", b"x", sync=True)
    except (InjectedCrash, StorageIOError):
        pass
    try:
        db.close()
    except (InjectedCrash, StorageIOError):
        pass


def _check_prefix(db, n_written, acked_synced):
    """Keys 0..acked_synced-1 are present; the present keys are exactly 0..L-1 for some L."""
    present = [db.get(key(i)) is not None for i in range(n_written + 1)]
    for i in range(acked_synced):
        assert present[i], f"acknowledged synced write {i} lost"
    L = present.index(False) if False in present else len(present)
    assert not any(present[L:]), f"hole: key {L} missing but a later key present"
    for i in range(L):
        assert db.get(key(i)) == value(i)
    return L


@pytest.mark.parametrize("mode", ["drop", "torn"])
def test_power_loss_keeps_every_synced_write(tmp_path, mode):
    fs = FaultInjectionFS(seed=7)
    path = str(tmp_path / "db")
    db = DB.open(path, fs=fs, **SMALL)
    acked_synced = 0
    n = 600
    for i in range(n):
        sync = i % 7 == 0
        db.put(key(i), value(i), sync=sync)
        if sync:
            acked_synced = i + 1
    _kill(db, fs)
    fs.crash(mode)
    with DB.open(path, fs=fs, **SMALL) as db:
        L = _check_prefix(db, n, acked_synced)
        assert L >= acked_synced
        assert db.stats()["recovered_entries"] > 0 or db.stats()["levels"][0]["tables"] >= 0


def test_enospc_on_log_write_is_not_acknowledged_and_db_stays_usable(tmp_path):
    fs = FaultInjectionFS(seed=1)
    path = str(tmp_path / "db")
    db = DB.open(path, fs=fs)
    for i in range(50):
        db.put(key(i), value(i), sync=True)
    fs.fail_writes_with(errno.ENOSPC, after_bytes=10)  # the next append is cut short
    with pytest.raises(StorageIOError) as exc:
        db.put(b"doomed", b"v" * 1000, sync=True)
    assert exc.value.errno == errno.ENOSPC
    assert db.get(b"doomed") is None
    with pytest.raises(StorageIOError):  # still no space: the new log cannot take it either
        db.put(b"doomed2", b"v" * 100)
    fs.fail_writes_with(None)
    for i in range(50, 100):  # space is back: the DB writes to a fresh log
        db.put(key(i), value(i), sync=True)
    assert db.get(key(99)) == value(99)
    assert db.stats()["failed"] is None
    _kill(db, fs)
    fs.crash("drop")
    with DB.open(path, fs=fs) as db:
        assert _check_prefix(db, 100, 100) == 100
        assert db.get(b"doomed") is None and db.get(b"doomed2") is None


def test_enospc_in_a_flush_fails_writes_cleanly_and_reopen_recovers(tmp_path):
    fs = FaultInjectionFS(seed=2)
    path = str(tmp_path / "db")
    db = DB.open(path, fs=fs)
    for i in range(200):
        db.put(key(i), value(i), sync=(i == 199))
    fs.fail_writes_with(errno.ENOSPC)
    with pytest.raises(StorageIOError):
        db.flush()  # the table cannot be written
    with pytest.raises(StorageIOError, match="refuses writes"):
        db.put(b"after", b"1")
    assert db.get(key(5)) == value(5)  # reads keep working
    assert db.stats()["failed"] is not None
    fs.fail_writes_with(None)
    db.close()
    with DB.open(path, fs=fs) as db:
        assert _check_prefix(db, 200, 200) == 200
        db.put(b"after", b"1", sync=True)
        assert db.get(b"after") == b"1"


def test_failed_fsync_is_not_acknowledged_and_stops_writes(tmp_path):
    fs = FaultInjectionFS(seed=3)
    path = str(tmp_path / "db")
    db = DB.open(path, fs=fs)
    for i in range(30):
        db.put(key(i), value(i), sync=True)
    fs.fail_sync(True)
    with pytest.raises(StorageIOError):
        db.put(key(30), value(30), sync=True)
    assert db.get(key(30)) is None  # not acknowledged, not visible
    fs.fail_sync(False)
    with pytest.raises(StorageIOError, match="refuses writes"):
        db.put(key(31), value(31), sync=True)
    assert db.get(key(29)) == value(29)
    _kill(db, fs)
    fs.crash("drop")
    with DB.open(path, fs=fs) as db:
        L = _check_prefix(db, 40, 30)
        assert L in (30, 31)  # the failed write may or may not have reached the disk


def test_crash_at_random_operations_during_flushes_and_compactions(tmp_path):
    rnd = random.Random(99)
    for trial in range(16):
        fs = FaultInjectionFS(seed=trial)
        path = str(tmp_path / f"db{trial}")
        db = DB.open(path, fs=fs, **SMALL)
        fs.crash_after(rnd.randrange(1, 400))
        acked = 0
        i = 0
        all_synced = trial % 2 == 0  # odd trials: only every 5th write is synced
        try:
            for i in range(1500):
                sync = all_synced or i % 5 == 4
                if i % 10 == 9:
                    db.write([(key(i), value(i))], sync=sync)
                else:
                    db.put(key(i), value(i), sync=sync)
                if sync:
                    acked = i + 1
        except (InjectedCrash, StorageIOError):
            pass
        try:
            db.close()
        except (InjectedCrash, StorageIOError):
            pass
        fs.crash(rnd.choice(["drop", "torn"]))
        with DB.open(path, fs=fs, **SMALL) as db:
            L = _check_prefix(db, i + 1, acked)
            if all_synced:
                assert L in (acked, acked + 1)
            db.put(b"alive", b"yes", sync=True)  # and the recovered DB works
            assert db.get(b"alive") == b"yes"
