"""A full disk is retried, not fatal (engine/background.py, "Full disk").

A flush or compaction that fails with ENOSPC while the manifest is intact lost nothing, so the
DB retries it: writes are refused (with ENOSPC) only while a flush cannot be written, and go
on once one succeeds, without a reopen. Faults come from the fault-injecting file layer
(ReviewFS: faults chosen by file name or by the thread that writes).
"""

from __future__ import annotations

import errno
import threading

import pytest

from engine import DB
from engine.errors import StorageIOError

from .conftest import wait_until
from .test_review_recovery import ReviewFS


def _in_thread(prefix: str):
    return lambda path: threading.current_thread().name.startswith(prefix)


def _l0(db) -> int:
    return db.stats()["levels"][0]["tables"]


def _reopened_holds(path: str, expected: dict) -> None:
    """Reopened without faults, the DB holds exactly ``expected`` for those keys."""
    with DB.open(path) as db:
        got = dict(zip(expected, db.multi_get(list(expected))))
    assert got == expected


def test_a_flush_that_hits_a_full_disk_is_retried_by_itself_once_space_is_back(tmp_path):
    fs = ReviewFS(seed=21)
    path = str(tmp_path / "db")
    db = DB.open(path, fs=fs, disable_auto_compactions=True)
    try:
        for i in range(200):
            db.put(b"k%03d" % i, b"v%d" % i)
        fs.append_fault = lambda p: p.endswith(".sst")  # tables cannot be written
        with pytest.raises(StorageIOError) as exc:
            db.flush()
        assert exc.value.errno == errno.ENOSPC
        s = db.stats()
        assert s["failed_retrying"] is True and "No space left" in s["failed"]
        with pytest.raises(StorageIOError) as refused:
            db.put(b"new", b"1")  # asks for one more try, which fails too
        assert refused.value.errno == errno.ENOSPC
        assert "retries by itself" in str(refused.value)
        assert db.get(b"k007") == b"v7"  # reads go on
        fs.append_fault = None  # space is back; nobody writes: the flush thread retries
        wait_until(lambda: db.stats()["failed"] is None, "the flush thread to retry", 60)
        s = db.stats()
        assert s["recovered_errors"] == 1 and s["failed_retrying"] is False
        assert _l0(db) == 1
        db.put(b"new", b"1")
    finally:
        db.close()
    _reopened_holds(path, {**{b"k%03d" % i: b"v%d" % i for i in range(200)}, b"new": b"1"})


def test_a_compaction_that_hits_a_full_disk_leaves_writes_alone_and_is_retried(tmp_path):
    fs = ReviewFS(seed=22)
    path = str(tmp_path / "db")
    db = DB.open(path, fs=fs, l0_compaction_trigger=2)
    try:
        fs.append_fault = _in_thread("sievekv-compact")  # only compaction outputs fail
        for r in range(2):
            for i in range(200):
                db.put(b"k%03d" % i, b"r%d-%d" % (r, i))
            db.flush()
        wait_until(lambda: db.stats()["background_errors"] >= 1, "the compaction to fail")
        assert db.stats()["failed"] is None  # not a failed state: writes go on
        assert "No space left" in db.stats()["compaction_retrying"]
        db.put(b"during", b"1")
        assert _l0(db) == 2
        fs.append_fault = None
        # The retry installs its version (L0 empty) before the compaction thread clears its
        # retrying state, under the mutex again: wait for both.
        wait_until(lambda: _l0(db) == 0 and db.stats()["compaction_retrying"] is None,
                   "the compaction to be retried", 60)
        assert db.stats()["compactions"] >= 1
    finally:
        db.close()
    _reopened_holds(path, {**{b"k%03d" % i: b"r1-%d" % i for i in range(200)}, b"during": b"1"})


