"""Session 20d review: the engine's lifecycle and concurrency, adversarially.

The contract (engine/db.py, README "Using it from Python"): DB is thread safe; close() is
safe while other threads read, write, scan, take snapshots, or while flushes and compactions
run (in threads or in table worker processes); calls after close raise ClosedError, calls in
flight complete or raise ClosedError, nothing hangs, nothing acknowledged is lost, and the
directory is left consistent. Write stalls honour write deadlines. A full disk makes writes
fail with a retryable error and the DB recovers by itself once space returns; a failed fsync
makes it refuse writes until reopen. Races are made deterministic with holds: a
FaultInjectionFS subclass that parks one chosen file operation on an Event
(:class:`HoldFS`), or a ``sys.settrace`` hold at the first call of a named function
(:func:`run_held`). No engine part is mocked.

Findings (strict xfails at first; session 20 fixed the first, third and fourth, session 21
the second: all are plain tests now):

- close() is idempotent by returning at once when another thread's close() is still in
  progress (engine/db.py ``close``: ``if self._closing: return``): the caller is told the
  DB is closed while its log is not yet synced and the directory lock still held, so an
  open of the directory right after it raises LockedError.
- A write's ``timeout`` is not honoured while a memtable switch holds the DB mutex:
  ``_switch_memtable`` creates the new log, fsyncs the directory and fsyncs the old log
  (``_finish_log``) with ``_mu`` held, and the fast path and ``GroupCommit.write`` acquire
  ``_mu`` with no bound; a put(timeout=0.2) waits for the whole fsync. Fixed: the switch
  releases the mutex for its I/O (the leader's queue holds the other writers back).
- A full disk at the write-ahead log with an empty memtable becomes fatal: the failed
  append breaks the log, the next write switches memtables and freezes the empty one, its
  "flush" writes no table and only a manifest edit, which hits the full disk, and a failed
  manifest write is fatal. Space comes back and the DB still refuses every write until it is
  reopened. Fixed: an empty memtable is not frozen; its broken log is replaced alone.
- close() does not release the directory lock when closing the log fails (close(2)
  reporting EIO, as NFS does; engine/vfs.py turns it into StorageIOError): ``log.close()``,
  ``manifest.close()``, ``tables.close()`` and ``lock.release()`` run one after another in
  one ``finally``; the first that raises skips the rest, and a second close() returns at
  once, so the directory stays locked for the life of the process. Fixed: every release runs
  (engine/errors.py ``release_all``), in TableSet.close too.

Checked and holding (plain tests): a process that exits without close() while flushes and
compactions run in table workers loses no acknowledged write and leaves no stray table after
the next open; six threads of synced puts through group commit with a 1 KiB memtable (a
switch every few groups), then a power loss: every acknowledged put is there; a table
worker killed with SIGKILL in the middle of a flush is replaced by the DB's own thread; a
close() while the flush's worker is stopped (SIGSTOP) returns at once and the reopened DB
has everything; stats(), filter_report(), verify(), multi_get() and scan() overlapping
close() return a whole answer or raise ClosedError.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from engine import DB
from engine.errors import (ClosedError, LockedError, SieveError, StorageIOError,
                           WriteStalledError)
from engine.faultfs import FaultInjectionFS, InjectedCrash

from .conftest import wait_until

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
class Hold:
    """One parked file operation: ``entered`` is set when it arrives, it waits for
    ``release`` (at most 30 s, so a failing test never hangs)."""

    def __init__(self, op: str, pred):
        self.op, self.pred = op, pred
        self.entered, self.release = threading.Event(), threading.Event()
        self.used = False


class HoldFS(FaultInjectionFS):
    """FaultInjectionFS that parks the first matching operation of each :class:`Hold`
    (``sync`` or ``append`` of a writable file, ``create``), and can make the close of a
    writable file fail with EIO after closing it (``fail_close``: a path predicate, once)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.holds: list[Hold] = []
        self.fail_close = None

    def hold(self, op: str, pred) -> Hold:
        h = Hold(op, pred)
        self.holds.append(h)
        return h

    def release_all(self) -> None:
        for h in self.holds:
            h.release.set()

    def _park(self, op: str, path: str) -> None:
        for h in list(self.holds):
            if h.op == op and not h.used and h.pred(path):
                h.used = True
                h.entered.set()
                h.release.wait(30)

    def open_writable(self, path: str):
        self._park("create", path)
        f = super().open_writable(path)
        fs, sync, append, close = self, f.sync, f.append, f.close

        def held_sync():
            fs._park("sync", path)
            return sync()

        def held_append(data):
            fs._park("append", path)
            return append(data)

        def failing_close():
            close()
            pred = fs.fail_close
            if pred is not None and pred(path):
                fs.fail_close = None
                raise StorageIOError("close failed (Input/output error, injected)", path=path,
                                     errno_=errno.EIO)

        f.sync, f.append, f.close = held_sync, held_append, failing_close
        return f


