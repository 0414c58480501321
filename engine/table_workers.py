"""Worker processes that write tables (flush and compaction outputs) outside the GIL.

Building a table is pure Python CPU work (encoding blocks, hashing keys into filters); in the
DB's own threads it competes with every get and put for the GIL. RocksDB runs flushes and
compactions on other cores; so do we, in processes: a :class:`WorkerPool` of spawned Python
processes that run *jobs* (a picklable top-level function and its arguments, e.g.
:func:`engine.table_writer.flush_job`, :func:`engine.compaction.runner.compaction_job`) and
send back the result. The DB then installs the tables exactly as if its own thread had
written them (the worker fsyncs the tables and the directory before it answers).

Rules:

- One pool per process, shared by every DB of the process, started lazily on the first job.
  Workers are fresh interpreters (``python -c``, talking over two pipes), never forks:
  forking a process that runs gRPC threads is unsafe, and unlike multiprocessing's spawn
  this does not re-import the owner's ``__main__``.
- Workers die with the process that owns them: each sets ``PR_SET_PDEATHSIG`` (Linux) to
  SIGKILL, tied to a spawner thread that lives as long as the process. An orphaned worker
  could otherwise keep writing into a directory that a new DB process has locked and reuses
  file numbers in.
- Only the real file system: a test FileSystem (fault injection) cannot cross a process
  boundary, so the DB runs jobs in its own threads then (option ``table_workers=0`` too).
- :meth:`WorkerPool.cancel` kills the workers busy with an owner's jobs (DB close): their
  ``call`` raises :class:`WorkerLost`, and the half-written tables, never named by the
  manifest, are removed at the next open. It kills them while holding the pool's lock and
  marks them, so a worker that finished its job just before the kill is never handed out
  again, dead, to the next job of another DB (that job used to fall back to its DB's thread).
  It also wakes the owner's jobs still waiting for a worker (every one busy, e.g. with other
  DBs' compactions): a job whose ``cancelled`` predicate (an argument of ``call``) is true
  raises WorkerLost at once instead of waiting, so a closing DB never waits for another DB's
  job. The predicate is read under the pool's lock and ``cancel`` takes that lock, so a job
  that begins to wait after it was set sees it too.
- A dead worker is replaced: one that died during a job when that job ends, one that died
  while idle (killed from outside, the OOM killer) when the next job finds it dead
  (``proc.poll()``), before the job is sent.
- A worker that cannot be started (fork or exec failing: no memory, no file descriptors)
  makes the jobs that wait for it raise :class:`NoWorker` (their DBs run them in their own
  threads); the pool keeps its size and tries again once ``spawn_retry_s`` has passed. A job
  waiting when a start fails raises NoWorker at once if no other worker is busy or starting;
  else it waits, at most until ``spawn_retry_s`` after the failure, for a worker to come free,
  then starts one again, and raises NoWorker if that start fails too: it never waits for an
  unrelated long job (a compaction of another DB) to end.
- A worker runs the same engine code as its owner, or none: the owner passes a fingerprint
  of the engine package's files as they were when it imported them (:data:`CODE_FINGERPRINT`:
  names, sizes, modification times) and a new worker, having imported every job's module,
  answers whether its own matches before it takes a job. After an upgrade in place (a new
  package installed under a running shard, a checkout moved under a running test) a new
  worker would otherwise import the new code and get jobs in the old code's terms (a flush's
  memtable as another structure): the start fails with a clear reason, the pool stops
  starting workers (:class:`CodeChanged`, every job gets NoWorker saying so, and its DB runs
  it in its own thread, with the code it has loaded) until the process restarts.
- Idle workers exit: one that has had no job for ``idle_exit_s`` (:data:`IDLE_EXIT_S`) is
  taken out of the idle list under the pool's lock (no job can be handed it after that) and
  told to exit by the spawner thread, which waits for the next such deadline, reaps retired
  workers as they exit and kills one still alive 30 s later, between spawns: a retired worker
  that does not exit (stopped, hung) never holds a spawn back. Jobs start workers again as
  they need them.
- Errors come back as SieveError subclasses (re-created from the message, errno and path):
  engine exceptions do not survive pickling as-is.

Thread safety: ``call`` may be made from many threads; each waits for an idle worker.
"""

from __future__ import annotations

import importlib.machinery
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection

from .errors import CorruptionError, InvalidArgumentError, SieveError, StorageIOError


class WorkerLost(SieveError):
    """The worker running a job died or was cancelled; the job's outcome is unknown."""