def _two_tables_then_a_full_disk_for_tables(db, fs) -> None:
    """Two L0 tables of k000..k099 (values r0, then r1); from now on every table write fails."""
    for r in range(2):
        for i in range(100):
            db.put(b"k%03d" % i, b"r%d" % r)
        db.flush()
    fs.append_fault = lambda p: p.endswith(".sst")


def test_a_manual_compaction_on_a_full_disk_raises_and_leaves_the_db_writable(tmp_path):
    fs = ReviewFS(seed=23)
    path = str(tmp_path / "db")
    with DB.open(path, fs=fs, disable_auto_compactions=True) as db:
        _two_tables_then_a_full_disk_for_tables(db, fs)
        with pytest.raises(StorageIOError) as exc:
            db.compact()
        assert exc.value.errno == errno.ENOSPC
        assert db.stats()["failed"] is None
        db.put(b"after", b"1")
        fs.append_fault = None
        db.compact()
        assert _l0(db) == 0 and db.get(b"k005") == b"r1" and db.get(b"after") == b"1"


def test_a_full_disk_under_the_manifest_is_fatal_until_reopen(tmp_path):
    """A manifest write that failed leaves the manifest refusing every edit: no retry can
    succeed, so the DB stays failed (and says to reopen); the reopen recovers everything."""
    fs = ReviewFS(seed=24)
    path = str(tmp_path / "db")
    db = DB.open(path, fs=fs, disable_auto_compactions=True)
    try:
        for i in range(100):
            db.put(b"k%03d" % i, b"v", sync=(i == 99))
        fs.append_fault = lambda p: "MANIFEST" in p
        with pytest.raises(StorageIOError):
            db.flush()
        fs.append_fault = None
        s = db.stats()
        assert s["failed"] is not None and s["failed_retrying"] is False
        with pytest.raises(StorageIOError, match="reopen"):
            db.put(b"x", b"y")
    finally:
        db.close()
    with DB.open(path) as db:
        assert all(db.get(b"k%03d" % i) == b"v" for i in range(100))



def test_failed_attempts_leave_no_reserved_numbers_behind(tmp_path):
    """Each failed try reserved output numbers; over an outage of hours they piled up in the
    DB's pending set (and close() tried to remove each missing file)."""
    fs = ReviewFS(seed=25)
    path = str(tmp_path / "db")
    with DB.open(path, fs=fs, disable_auto_compactions=True) as db:
        _two_tables_then_a_full_disk_for_tables(db, fs)
        for _ in range(3):
            with pytest.raises(StorageIOError):
                db.compact()
        for i in range(100):
            db.put(b"n%03d" % i, b"v")
        with pytest.raises(StorageIOError):
            db.flush()
        fs.append_fault = None
        wait_until(lambda: db.stats()["failed"] is None, "the flush to be retried")
        assert db._pending_outputs == set()


def test_the_full_disk_states_are_metrics_an_operator_can_alert_on(tmp_path):
    from prometheus_client import CollectorRegistry

    from shard.engine_metrics import EngineCollector

    fs = ReviewFS(seed=26)
    with DB.open(str(tmp_path / "db"), fs=fs, disable_auto_compactions=True) as db:
        registry = CollectorRegistry()
        registry.register(EngineCollector(db))

        def gauges():
            return [registry.get_sample_value(n) for n in (
                "sievekv_engine_writes_refused", "sievekv_engine_writes_refused_retrying",
                "sievekv_engine_compaction_retrying", "sievekv_engine_recovered_errors_total")]

        assert gauges() == [0.0, 0.0, 0.0, 0.0]
        for i in range(50):
            db.put(b"k%03d" % i, b"v")
        fs.append_fault = lambda p: p.endswith(".sst")
        with pytest.raises(StorageIOError):
            db.flush()
        assert gauges() == [1.0, 1.0, 0.0, 0.0]
        fs.append_fault = None
        wait_until(lambda: db.stats()["failed"] is None, "the flush to be retried")
        assert gauges() == [0.0, 0.0, 0.0, 1.0]
