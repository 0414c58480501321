"""Regression tests for durability bugs found by crash/fault stress (engine/faultfs.py).

Each test names the bug it pins down; all are deterministic (seeded fault file system)."""

import errno

import pytest

from engine import DB, StorageIOError
from engine.faultfs import FaultInjectionFS, InjectedCrash


def _abandon(db, fs):
    """The process dies now: the DB object is dropped without a clean close."""
    fs.crash_after(1)
    try:
        db.close()
    except (InjectedCrash, StorageIOError):
        pass


def _fail_one_append(db, fs):
    """ENOSPC cuts the next log append short (a torn record); space comes back after."""
    fs.fail_writes_with(errno.ENOSPC, after_bytes=5)
    with pytest.raises(StorageIOError):
        db.put(b"doomed", b"v" * 100)
    fs.fail_writes_with(None)


def test_synced_write_after_a_failed_append_keeps_earlier_writes_on_power_loss(tmp_path):
    # Bug: after a failed append the DB switched to a new log without syncing the old one,
    # so a later synced write could survive a power loss that dropped the acknowledged
    # unsynced writes before it (a hole: recovery was no longer a prefix of the writes).
    fs = FaultInjectionFS(seed=1)
    path = str(tmp_path / "db")
    db = DB.open(path, fs=fs)
    for i in range(5):
        db.put(b"k%d" % i, b"v%d" % i)
    _fail_one_append(db, fs)
    db.put(b"k5", b"v5", sync=True)  # goes to a new log, which is synced
    _abandon(db, fs)
    fs.crash("drop")
    with DB.open(path, fs=fs) as db:
        assert db.get(b"k5") == b"v5"
        assert [db.get(b"k%d" % i) for i in range(5)] == [b"v%d" % i for i in range(5)]
        assert db.get(b"doomed") is None


def test_close_after_a_failed_append_syncs_the_acknowledged_writes(tmp_path):
    # Bug: close() skipped the log sync when the last append had failed, so writes
    # acknowledged before the failure were lost by a power loss after a clean close.
    fs = FaultInjectionFS(seed=2)
    path = str(tmp_path / "db")
    db = DB.open(path, fs=fs)
    for i in range(5):
        db.put(b"k%d" % i, b"v%d" % i)
    _fail_one_append(db, fs)
    db.close()
    fs.crash("drop")
    with DB.open(path, fs=fs) as db:
        assert [db.get(b"k%d" % i) for i in range(5)] == [b"v%d" % i for i in range(5)]
        assert db.get(b"doomed") is None