class NoWorker(WorkerLost):
    """No worker process could be started for a job (it was never sent to one)."""


class CodeChanged(SieveError):
    """A new worker found other engine code on disk than its owner runs (module docstring)."""


# Python source, sourceless bytecode, compiled extensions (engine/_speedups.*.so) and the
# Cython source that decides whether a process uses its build (engine/speedups.py)
_CODE_SUFFIXES = (".py", ".pyc", ".pyx", *importlib.machinery.EXTENSION_SUFFIXES)


def code_fingerprint(package_dir: str) -> str:
    """A digest of where ``package_dir`` is and of the names, sizes and modification times of
    its code: every ``.py`` file, every ``.pyc`` outside ``__pycache__`` (a sourceless
    install), every compiled extension and its ``.pyx`` source (engine/speedups.py) under it; for a package inside an archive (zipimport), of the archive file. What
    changes when a package is reinstalled, a checkout moves, or another copy is imported."""
    import hashlib

    h = hashlib.sha256(os.path.abspath(package_dir).encode() + b"\n")
    if not os.path.isdir(package_dir):
        archive = package_dir
        while archive and not os.path.exists(archive):  # .../engine.zip/engine -> the zip
            parent = os.path.dirname(archive)
            archive = parent if parent != archive else ""
        try:
            st = os.stat(archive)
            h.update(f"{archive}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        except OSError:
            pass
        return h.hexdigest()[:32]
    for root, dirs, files in os.walk(package_dir):
        # __pycache__ holds the interpreter's caches of the .py files (rewritten when they
        # are compiled, not when the code changes)
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(_CODE_SUFFIXES):
                path = os.path.join(root, name)
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                rel = os.path.relpath(path, package_dir)
                h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:32]


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
CODE_FINGERPRINT = code_fingerprint(_PACKAGE_DIR)
"""The engine code this process imported (taken when this module is first imported, with the
rest of the engine)."""

_JOB_MODULES = ("engine.table_writer", "engine.compaction.runner", "engine.memtable")
"""Imported by a worker before it answers its owner: every module a job's code lives in."""

HELLO_TIMEOUT_S = 120.0
"""How long a new worker may take to start (interpreter, imports) before the start fails."""

SPAWN_RETRY_S = 1.0
"""After a failed start, seconds during which jobs do not try to start another worker."""

IDLE_EXIT_S = 60.0
"""A worker left idle this long exits, giving its memory back (~35 MiB each); the next job
starts one again (~0.2 s: an interpreter and the engine's imports). An idle shard then holds
no worker processes; a shard under write load keeps its workers (a flush or compaction at
least once a minute)."""


_ERRORS = {"StorageIOError": StorageIOError, "CorruptionError": CorruptionError,
           "InvalidArgumentError": InvalidArgumentError}


def _set_parent_death_signal() -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:  # noqa: BLE001 - not Linux: fall back on the watchdog below
        pass


def _watchdog(parent: int) -> None:
    import time

    while True:
        time.sleep(0.05)
        if os.getppid() != parent:
            os._exit(1)