def run_held(fn, at: str, *args):
    """Run ``fn(*args)`` in a thread that parks at the first call of a function named ``at``
    (a ``sys.settrace`` hold). Returns (thread, entered, release, outcome list)."""
    entered, release, out = threading.Event(), threading.Event(), []

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code.co_name == at and not entered.is_set():
            entered.set()
            release.wait(30)
        return None

    def body():
        sys.settrace(tracer)
        try:
            out.append(("ok", fn(*args)))
        except BaseException as exc:  # noqa: BLE001 - the test judges it
            out.append(("err", exc))
        finally:
            sys.settrace(None)

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, entered, release, out


def _close_quietly(db) -> None:
    try:
        db.close()
    except (InjectedCrash, SieveError):
        pass


def _stray_tables(path: str, db) -> list[str]:
    live = db._version.live_numbers()
    return [n for n in os.listdir(path) if n.endswith(".sst") and int(n[:-4]) not in live]


# ---------------------------------------------------------------------------------------------
# Finding: a concurrent second close() returns before the DB is closed
# ---------------------------------------------------------------------------------------------
def test_a_close_racing_another_close_returns_only_once_the_db_is_closed(tmp_path):
    path = str(tmp_path / "db")
    fs = HoldFS()
    db = DB.open(path, fs=fs)
    db.put(b"a", b"1")
    h = fs.hold("sync", lambda p: p.endswith(".log"))  # the first close's final log sync
    first = threading.Thread(target=db.close)
    first.start()
    second_out = []

    def second():
        db.close()
        try:  # close() returned: the directory must be free
            DB.open(path, fs=fs).close()
            second_out.append("reopened")
        except LockedError as exc:
            second_out.append(exc)

    try:
        assert h.entered.wait(10)
        t = threading.Thread(target=second)
        t.start()
        t.join(2.0)  # fixed: still waiting for the first close, released below
    finally:
        fs.release_all()
        first.join(10)
        t.join(10)
    assert not first.is_alive() and not t.is_alive()
    assert second_out == ["reopened"], second_out


# ---------------------------------------------------------------------------------------------
# Finding: a write's timeout is not honoured while a memtable switch fsyncs under the mutex
# ---------------------------------------------------------------------------------------------
# Fixed in session 21 (was a strict xfail): engine/db.py _switch_memtable fsynced the old log
# with _mu held, so a put(timeout=0.2) waited for the whole fsync on the mutex. The switch now
# releases the mutex for its I/O; the write gives up in the queue at its deadline.
def test_a_timed_write_does_not_wait_past_its_timeout_for_a_switch_fsync(tmp_path):
    fs = HoldFS()
    db = DB.open(str(tmp_path / "db"), fs=fs, disable_auto_compactions=True)
    out = []

    def timed_put():
        t0 = time.monotonic()
        try:
            db.put(b"b", b"2", timeout=0.2)
            out.append(("applied", time.monotonic() - t0))
        except WriteStalledError:
            out.append(("stalled", time.monotonic() - t0))

    flusher = writer = None
    try:
        db.put(b"a", b"1")
        h = fs.hold("sync", lambda p: p.endswith(".log"))  # the switch's fsync of the old log
        flusher = threading.Thread(target=db.flush)
        flusher.start()
        assert h.entered.wait(10)
        writer = threading.Thread(target=timed_put)
        writer.start()
        writer.join(3.0)
        done = not writer.is_alive()
    finally:
        fs.release_all()
        for t in (flusher, writer):
            if t is not None:
                t.join(10)
        db.close()
    assert done, "put(timeout=0.2) still waiting 3 s later (on the DB mutex)"
    assert out and out[0][0] == "stalled", out


