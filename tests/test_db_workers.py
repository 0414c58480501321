"""Table-writing worker processes: jobs, errors, a dying worker, cancellation at close."""

import errno
import os
import signal
import threading

import pytest

from engine import DB, StorageIOError
from engine.filenames import FileKind, list_files
from engine.table_workers import NoWorker, WorkerLost, WorkerPool
from engine.vfs import default_fs
from .conftest import poll_until, sigstop


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
        assert 1 <= sw["table_workers"]["running"] <= sw["table_workers"]["processes"]
        assert st["table_workers"]["jobs_in_process"] == 0 and st["compactions"] > 0
        assert st["table_workers"]["running"] == st["table_workers"]["idle_exits"] == 0
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


def test_worker_that_runs_out_of_numbers_leaves_no_table_behind(tmp_path, monkeypatch, caplog):
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
        with caplog.at_level("WARNING", logger="engine.background"):
            db.compact()  # several output tables: the worker runs out after one
        stats = db.stats()
        tw = stats["table_workers"]
        assert tw["fallbacks_to_threads"] == tw["fallbacks_numbers_exhausted"] == 1, tw
        (rec,) = [r for r in caplog.records if r.name == "engine.background"]
        assert "compaction job" in rec.getMessage() and "(numbers_exhausted)" in rec.getMessage()
        live = {f.number for files in db._version.levels for f in files}
        on_disk = {n for kind, n, _ in list_files(default_fs(), str(tmp_path / "db"))
                   if kind is FileKind.TABLE}
        assert on_disk == live
        assert db.get(b"000042") == b"round2-42"


# ---------------------------------------------------------------------------------------------
# The pool's robustness: dead workers are never handed out, a failed start is retried, and
# every fallback to the DB's thread says why (stats and one log line).
# ---------------------------------------------------------------------------------------------
def job_wait_for(path):
    import time

    while not os.path.exists(path):
        time.sleep(0.005)
    return os.getpid()


def _wait_dead(pid: int) -> None:
    """Block until ``pid`` (a child of this process) has exited, without reaping it: the pool
    must find out by itself."""
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)


def _puts(db, n, tag=b"v"):
    for i in range(n):
        db.put(b"%06d" % i, (tag + b"%d" % i) * 8)


def test_an_idle_worker_killed_from_outside_is_replaced_without_a_fallback(tmp_path):
    """A worker that died while idle (SIGKILL from outside, the OOM killer, or a close()
    that killed it just after its job ended) used to be handed to the next job, which then
    fell back to the DB's thread (the cause of a flaky fallbacks_to_threads == 0 in
    tests/test_review_compression.py). The pool now checks before it sends a job."""
    with DB.open(tmp_path / "db", table_workers=1, disable_auto_compactions=True) as db:
        _puts(db, 500)
        db.flush()
        assert db.stats()["table_workers"]["jobs_in_process"] == 1
        pool = db._pool
        with pool._cv:
            idle = [w.proc.pid for w in pool._idle]
        assert idle  # the worker of that flush waits for the next job
        for pid in idle:
            os.kill(pid, signal.SIGKILL)
        for pid in idle:
            _wait_dead(pid)
        restarts = pool.restarts
        _puts(db, 500, b"w")
        db.flush()
        tw = db.stats()["table_workers"]
        assert tw["jobs_in_process"] == 2 and tw["fallbacks_to_threads"] == 0, tw
        assert pool.restarts >= restarts + 1  # the dead one was dropped, a new one started
        assert db.get(b"000007") == b"w7" * 8


def test_a_worker_cancelled_after_it_answered_is_not_handed_out_again(tmp_path):
    """The race behind the flaky test: DB.close() kills the workers busy with its jobs, but a
    worker whose answer is already in the pipe finishes its call as a success; it used to go
    back to the idle list dead. cancel() now marks what it kills, under the pool's lock."""
    pool = WorkerPool(1)
    try:
        go = str(tmp_path / "go")
        result = []
        t = threading.Thread(target=lambda: result.append(pool.call("A", job_wait_for, go)))
        with pool._cv:  # the call cannot give its worker back while this thread holds the lock
            t.start()
            while not pool._busy:
                pool._cv.wait(0.01)
            (w,) = pool._busy
            open(go, "w").close()  # the job ends and answers
            # Wait until the caller has read the answer and waits for the lock in _release.
            while not any(f.f_code.co_name == "_release" for f in _frames(t)):
                threading.Event().wait(0.005)
            assert pool.cancel("A") == 1  # DB close: kills the worker that already answered
        t.join()
        assert result == [w.proc.pid]  # the job's answer stands
        assert w not in pool._idle and w.proc.returncode == -signal.SIGKILL  # and reaped
        (total, pid) = pool.call("B", job_add, 1, 2)  # another owner's job: a fresh worker
        assert total == 3 and pid != w.proc.pid
    finally:
        pool.close()