def _main(rfd: int, wfd: int, parent: int, expected: str = "") -> None:
    """Entry point of a worker process (see WorkerPool._spawn_one)."""
    _set_parent_death_signal()
    if os.getppid() != parent:  # the owner died before the signal was armed
        os._exit(1)
    threading.Thread(target=_watchdog, args=(parent,), daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the owner's business
    conn_in = Connection(rfd, writable=False)
    conn_out = Connection(wfd, readable=False)
    import importlib

    for name in _JOB_MODULES:  # all the code a job can run, loaded before the check
        importlib.import_module(name)
    if CODE_FINGERPRINT != expected:
        conn_out.send(("stale", CODE_FINGERPRINT))
        return
    conn_out.send(("ready", CODE_FINGERPRINT))
    while True:
        try:
            msg = conn_in.recv()
            if msg is None:
                return
            n, head = msg
            buffers = [conn_in.recv_bytes() for _ in range(n)]
        except (EOFError, OSError):
            return
        try:
            fn, args = pickle.loads(head, buffers=buffers)
            del msg, head, buffers  # the job's arguments live in args only, and go with it
            reply = ("ok", fn(*args))
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the caller
            # An OSError's message without its "[Errno N]" prefix: the parent's error adds it.
            text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            reply = ("err", type(exc).__name__, text, getattr(exc, "errno", None),
                     getattr(exc, "path", None), traceback.format_exc())
        fn = args = msg = head = buffers = None  # an idle worker keeps nothing of the job
        try:
            conn_out.send(reply)
        except (EOFError, OSError):
            return


_BOOT = ("import sys; from engine.table_workers import _main; "
         "_main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])")


def _spawn_one():
    """Start one worker: a fresh interpreter importing this package, two pipes."""
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        proc = subprocess.Popen(
            # -P: no working directory on sys.path (-c would put it before PYTHONPATH, and an
            # `engine` there, another checkout's, would be imported instead of the owner's)
            [sys.executable, "-P", "-c", _BOOT, str(to_child_r), str(from_child_w),
             str(os.getpid()), CODE_FINGERPRINT],
            pass_fds=(to_child_r, from_child_w), env=env, stdin=subprocess.DEVNULL)
    except BaseException:
        for fd in (to_child_r, to_child_w, from_child_r, from_child_w):
            os.close(fd)
        raise
    os.close(to_child_r)
    os.close(from_child_w)
    send, recv = Connection(to_child_w, readable=False), Connection(from_child_r, writable=False)
    try:
        hello = recv.recv() if recv.poll(HELLO_TIMEOUT_S) else None
    except (EOFError, OSError):
        hello = None
    if hello is None or hello[0] != "ready":
        proc.kill()
        proc.wait()
        send.close()
        recv.close()
        if hello is not None and hello[0] == "stale":
            raise CodeChanged(
                "the engine code on disk changed since this process started (a new worker "
                f"would run other code: fingerprint {hello[1]}, this process {CODE_FINGERPRINT});"
                " table jobs run in the DB's threads until the process restarts")
        raise WorkerLost(f"table worker did not start (exit status {proc.returncode})")
    return proc, send, recv


class _Worker:
    def __init__(self, proc, send_conn, recv_conn):
        self.proc = proc
        self.send_conn = send_conn
        self.recv_conn = recv_conn
        self.owner = None
        self.cancelled = False  # killed by cancel(): never idle again
        self.idle_since = time.monotonic()

    def close(self) -> None:
        for c in (self.send_conn, self.recv_conn):
            try:
                c.close()
            except OSError:
                pass


class WorkerPool:
    """A fixed number of spawned worker processes. See the module docstring."""

    def __init__(self, size: int, spawn_retry_s: float = SPAWN_RETRY_S,
                 idle_exit_s: float = IDLE_EXIT_S):
        self.size = size
        self.spawn_retry_s = spawn_retry_s
        self.idle_exit_s = idle_exit_s
        self._cv = threading.Condition()
        self._idle: list[_Worker] = []
        self._busy: list[_Worker] = []
        self._starting = 0
        self._requests: list = []
        self._spawner: threading.Thread | None = None
        self._spawn_failed_at: float | None = None  # monotonic time of the last failed start
        self._spawn_error = ""
        self._closed = False
        self._stale: str | None = None  # CodeChanged's message, once a start saw it
        self.jobs = 0
        self.restarts = 0  # dead workers dropped (during a job, while idle, or cancelled)
        self.spawn_failures = 0
        self.idle_exits = 0  # workers that exited after idle_exit_s without a job
        # Retired idle workers told to exit and not yet reaped, with the time past which they
        # are killed (the spawner thread only: never waited for on the way to a spawn).
        self._exiting: list[tuple[_Worker, float]] = []

    @property
    def running(self) -> int:
        """Worker processes alive now (idle or busy; starting ones not counted)."""
        with self._cv:
            return len(self._idle) + len(self._busy)

    @property
    def disabled(self) -> str | None:
        """Why the pool starts no more workers (:class:`CodeChanged`'s message), or None."""
        return self._stale

    # -- spawning (in one long-lived thread, so PDEATHSIG means "the process died") ------------
    def _take_idle_expired(self) -> tuple[list[_Worker], float | None]:
        """Remove the workers idle for ``idle_exit_s`` from the idle list; return them and
        the seconds until the next one is due (None: no idle worker). REQUIRES: ``_cv``."""
        now = time.monotonic()
        expired = [w for w in self._idle if now - w.idle_since >= self.idle_exit_s]
        if expired:
            self._idle = [w for w in self._idle if w not in expired]
        due = min((w.idle_since + self.idle_exit_s - now for w in self._idle), default=None)
        return expired, due

    @staticmethod
    def _tell_to_exit(w: _Worker) -> None:
        """Send an idle worker (out of every list) the exit message and drop its pipes; a
        worker reads it at once, so this does not block (the message is a few bytes)."""
        try:
            w.send_conn.send(None)
        except OSError:
            pass
        w.close()

    @classmethod
    def _stop_idle(cls, workers: list[_Worker]) -> None:
        """Ask idle workers (out of every list) to exit and wait for them; kill one that does
        not within 30 s. For close(). REQUIRES: not holding ``_cv``."""
        for w in workers:
            cls._tell_to_exit(w)
            try:
                w.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()

    def _reap_exiting(self, kill_all: bool = False) -> float | None:
        """Reap retired workers that have exited; kill those past their deadline (a stopped
        or hung process: it never holds a spawn back). Returns seconds until the next check
        (None: none left). Spawner thread only (``_exiting`` is its own)."""
        now = time.monotonic()
        left = []
        for w, deadline in self._exiting:
            if w.proc.poll() is not None:
                continue
            if kill_all or now >= deadline:
                w.proc.kill()
                w.proc.wait()
                continue
            left.append((w, deadline))
        self._exiting = left
        # Poll for exits often at first (a worker exits within milliseconds of the message),
        # then at the deadline.
        return min((min(d - now, 0.1) for _, d in left), default=None)

    def _spawn_loop(self) -> None:
        while True:
            reap_in = self._reap_exiting()
            expired: list[_Worker] = []
            with self._cv:
                while not self._requests and not self._closed:
                    expired, due = self._take_idle_expired()
                    if expired:
                        dead = sum(w.proc.poll() is not None for w in expired)
                        self.restarts += dead  # died while idle (killed from outside)
                        self.idle_exits += len(expired) - dead
                        break
                    if reap_in is not None:
                        due = reap_in if due is None else min(due, reap_in)
                    # A released worker or a new request wakes it too; capped, as
                    # threading.TIMEOUT_MAX bounds a wait (idle_exit_s may be inf: never).
                    self._cv.wait(None if due is None else min(due, 3600.0))
                    if reap_in is not None:
                        break  # reap, then wait again
                closed = self._closed
                spawn = bool(self._requests) and not closed and not expired
                if spawn:
                    self._requests.pop()
            if closed:
                self._stop_idle(expired)
                self._reap_exiting(kill_all=True)
                return
            now = time.monotonic()
            for w in expired:
                self._tell_to_exit(w)
                self._exiting.append((w, now + 30.0))
            if not spawn:
                continue
            try:
                w, error = _Worker(*_spawn_one()), ""
            except CodeChanged as exc:
                w, error = None, str(exc)
                with self._cv:
                    self._stale = error  # for good: a restart of the process clears it
            except BaseException as exc:  # noqa: BLE001 - callers fall back to their own threads
                w, error = None, repr(exc)
            with self._cv:
                self._starting -= 1
                if w is None:
                    self.spawn_failures += 1
                    self._spawn_failed_at = time.monotonic()
                    self._spawn_error = error
                elif self._closed:
                    w.proc.kill()
                    w.proc.wait()
                    w.close()
                else:
                    self._spawn_failed_at = None
                    self._idle.append(w)
                self._cv.notify_all()

    def _acquire(self, owner, cancelled=None) -> _Worker:
        """An idle, live worker, now busy with ``owner``'s job. Raises NoWorker if none can
        be started, WorkerLost once ``cancelled()`` is true (see ``call``). REQUIRES: not
        holding ``_cv``."""
        tolerated = None  # the failed start this job waited through (module docstring)
        with self._cv:
            while True:
                if self._closed:
                    raise NoWorker("the worker pool is closed")
                if cancelled is not None and cancelled():
                    raise WorkerLost("table worker job cancelled while it waited for a worker")
                while self._idle:
                    w = self._idle.pop()
                    if w.proc.poll() is not None:  # died while idle: replace it below
                        self.restarts += 1
                        w.close()
                        continue
                    w.owner = owner
                    self._busy.append(w)
                    return w
                if self._stale is not None:  # live workers started before go on; no new one
                    raise NoWorker(self._stale)
                failed_at = self._spawn_failed_at
                now = time.monotonic()
                if failed_at is not None and now - failed_at < self.spawn_retry_s:
                    # Nothing to wait for, or a second failure: the DB runs the job itself.
                    if (not self._busy and not self._starting) or (
                            tolerated is not None and failed_at != tolerated):
                        raise NoWorker("no table worker process could be started "
                                       f"({self._spawn_error})")
                    # A busy worker may come free first; else start again at the deadline
                    # (no one notifies then: a timed wait).
                    tolerated = failed_at
                    self._cv.wait(failed_at + self.spawn_retry_s - now)
                    continue
                if len(self._busy) + self._starting < self.size:
                    self._starting += 1
                    self._requests.append(1)
                    if self._spawner is None:
                        self._spawner = threading.Thread(target=self._spawn_loop,
                                                         name="sievekv-worker-spawner",
                                                         daemon=True)
                        self._spawner.start()
                    self._cv.notify_all()
                self._cv.wait()

    def _release(self, w: _Worker, alive: bool) -> bool:
        """Take ``w`` back; return whether it stays (live and not cancelled), counting the
        job (``alive``: it answered). A worker that does not stay must be killed and reaped by
        the caller (outside the lock)."""
        with self._cv:
            if alive:
                self.jobs += 1  # under the lock: calls from many threads count every job
            self._busy.remove(w)
            w.owner = None
            keep = alive and not w.cancelled and not self._closed
            if keep:
                w.idle_since = time.monotonic()
                self._idle.append(w)
            else:
                self.restarts += 1
                w.close()
            self._cv.notify_all()
            return keep

    # -- jobs ------------------------------------------------------------------------------
    def call(self, owner, fn, *args, cancelled=None):
        """Run ``fn(*args)`` in a worker; return its result or raise its error.

        Raises WorkerLost if the worker dies (or is cancelled) before answering, NoWorker
        (a WorkerLost) if no worker could be started. ``cancelled``: a callable without
        arguments, cheap and taking no lock (it runs under the pool's), true once ``owner``
        is going away: the job then raises WorkerLost instead of waiting for a worker; set
        it before calling :meth:`cancel`, which wakes the waiting jobs (module docstring).
        """
        w = self._acquire(owner, cancelled)
        reply = lost = None
        try:
            # Pickle protocol 5: what an argument exposes as PickleBuffers (a flush's memtable
            # columns, tens of MiB) goes down the pipe from its own memory after a small head,
            # instead of first being copied into one pickle (engine/memtable.py Columns).
            buffers: list = []
            head = pickle.dumps((fn, args), protocol=5, buffer_callback=buffers.append)
            w.send_conn.send((len(buffers), head))
            for b in buffers:
                w.send_conn.send_bytes(b.raw())
            del buffers
            reply = w.recv_conn.recv()
        except (EOFError, OSError) as exc:
            lost = exc
        finally:
            if not self._release(w, reply is not None):
                w.proc.kill()
                w.proc.wait()
        if reply is None:
            why = "cancelled" if w.cancelled else f"exit status {w.proc.returncode}"
            raise WorkerLost(f"table worker died during a job ({why}; {lost!r})")
        if reply[0] == "ok":
            return reply[1]
        _tag, name, message, errno_, path, tb = reply
        cls = _ERRORS.get(name)
        if cls is StorageIOError:
            raise StorageIOError(message, errno_=errno_)
        if cls is CorruptionError:
            raise CorruptionError(message)
        if cls is InvalidArgumentError:
            raise InvalidArgumentError(message)
        if name == "NumbersExhausted":
            from .table_writer import NumbersExhausted
            raise NumbersExhausted(message)
        raise SieveError(f"table worker failed: {name}: {message}\n{tb}")

    def cancel(self, owner) -> int:
        """Kill the workers busy with ``owner``'s jobs; return how many. Also wake the jobs
        waiting for a worker, so that those of ``owner`` see their ``cancelled`` predicate.

        Under the lock: a worker still busy with ``owner`` cannot be released (and handed to
        another owner) before it is killed, and being marked it never goes back to idle, even
        if its reply arrived before the signal.
        """
        with self._cv:
            victims = [w for w in self._busy if w.owner is owner]
            for w in victims:
                w.cancelled = True
                w.proc.kill()
            self._cv.notify_all()
        return len(victims)

    def close(self) -> None:
        """Stop the pool's workers (idle ones exit, busy ones are killed) and refuse later
        calls (NoWorker). For private pools (tests); the shared pool lives as long as the
        process."""
        with self._cv:
            self._closed = True
            idle, self._idle = self._idle, []
            for w in self._busy:
                w.cancelled = True
                w.proc.kill()
            self._cv.notify_all()
        self._stop_idle(idle)
        if self._spawner is not None:
            self._spawner.join(timeout=30)


_pool: WorkerPool | None = None
_pool_lock = threading.Lock()


def shared_pool(size: int) -> WorkerPool:
    """The process-wide pool (created on first use with ``size`` workers; a later, larger
    ``size`` grows it)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = WorkerPool(size)
        elif size > _pool.size:
            with _pool._cv:
                _pool.size = size
        return _pool