# ---------------------------------------------------------------------------------------------
# Finding: a full disk at the log with an empty memtable turns into a fatal manifest failure
# ---------------------------------------------------------------------------------------------
def test_a_full_disk_at_the_log_with_an_empty_memtable_recovers_when_space_returns(tmp_path):
    path = str(tmp_path / "db")
    fs = HoldFS()
    db = DB.open(path, fs=fs, disable_auto_compactions=True)
    try:
        db.put(b"a", b"1")
        db.flush()  # the memtable is empty now
        fs.fail_writes_with(errno.ENOSPC)  # the disk is full
        for key in (b"k1", b"k2"):  # the first breaks the log, the second switches memtables
            with pytest.raises(StorageIOError) as exc:
                db.put(key, b"v")
            assert exc.value.errno == errno.ENOSPC
        # Let the flush thread try the frozen memtable (if any) while the disk is still full.
        wait_until(lambda: (db.stats()["failed"] is not None
                            or db.stats()["memtable"]["frozen"] == 0), "a flush try", 10)
        fs.fail_writes_with(None)  # space is back
        deadline = time.monotonic() + 60  # retries come RETRY_FIRST_S apart; liveness
        # bound on a loaded 2-core machine, not a speed target
        last = None
        while time.monotonic() < deadline:
            try:
                db.put(b"after", b"space")
                last = None
                break
            except StorageIOError as e:
                last = e
                time.sleep(0.2)
        assert last is None, f"writes still refused once space is back: {last}"
        assert db.get(b"a") == b"1" and db.get(b"after") == b"space"
    finally:
        _close_quietly(db)


# ---------------------------------------------------------------------------------------------
# Finding: a failing close of the log leaves the directory locked for good
# ---------------------------------------------------------------------------------------------
def test_close_releases_the_lock_even_if_closing_the_log_fails(tmp_path):
    path = str(tmp_path / "db")
    fs = HoldFS()
    db = DB.open(path, fs=fs)
    db.put(b"a", b"1", sync=True)
    fs.fail_close = lambda p: p.endswith(".log")
    with pytest.raises(StorageIOError):
        db.close()  # reporting the failure is right; keeping the lock is not
    db.close()
    try:
        reopened = DB.open(path, fs=fs)
    except LockedError as exc:
        pytest.fail(f"the directory stays locked after close(): {exc}")
    with reopened:
        assert reopened.get(b"a") == b"1"


# ---------------------------------------------------------------------------------------------
# Holding: process exit without close, with table workers busy
# ---------------------------------------------------------------------------------------------
_CHILD = r"""
import sys
from engine import DB
db = DB.open(sys.argv[1], memtable_bytes=4096, table_workers=2, l0_compaction_trigger=2,
             target_file_size=16384, max_bytes_for_level_base=32768)
for i in range(int(sys.argv[2])):
    db.put(b"key%06d" % i, b"v" * 50)
print("acked", flush=True)
db = None  # no close: the interpreter exits with flushes and compactions under way
"""


def test_a_process_exit_without_close_loses_no_acknowledged_write(tmp_path):
    path = str(tmp_path / "db")
    n = 2000
    env = dict(os.environ, PYTHONPATH=REPO)
    r = subprocess.run([sys.executable, "-c", _CHILD, path, str(n)], capture_output=True,
                       text=True, timeout=120, env=env, cwd=REPO)
    assert r.returncode == 0 and "acked" in r.stdout, r.stderr[-2000:]
    # No compaction after this open: one would write outputs not yet in the version, and
    # leave its inputs on disk until older reads let go of them, both "strays" to this check
    # (CI once saw one); what is checked is that the open swept what the exit left.
    with DB.open(path, table_workers=0, disable_auto_compactions=True) as db:
        got = db.multi_get([b"key%06d" % i for i in range(n)])
        assert sum(v is None for v in got) == 0
        assert _stray_tables(path, db) == []
        logs = [f for f in os.listdir(path) if f.endswith(".log")]
        assert len(logs) == 1, logs