def _frames(thread):
    import sys

    f = sys._current_frames().get(thread.ident)
    while f is not None:
        yield f
        f = f.f_back


def test_a_failed_worker_start_is_tried_again_later(monkeypatch):
    """A start that fails (fork or exec) used to shrink the pool for good: one failure at
    size 1 sent every later job of the process to the DB threads. Now the jobs waiting for it
    get NoWorker, and the pool tries again once spawn_retry_s has passed."""
    import sys

    pool = WorkerPool(1, spawn_retry_s=3600)
    try:
        monkeypatch.setattr(sys, "executable", "/nonexistent/python3")
        with pytest.raises(NoWorker, match="could be started"):
            pool.call("owner", job_add, 1, 1)
        assert pool.spawn_failures == 1 and pool.size == 1
        monkeypatch.undo()
        with pytest.raises(NoWorker):  # within spawn_retry_s: no new try
            pool.call("owner", job_add, 1, 1)
        assert pool.spawn_failures == 1
        pool.spawn_retry_s = 0.0  # the time has passed
        (total, pid) = pool.call("owner", job_add, 2, 2)
        assert total == 4 and pid != os.getpid()
    finally:
        pool.close()


def _flush_with(db, pool):
    """Flush ``db`` with its jobs sent to ``pool`` (a private pool: a fault injected into the
    process-wide one would reach later tests)."""
    db._pool = pool
    _puts(db, 500)
    db.flush()


def test_a_fallback_because_no_worker_starts_is_counted_and_logged(tmp_path, monkeypatch, caplog):
    import sys

    pool = WorkerPool(1)
    try:
        with DB.open(tmp_path / "db", table_workers=1, disable_auto_compactions=True) as db:
            monkeypatch.setattr(sys, "executable", "/nonexistent/python3")
            with caplog.at_level("WARNING", logger="engine.background"):
                _flush_with(db, pool)
            monkeypatch.undo()
            tw = db.stats()["table_workers"]
            assert tw["fallbacks_to_threads"] == tw["fallbacks_no_worker"] == 1, tw
            assert tw["fallbacks_worker_lost"] == tw["fallbacks_numbers_exhausted"] == 0, tw
            assert db.get(b"000007") == b"v7" * 8
        (rec,) = [r for r in caplog.records if r.name == "engine.background"]
        assert "flush job" in rec.getMessage() and "(no_worker)" in rec.getMessage()
    finally:
        pool.close()


def test_a_fallback_because_the_worker_died_is_counted_and_logged(tmp_path, caplog):
    pool = WorkerPool(1)
    try:
        with DB.open(tmp_path / "db", table_workers=1, disable_auto_compactions=True) as db:
            db._pool = pool
            pool.call("warm-up", job_add, 0, 0)
            (w,) = pool._idle
            sigstop(w.proc.pid)  # alive, but it will not answer
            with caplog.at_level("WARNING", logger="engine.background"):
                t = threading.Thread(target=_flush_with, args=(db, pool))
                t.start()
                while not pool._busy:  # the flush job went to the stopped worker
                    threading.Event().wait(0.01)
                os.kill(w.proc.pid, signal.SIGKILL)
                t.join()
            tw = db.stats()["table_workers"]
            assert tw["fallbacks_to_threads"] == tw["fallbacks_worker_lost"] == 1, tw
            assert db.get(b"000007") == b"v7" * 8
        (rec,) = [r for r in caplog.records if r.name == "engine.background"]
        assert "flush job" in rec.getMessage() and "(worker_lost)" in rec.getMessage()
        assert "exit status -9" in rec.getMessage()
    finally:
        pool.close()


def test_a_worker_that_would_run_other_engine_code_is_refused(monkeypatch):
    """A new worker imports the engine from disk; if that is not the code its owner runs (an
    upgrade in place), the start fails with the reason and the pool starts no more workers:
    every job gets NoWorker at once (its DB runs it in its own thread)."""
    import engine.table_workers as tw

    pool = WorkerPool(1, spawn_retry_s=0.0)
    try:
        monkeypatch.setattr(tw, "CODE_FINGERPRINT", "0" * 32)  # "this process runs other code"
        with pytest.raises(NoWorker, match="engine code on disk changed"):
            pool.call("owner", job_add, 1, 1)
        assert pool.spawn_failures == 1 and "restart" in pool.disabled
        monkeypatch.undo()
        for _ in range(2):  # no new start, even with no retry delay: until a restart
            with pytest.raises(NoWorker, match="until the process restarts"):
                pool.call("owner", job_add, 1, 1)
        assert pool.spawn_failures == 1
    finally:
        pool.close()


