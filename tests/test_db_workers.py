"""Table-writing worker processes: jobs, errors, a dying worker, cancellation at close."""

import errno
import os
import threading

import pytest

from engine import DB, StorageIOError
from engine.filenames import FileKind, list_files
from engine.table_workers import WorkerLost, WorkerPool
from engine.vfs import default_fs


def job_add(a, b):
    return a + b, os.getpid()


def job_enospc(path):
    raise StorageIOError("write failed (No space left on device)", path=path, errno_=errno.ENOSPC)


def job_die():
    os._exit(3)


def _wait_for_compactions(db, limit_s=120):
    """Wait until the background compactor has nothing left to do (bounded)."""
    import time

    from engine.compaction import pick

    deadline = time.monotonic() + limit_s
    while pick(db._version, db.options) is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    with db._compaction_lock:  # and the last one is installed
        pass


def test_pool_runs_jobs_in_other_processes_and_carries_errors():
    pool = WorkerPool(1)
    (total, pid) = pool.call("owner", job_add, 2, 3)
    assert total == 5 and pid != os.getpid()
    with pytest.raises(StorageIOError) as exc:
        pool.call("owner", job_enospc, "/x")
    assert exc.value.errno == errno.ENOSPC and "No space" in str(exc.value)
    with pytest.raises(WorkerLost):
        pool.call("owner", job_die)
    (total, pid2) = pool.call("owner", job_add, 1, 1)  # a fresh worker replaced the dead one
    assert total == 2 and pid2 != pid and pool.restarts == 1


def test_flushes_and_compactions_run_in_workers_with_the_same_result(tmp_path):
    opts = dict(memtable_bytes=32 * 1024, target_file_size=16 * 1024,
                max_bytes_for_level_base=64 * 1024, block_size=1024)
    model = {}
    with DB.open(tmp_path / "w", **opts) as dbw, DB.open(tmp_path / "t", table_workers=0, **opts) as dbt:
        for i in range(6000):
            k = b"%06d" % ((i * 7919) % 4000)
            v = b"v%d" % i
            if i % 9 == 0:
                dbw.delete(k)
                dbt.delete(k)
                model.pop(k, None)
            else:
                dbw.put(k, v)
                dbt.put(k, v)
                model[k] = v
        for db in (dbw, dbt):
            db.flush()
            _wait_for_compactions(db)
        sw, st = dbw.stats(), dbt.stats()
        assert sw["table_workers"]["jobs_in_process"] > 0 and sw["compactions"] > 0
        assert st["table_workers"]["jobs_in_process"] == 0 and st["compactions"] > 0
        assert list(dbw.scan()) == list(dbt.scan()) == sorted(model.items())
        dbw.compact()
        assert list(dbw.scan()) == sorted(model.items())
        assert [lv["entries"] for lv in dbw.stats()["levels"] if lv["tables"]] == [len(model)]


def test_close_cancels_a_long_compaction_in_a_worker(tmp_path):
    path = tmp_path / "db"
    with DB.open(path, disable_auto_compactions=True, memtable_bytes=256 * 1024) as db:
        for i in range(60000):
            db.put(b"%08d" % ((i * 7919) % 60000), b"x" * 40)
        db.flush()
    db = DB.open(path, disable_auto_compactions=True)
    errors = []

    def compact():
        try:
            db.compact()
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    t = threading.Thread(target=compact)
    t.start()
    while not db._pool or not db._pool._busy:  # wait until the job is in a worker
        if not t.is_alive():
            break
        threading.Event().wait(0.01)
    db.close()
    t.join()
    if errors:  # the compaction was cut short (it may also have finished first)
        assert type(errors[0]).__name__ in ("ClosedError", "Cancelled")
    with DB.open(path, disable_auto_compactions=True) as db:  # nothing writes tables now
        assert db.get(b"%08d" % 12345) == b"x" * 40
        assert sum(1 for _ in db.scan()) == 60000
        live = db._version.live_numbers()
        tables = [n for k, n, _ in list_files(default_fs(), str(path)) if k is FileKind.TABLE]
        assert set(tables) == live  # no half-written output left behind


def test_worker_that_runs_out_of_numbers_leaves_no_table_behind(tmp_path, monkeypatch):
    """A compaction job in a worker gets its output numbers reserved up front; one that needs
    more runs again in the DB's thread. The tables it wrote before running out must go (they
    are in no version): write_tables removes what it created when it fails."""
    from engine import background

    monkeypatch.setattr(background, "max_outputs", lambda job: 1)  # far too few numbers
    opts = dict(memtable_bytes=32 * 1024, target_file_size=8 * 1024, block_size=1024,
                disable_auto_compactions=True)
    with DB.open(tmp_path / "db", **opts) as db:
        for r in range(3):
            for i in range(1500):
                db.put(b"%06d" % i, b"round%d-%d" % (r, i))
            db.flush()
        db.compact()  # several output tables: the worker runs out after one
        stats = db.stats()
        assert stats["table_workers"]["fallbacks_to_threads"] >= 1, stats["table_workers"]
        live = {f.number for files in db._version.levels for f in files}
        on_disk = {n for kind, n, _ in list_files(default_fs(), str(tmp_path / "db"))
                   if kind is FileKind.TABLE}
        assert on_disk == live
        assert db.get(b"000042") == b"round2-42"