# ---------------------------------------------------------------------------------------------
# Holding: synced writers through group commit across memtable switches, then power loss
# ---------------------------------------------------------------------------------------------
def test_synced_writers_across_switches_keep_every_acknowledged_write_through_power_loss(
        tmp_path):
    path = str(tmp_path / "db")
    fs = FaultInjectionFS(seed=7)
    db = DB.open(path, fs=fs, memtable_bytes=1024, max_frozen_memtables=1,
                 l0_compaction_trigger=2, target_file_size=2048, max_bytes_for_level_base=4096,
                 tombstone_compaction_delay=0.0)
    acked: list[bytes] = []
    stop = threading.Event()

    def writer(t: int) -> None:
        for i in range(10_000):
            if stop.is_set():
                return
            k = b"t%d-%05d" % (t, i)
            try:
                db.put(k, b"x" * 40, sync=True)
            except BaseException:  # noqa: BLE001 - the crash reaches writers too
                return
            acked.append(k)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(acked) >= 300, "300 synced puts", 60, poll=0.01)
        assert db.stats()["flushes"] >= 3
        fs.crash_after(1)  # the machine dies at the next file operation
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not any(t.is_alive() for t in threads)
    _close_quietly(db)
    fs.crash("drop")
    with DB.open(path, fs=FaultInjectionFS()) as db2:
        got = db2.multi_get(list(acked))
    missing = [k for k, v in zip(acked, got) if v is None]
    assert missing == []


# ---------------------------------------------------------------------------------------------
# Holding: a table worker killed or stopped in the middle of a flush
# ---------------------------------------------------------------------------------------------
def _busy_worker(db):
    def find():
        with db._pool._cv:
            return next((w for w in db._pool._busy if w.owner is db), None)
    return wait_until(find, "the flush to reach a table worker", 30, poll=0.002)


@pytest.mark.parametrize("then", ["sigkill", "close"])
def test_a_worker_killed_or_stopped_mid_flush_loses_nothing(tmp_path, then):
    path = str(tmp_path / "db")
    n = 20_000
    db = DB.open(path, table_workers=1, memtable_bytes=64 << 20,
                 disable_auto_compactions=True)
    out = []

    def flush():
        try:
            db.flush()
            out.append("ok")
        except ClosedError:
            out.append("closed")

    t = threading.Thread(target=flush)
    w = None
    try:
        db.write([(b"k%07d" % i, b"v" * 20) for i in range(n)])
        t.start()
        w = _busy_worker(db)
        os.kill(w.proc.pid, signal.SIGSTOP)
        if then == "sigkill":
            os.kill(w.proc.pid, signal.SIGKILL)
            t.join(60)
            assert out == ["ok"]
            assert db.stats()["table_workers"]["fallbacks_worker_lost"] == 1
        else:
            t0 = time.monotonic()
            db.close()
            assert time.monotonic() - t0 < 60  # liveness (a stopped worker waits for ever)
            t.join(60)
            assert out == ["closed"]
    finally:
        if w is not None and w.proc.poll() is None:
            os.kill(w.proc.pid, signal.SIGKILL)
        t.join(60)
        db.close()
    assert not t.is_alive()
    with DB.open(path, table_workers=0) as db2:
        assert db2.multi_get([b"k%07d" % i for i in (0, 777, n - 1)]) == [b"v" * 20] * 3
        assert _stray_tables(path, db2) == []


# ---------------------------------------------------------------------------------------------
# Holding: reads and reports overlapping close()
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method,at", [
    ("stats", "_compression"), ("filter_report", "filter_stats"), ("verify", "verify_db"),
    ("multi_get", "find_older"), ("scan", "merge_newest")])
def test_a_call_overlapping_close_answers_whole_or_raises_closed(tmp_path, method, at):
    db = DB.open(str(tmp_path / "db"), table_workers=0, memtable_bytes=2048,
                 disable_auto_compactions=True)
    for i in range(300):
        db.put(b"k%04d" % i, b"v" * 30)
    db.flush()
    if method == "multi_get":
        call, args = db.multi_get, ([b"k0001", b"k0200", b"zz"],)
    elif method == "scan":
        call, args = (lambda: list(db.scan())), ()
    else:
        call, args = getattr(db, method), ()
    t, entered, release, out = run_held(call, at, *args)
    try:
        assert entered.wait(10)
        db.close()
    finally:
        release.set()
        t.join(30)
        db.close()
    assert not t.is_alive() and out
    kind, value = out[0]
    if kind == "err":
        assert isinstance(value, ClosedError), repr(value)
    elif method == "multi_get":
        assert value == [b"v" * 30, b"v" * 30, None]
    elif method == "scan":
        assert len(value) == 300
    else:
        assert isinstance(value, dict)