_UPGRADE_CHILD = r"""
import json, logging, os, sys, time
logging.basicConfig(level=logging.WARNING, format="%(name)s %(message)s")
from engine import DB
db = DB.open(sys.argv[1], table_workers=1, disable_auto_compactions=True)
db.put(b"a", b"1")
# The package on disk changes under the running process (a reinstall): a newer mtime.
target = os.path.join(os.path.dirname(sys.modules["engine"].__file__), "memtable.py")
later = time.time() + 10
os.utime(target, (later, later))
db.put(b"b", b"2")
db.flush()
tw = db.stats()["table_workers"]
print(json.dumps({"tw": tw, "a": db.get(b"a").decode(), "b": db.get(b"b").decode()}))
db.close()
"""


def test_an_engine_upgraded_in_place_is_not_mixed_with_the_running_code(tmp_path):
    """A real process runs the engine from a copy of the package; the copy changes on disk
    before the first flush starts a table worker. The flush runs in the DB's own thread with
    the code the process loaded (one fallback, logged with the reason), and nothing is lost."""
    import json
    import shutil
    import subprocess
    import sys

    import engine

    pkg = tmp_path / "pkg"
    shutil.copytree(os.path.dirname(engine.__file__), pkg / "engine",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, PYTHONPATH=str(pkg))
    r = subprocess.run([sys.executable, "-c", _UPGRADE_CHILD, str(tmp_path / "db")],
                       capture_output=True, text=True, env=env, timeout=300, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["a"] == "1" and out["b"] == "2"
    assert out["tw"]["fallbacks_no_worker"] == 1 and out["tw"]["jobs_in_process"] == 0, out
    assert "engine code on disk changed" in out["tw"]["disabled"], out
    assert "engine code on disk changed" in r.stderr, r.stderr


def test_compactions_with_a_target_below_a_tables_fixed_cost_stay_in_their_workers(tmp_path):
    """A target_file_size under a table's fixed cost (a filter page and the metadata tail)
    cuts an output at every size check, one or two entries per table: the file numbers a
    compaction reserved (max_outputs) ran out on every compaction, which then ran again in the
    DB's thread. The reservation now counts the inputs' entries in that case."""
    opts = dict(memtable_bytes=4096, target_file_size=2048, block_size=256,
                l0_compaction_trigger=2, table_workers=1)
    model = {}
    with DB.open(tmp_path / "db", **opts) as db:
        for i in range(1500):
            k = b"k%05d" % (i * 7919 % 1500)
            model[k] = b"v%d" % i
            db.put(k, model[k])
        db.flush()
        db.compact()
        st = db.stats()
        assert st["compactions"] >= 1
        tw = st["table_workers"]
        assert tw["fallbacks_numbers_exhausted"] == 0 and tw["fallbacks_to_threads"] == 0, tw
        assert dict(db.scan()) == model


# ---------------------------------------------------------------------------------------------
# Idle workers exit (IDLE_EXIT_S) and jobs start them again.
# ---------------------------------------------------------------------------------------------
def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True  # exited and reaped by the pool
    return False


def test_an_idle_worker_exits_and_the_next_job_starts_another():
    pool = WorkerPool(1, idle_exit_s=0.3)
    try:
        (total, pid) = pool.call("owner", job_add, 2, 3)
        assert total == 5
        assert poll_until(lambda: pool.idle_exits == 1 and pool.running == 0, 60)
        assert poll_until(lambda: _gone(pid), 60)
        (total, pid2) = pool.call("owner", job_add, 1, 1)  # a new worker
        assert total == 2 and pid2 != pid and pool.running == 1
        assert pool.restarts == 0 and pool.spawn_failures == 0
    finally:
        pool.close()


def test_a_worker_busy_for_longer_than_the_idle_limit_finishes_its_job(tmp_path):
    pool = WorkerPool(1, idle_exit_s=0.1)
    flag = str(tmp_path / "go")
    out = []
    t = threading.Thread(target=lambda: out.append(pool.call("owner", job_wait_for, flag)))
    try:
        t.start()
        assert poll_until(lambda: pool.running == 1 and pool._busy, 60)
        busy_pid = pool._busy[0].proc.pid
        # The job outlasts idle_exit_s many times over: a busy worker is never told to exit.
        assert not poll_until(lambda: pool.idle_exits > 0, 1.0)
        open(flag, "w").close()
        t.join(60)
        assert out == [busy_pid]
    finally:
        open(flag, "w").close()
        t.join(60)
        pool.close()
