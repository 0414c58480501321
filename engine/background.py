"""Background work of :class:`engine.DB`: the flush thread and the compaction thread.

A mixin of DB (it uses the DB's state and locks; see engine/db.py for the lock order).

- The flush thread writes the oldest frozen memtable to an L0 table, records it in the
  manifest together with the new log number (the memtable's log is then obsolete and removed),
  and publishes a new read state.
- The compaction thread asks the picker (engine/compaction/picker.py) for the most urgent task
  and runs it; manual ``DB.compact()`` runs a full task in the caller's thread. Both hold
  ``_compaction_lock``: one compaction at a time. It asks *before* it first waits, so a DB
  that opens with work due (e.g. L0 at the trigger after crashes) compacts without waiting
  for a write, and a writer stopped at ``l0_stop_trigger`` right after open is released
  (RocksDB's MaybeScheduleFlushOrCompaction at the end of DB::Open;
  tests/test_reopen_compacts.py).
- Table writing runs in a worker process when the DB has a pool (engine/table_workers.py),
  else in the thread itself. A job that cannot run in a worker is rerun in the thread (a
  *fallback*: slower, never wrong): its worker died (``worker_lost``), none could be started
  (``no_worker``), or it used every file number reserved for it (``numbers_exhausted``).
  Each fallback is counted by reason in ``stats()["table_workers"]`` and logged as one warning
  (logger ``engine.background``). At close the DB's jobs are cancelled and their
  half-written tables removed: a job running in a worker is killed, and one still waiting for
  a worker (every worker of the process-wide pool busy, with other DBs' jobs too) stops
  waiting; either raises Cancelled in its thread, so close() never waits for another DB's
  job. A cancelled flush loses nothing: its memtable stays in its log, replayed at the next
  open.
- Before the manifest edit that makes them live, a job's output tables are opened and checked
  against what their writer reported (engine/output_check.py, as RocksDB opens its outputs
  before installing them). One that fails twice fails the job before the edit: nothing is
  installed, the outputs are removed, and the memtable's log or the compaction's inputs keep
  the data.
- A failure (I/O error, corruption) stops the thread and puts the DB in its failed state:
  writes are refused with the error, reads go on, reopening recovers. So does any other
  exception that escapes a thread's loop (a bug): it becomes the DB's error as
  ``BackgroundThreadError`` naming the thread and is logged with its traceback, so a DB never
  goes on silently without flushes or compactions.
- Timed waits last at most MAX_WAIT_S each; a later wake-up (a ``tombstone_compaction_delay``
  of years, meant as "never") is waited for in steps, never past ``threading.TIMEOUT_MAX``.

Full disk (RocksDB's auto-recovery from NoSpace): a job that fails with ENOSPC or EDQUOT while
the manifest is intact lost nothing (its partial tables are removed; the memtable and its log,
or the compaction's inputs, are untouched), so it is retried:
- a failed flush puts the DB in a *recoverable* failed state: writes are refused with the
  ENOSPC error (each refused write first asks for one more try and waits for it, at most
  RETRY_WAIT_S, so a write made once space is back goes through), and the flush thread tries
  again after RETRY_FIRST_S, doubling up to RETRY_MAX_S; the first flush that succeeds ends
  the state;
- a failed compaction leaves writes alone (they fail on their own if the log cannot grow) and
  the compaction thread tries again after the same backoff, at most RETRY_WAIT_S apart; a
  writer stopped at ``l0_stop_trigger`` meanwhile waits RETRY_WAIT_S for a retry to bring L0
  down, then fails with the compaction's ENOSPC instead of waiting for space without end.
Any other failure, or ENOSPC once the manifest has failed, is fatal as above.
"""

from __future__ import annotations

import errno
from dataclasses import replace
import logging
import threading
import time

from . import filenames
from .compaction import (CompactionResult, compaction_job, execute, max_outputs, pick, plan,
                         raw_input_bytes)
from .compaction.births import wall_time
from .compaction.picker import tombstone_wake_at
from .compaction.subcompaction import MIN_SPLIT_TARGETS, split, split_points
from .errors import SieveError
from .filter_plan import bits_for_new_table, is_last_level, table_options
from .memtable import ColumnsOf, MemTable
from .output_check import open_checked
from .table_workers import NoWorker, WorkerLost
from .table_writer import Cancelled, NumbersExhausted, flush_job, write_tables
from .version_edit import VersionEdit


class RunningCompaction:
    """What ``stats()["compaction_running"]`` reports about the compaction in progress.

    ``outputs`` lists the file numbers the job may write (reserved up front for a worker
    process, appended as the thread allocates them): the bytes written so far are the sizes of
    those files that exist, so progress is visible wherever the job runs, without a channel
    back from the worker.
    """

    __slots__ = ("task", "manual", "started", "outputs")

    def __init__(self, task, manual: bool):
        self.task = task
        self.manual = manual
        self.started = time.monotonic()
        self.outputs: list[int] = []

    def report(self, fs, dirname: str) -> dict:
        """JSON-able progress: levels, reason (engine/compaction/picker.py), input bytes,
        output bytes written so far, seconds."""
        written = 0
        for n in list(self.outputs):
            try:
                written += fs.file_size(filenames.table_file_name(dirname, n))
            except SieveError:  # not created yet, or already removed
                pass
        t = self.task
        return {"level": t.level, "output_level": t.output_level, "manual": self.manual,
                "reason": t.reason, "input_bytes": t.input_bytes(), "written_bytes": written,
                "seconds": round(time.monotonic() - self.started, 3)}


RETRY_FIRST_S = 1.0
"""Full disk: seconds before a failed job is first tried again (module docstring)."""
RETRY_MAX_S = 30.0
"""Full disk: the longest wait between tries."""
RETRY_WAIT_S = 5.0
"""Full disk: how long a refused write waits for the try it asked for."""
MAX_WAIT_S = 3600.0
"""The longest single timed wait of a background thread: a wake-up further away is waited for
in steps (``Condition.wait`` raises OverflowError past ``threading.TIMEOUT_MAX``, ~292 years,
and a waiting thread that sleeps that long serves nobody anyway)."""
RETRY_MIN_GAP_S = 1.0
"""Full disk: tries asked for by writes come at most this often (a try rebuilds the whole
memtable's table, so a client writing through an outage must not drive one per write)."""

_FULL_DISK = (errno.ENOSPC, errno.EDQUOT)

log = logging.getLogger(__name__)


class BackgroundThreadError(SieveError):
    """An unexpected exception (not an I/O error or corruption: a bug) ended a background
    thread; the DB's failed state carries it (module docstring). ``__cause__`` is the
    exception."""


def _unexpected(exc: BaseException, thread: str) -> BaseException:
    """``exc`` as the DB's error: engine errors and OS errors as they are, anything else
    wrapped so that the refusal names the thread and the exception's type."""
    if isinstance(exc, (SieveError, OSError)):
        return exc
    err = BackgroundThreadError(
        f"the {thread} thread failed unexpectedly: {type(exc).__name__}: {exc}")
    err.__cause__ = exc
    return err


class Background:
    """Flush and compaction for DB (mixin). REQUIRES the attributes DB._init sets."""

    _running: RunningCompaction | None = None  # the compaction in progress, for stats()
    # The error of the last flush that failed (DB.flush tells its own failure from another
    # job's); set under _mu.
    _flush_failure: BaseException | None = None

    def _full_disk(self, exc: BaseException) -> bool:
        """``exc`` is a full disk that a retry may get past (module docstring, "Full disk")."""
        return (isinstance(exc, OSError) and getattr(exc, "errno", None) in _FULL_DISK
                and not self._manifest.failed)

    def _flush_loop(self) -> None:
        self._guarded("flush", self._flush_work)

    def _compaction_loop(self) -> None:
        self._guarded("compaction", self._compaction_work)

    def _guarded(self, thread: str, loop) -> None:
        """Run a background thread's ``loop``: whatever escapes it (a bug: expected failures
        are handled inside) puts the DB in its failed state instead of ending the thread
        silently, so writes and stats() say why no flush or compaction runs any more."""
        try:
            loop()
        except BaseException as exc:  # noqa: BLE001 - recorded, surfaced to writers
            with self._mu:
                if self._set_bg_error(self._as_bg_error(exc, thread)):
                    self.counters.background_errors += 1
                self._bg_cv.notify_all()

    def _as_bg_error(self, exc: BaseException, thread: str) -> BaseException:
        """``exc`` as the DB's error (``_unexpected``); an unexpected one is logged with its
        traceback (logger ``engine.background``)."""
        err = _unexpected(exc, thread)
        if err is not exc:
            log.error("%s: %s", self.path, err, exc_info=exc)
        return err

    def _flush_work(self) -> None:
        delay = RETRY_FIRST_S
        last_try = 0.0
        while True:
            with self._mu:
                while not self._closing and self._bg_error is None and not self._frozen:
                    self._bg_cv.wait()
                if self._closing or (self._bg_error is not None and not self._bg_recoverable):
                    return
                if self._bg_error is not None:  # full disk: wait for the backoff or a writer
                    end = time.monotonic() + delay
                    while not self._closing and self._bg_recoverable and self._bg_error is not None:
                        now = time.monotonic()
                        if self._retry_now and now - last_try >= RETRY_MIN_GAP_S:
                            break
                        if now >= end:
                            break
                        wake = end if not self._retry_now else min(end, last_try + RETRY_MIN_GAP_S)
                        self._bg_cv.wait(max(0.0, wake - now))
                    if self._closing or (self._bg_error is not None and not self._bg_recoverable):
                        return
                    self._retry_now = False
                if not self._frozen:
                    continue
                mem = self._frozen[-1]
            last_try = time.monotonic()
            try:
                self._flush_memtable(mem)
            except BaseException as exc:  # noqa: BLE001 - recorded, surfaced to writers
                with self._mu:
                    self._flush_attempts += 1
                    self._flush_failure = exc
                    if isinstance(exc, Cancelled):
                        self._bg_cv.notify_all()
                        return
                    full = self._full_disk(exc)
                    if full and self._bg_error is not None and self._bg_recoverable:
                        delay = min(delay * 2, RETRY_MAX_S)  # still full: back off further
                    else:
                        delay = RETRY_FIRST_S
                    if self._set_bg_error(self._as_bg_error(exc, "flush"), recoverable=full):
                        self.counters.background_errors += 1
                    self._bg_cv.notify_all()
                    if full:
                        continue
                return
            with self._mu:
                self._flush_attempts += 1
                self._flush_failure = None
                if self._bg_error is not None and self._bg_recoverable:
                    self._bg_error = None  # space came back: writes go on
                    self._bg_recoverable = False
                    self.counters.recovered_errors += 1
                delay = RETRY_FIRST_S
                self._bg_cv.notify_all()

    def _flush_memtable(self, mem: MemTable) -> None:
        t0 = time.perf_counter()
        levels = self._version.levels
        bits = bits_for_new_table(self.options, levels, 0, len(mem))
        topts = table_options(self.options, bits)
        metas = None
        numbers: list[int] = []
        taken: list[int] = []  # numbers reserved by the in-thread writer

        def reserve(n: int) -> None:
            self._reserve(n)
            taken.append(n)

        try:
            if self._pool is not None:
                numbers = [self._manifest.new_file_number()]
                for n in numbers:
                    self._reserve(n)
                # Unsorted flat buffers, built while the job is sent (ColumnsOf): the worker
                # sorts and builds the entries, so this process (and the writers waiting on its
                # GIL) pays ~0.1 s, not ~1.1 s, per 64 MiB memtable, and holds no copy meanwhile.
                metas = self._in_worker(numbers, flush_job, self.path, ColumnsOf(mem), numbers,
                                        topts)
            if metas is None:
                metas = write_tables(self._fs, self.path, [list(mem.items())],
                                     new_number=self._manifest.new_file_number,
                                     table_options=topts, on_number=reserve)
        except BaseException as exc:
            # A failed job removed what it wrote: its numbers need no protection (a full disk
            # retried for hours would otherwise pile them up in _pending_outputs). A cancelled
            # one keeps them: close() removes its partial tables by them.
            if not isinstance(exc, Cancelled):
                self._unreserve(numbers)
                self._unreserve(taken)
            raise
        opened = self._open_outputs(metas, numbers + taken, "flush",
                                    "the memtable's write-ahead log still holds its data")
        with self._version_lock:
            with self._mu:
                i = self._frozen.index(mem)
                newer = self._frozen[i - 1] if i > 0 else self._mem
                edit = VersionEdit(log_number=newer.log_number, last_sequence=self._last_seq)
            for m in metas:
                edit.add_file(0, m)
            version = self._log_and_apply(edit, numbers, [m.number for m in metas], opened)
            # The flush is durable in the manifest: the memtable's log is obsolete.
            self._remove_file(filenames.log_file_name(self.path, mem.log_number))
            with self._mu:
                self._version = version
                self._births.flushed(metas, time.monotonic())
                self._frozen.remove(mem)
                self._publish()
                self.counters.flushes += 1
                self.counters.flush_bytes += sum(m.size for m in metas)
                self.counters.flush_s += time.perf_counter() - t0
                self._bg_cv.notify_all()
        self._unreserve(numbers)
        self._unreserve(m.number for m in metas)

    def _open_outputs(self, metas, reserved, job: str, kept: str) -> list[int]:
        """Open the new tables ``metas`` (FileMeta) and check each one against its writer's
        description (engine/output_check.py) before the manifest edit that would make them
        live; returns their numbers. Raises if one fails twice: the edit is then never made,
        the outputs are removed and unreserved (with ``reserved``, the numbers reserved for
        the job), and the error, of the same class, says that nothing was installed and what
        still holds the data (``job``, ``kept``); the caller's thread puts the DB in its
        failed state, and a reopen recovers from the log or the compaction's inputs.

        A failure is tried once more (all outputs opened afresh): an open can fail for a
        moment (EMFILE while another thread holds many descriptors) where the table is sound.

        Done here, outside the DB mutex, so that the read state built under it finds every
        output open: opening one reads its footer, index and filter index (~1.3 ms), and a
        1 GB L0 -> L1 compaction has ~250 outputs (bench/results/db.md "Session 16: put
        latency"). If the manifest edit fails, _log_and_apply closes them, so that a failed DB
        kept open for reads holds no table no version lists. Compactions call this under
        ``_compaction_lock`` (outside the DB mutex and ``_version_lock``)."""
        def give_up(exc) -> None:
            for m in metas:
                self._remove_file(filenames.table_file_name(self.path, m.number))
            self._unreserve(reserved)
            self._unreserve(m.number for m in metas)
            log.error("%s: %s output not installed", self.path, job, exc_info=exc)

        opened = open_checked(
            metas, lambda m: self._tables.get(m.number, listed=False),
            lambda pairs: self._close_unpublished([n for n, _ in pairs]), give_up, job, kept)
        return [n for n, _ in opened]

    def _close_unpublished(self, numbers) -> None:
        """Close tables opened by _open_outputs that no version published. Best effort: a
        failing close is logged, never raised over the error that brought us here."""
        try:
            self._tables.unref(numbers)
        except Exception:  # noqa: BLE001 - see the docstring
            log.warning("%s: closing unpublished output tables failed", self.path,
                        exc_info=True)

    def _log_and_apply(self, edit, reserved, outputs, opened=()):
        """``self._manifest.log_and_apply(edit)``. If it fails, whether the edit reached the
        disk is unknown (a failed fsync leaves the record in the file): the outputs may be
        live after a reopen, so they leave ``_pending_outputs`` and close() will not delete
        them; recovery decides (engine/manifest.py, "After log_and_apply raises"). The
        tables ``opened`` for the edit (_open_outputs) are closed: nothing published them."""
        try:
            return self._manifest.log_and_apply(edit)
        except BaseException:
            self._unreserve(reserved)
            self._unreserve(outputs)
            self._close_unpublished(opened)
            raise

    def _in_worker(self, numbers, fn, *args):
        """Run a table-writing job in a worker process. Returns None when the caller should
        run it in this thread instead (module docstring: a fallback, counted and logged);
        raises Cancelled if the DB is closing, or the job's own error."""
        try:
            result = self._pool.call(self, fn, *args, cancelled=self._is_closing)
            with self._mu:  # flush, compaction and subcompaction threads all count here
                self.counters.worker_jobs += 1
            return result
        except WorkerLost as exc:
            for n in numbers:  # a killed worker may leave a partial table behind
                self._remove_file(filenames.table_file_name(self.path, n))
            if self._closing:
                raise Cancelled() from None
            self._fell_back(fn, "no_worker" if isinstance(exc, NoWorker) else "worker_lost", exc)
            return None
        except NumbersExhausted as exc:
            self._fell_back(fn, "numbers_exhausted", exc)
            return None

    def _is_closing(self) -> bool:
        """For the pool (WorkerPool.call's ``cancelled``): read without a lock."""
        return self._closing

    def _fell_back(self, fn, reason: str, exc: BaseException) -> None:
        with self._mu:
            self.counters.note_worker_fallback(reason)
        job = "flush" if fn is flush_job else "compaction"
        log.warning("%s: %s job runs in the DB's thread instead of a table worker (%s): %s",
                    self.path, job, reason, exc)

    def _reserve(self, number: int) -> None:
        with self._mu:
            self._pending_outputs.add(number)

    def _unreserve(self, numbers) -> None:
        with self._mu:
            self._pending_outputs.difference_update(numbers)

    def _remove_file(self, path: str) -> None:
        try:
            self._fs.remove(path)
        except SieveError:
            pass  # an obsolete file left behind is removed at the next open

    # ------------------------------------------------------------------------------------
    # compaction
    # ------------------------------------------------------------------------------------
    def _compaction_work(self) -> None:
        """Pick and run compactions until close. With nothing due it waits on ``_bg_cv`` for
        a flush, an install or close, and no longer than until the next tombstone compaction
        held back by ``tombstone_compaction_delay`` becomes due (picker.tombstone_wake_at): a
        timed wait (at most MAX_WAIT_S, then it looks again), no polling, and close() does not
        wait for it."""
        opts = self.options
        delay = RETRY_FIRST_S
        while True:
            with self._mu:
                while True:  # pick first, then wait: the version recovered at open counts
                    if self._closing or (self._bg_error is not None and not self._bg_recoverable):
                        return
                    wake = None
                    if not opts.disable_auto_compactions:
                        now = time.monotonic()
                        task = pick(self._version, opts, now, self._births)
                        if task is not None:
                            break
                        # A tombstone compaction held back by tombstone_compaction_delay:
                        # wake up when it is due, even if no write ever comes again.
                        wake = tombstone_wake_at(self._version, opts, now, self._births)
                    self._bg_cv.wait(None if wake is None
                                     else min(MAX_WAIT_S, max(0.0, wake - now)))
            try:
                with self._compaction_lock:
                    task = pick(self._version, opts, time.monotonic(), self._births)
                    if task is not None:
                        self._run_task(task)
                delay = RETRY_FIRST_S
                if self._compaction_full_disk is not None:
                    with self._mu:
                        self._compaction_full_disk = None
                        self._bg_cv.notify_all()
            except BaseException as exc:  # noqa: BLE001
                with self._mu:
                    if not isinstance(exc, Cancelled) and self._full_disk(exc):
                        # Full disk: nothing lost; writes go on; try again after a backoff.
                        self.counters.background_errors += 1
                        self._compaction_full_disk = exc
                        self._bg_cv.notify_all()  # writers stopped at L0 may give up now
                        end = time.monotonic() + delay
                        delay = min(delay * 2, RETRY_WAIT_S)
                        while not self._closing and time.monotonic() < end:
                            self._bg_cv.wait(end - time.monotonic())
                        continue
                    if (not isinstance(exc, Cancelled)
                            and self._set_bg_error(self._as_bg_error(exc, "compaction"))):
                        self.counters.background_errors += 1
                    self._bg_cv.notify_all()
                return

    def _run_task(self, task, manual: bool = False) -> None:
        """Run one compaction task and install its result (``manual``: for DB.compact, as
        stats() reports it). REQUIRES: _compaction_lock held."""
        running = RunningCompaction(task, manual)
        self._running = running
        try:
            self._run_task_now(task, running)
        finally:
            self._running = None

    def _run_task_now(self, task, running: RunningCompaction) -> None:
        t0 = time.perf_counter()
        version = self._version
        levels = version.levels
        removed = {f.number: f.num_entries for f in task.all_inputs}
        new_entries = sum(removed.values())
        last = task.bottommost and is_last_level(levels, task.output_level)
        bits = bits_for_new_table(self.options, levels, task.output_level, new_entries,
                                  removed, last_level=last)
        topts = table_options(self.options, bits)
        if task.reason == "tombstones" and not task.trivial_move:
            # The outputs store their youngest input's birth as their creation time, so the
            # next open dates them as this process does (engine/compaction/births.py).
            now = time.monotonic()
            born = self._births.tombstone_outputs_born(task, now)
            topts = replace(topts, creation_time=wall_time(born, time.time(), now))
        job = plan(task, version, self.options, topts, self.path)
        result = None
        k = self.options.max_subcompactions
        if (k > 1 and self._pool is not None and not task.trivial_move
                and task.input_bytes() >= MIN_SPLIT_TARGETS * self.options.target_file_size):
            split_run = self._run_split(task, job, k, running)
            if split_run is not None:
                reserved, result, ranges = split_run
                self._install(task, result, t0, reserved)
                with self._mu:
                    self.counters.subcompactions += ranges
                return
        try:
            if self._pool is not None and not task.trivial_move:
                job.input_raw_bytes = raw_input_bytes(task, self._tables.get)
                job.numbers = [self._manifest.new_file_number() for _ in range(max_outputs(job))]
                for n in job.numbers:
                    self._reserve(n)
                running.outputs = job.numbers
                result = self._in_worker(job.numbers, compaction_job, job)
            if result is None:
                running.outputs = []

                def on_number(n: int) -> None:
                    self._reserve(n)
                    running.outputs.append(n)

                result = execute(job, fs=self._fs, open_table=self._tables.get,
                                 new_number=self._manifest.new_file_number, on_number=on_number,
                                 should_stop=lambda: self._closing)
        except BaseException as exc:
            if not isinstance(exc, Cancelled):  # as in _flush_memtable
                self._unreserve(job.numbers)
                self._unreserve(running.outputs)
            raise
        self._install(task, result, t0, job.numbers)

    def _run_split(self, task, job, k: int, running: RunningCompaction):
        """Run ``job`` as up to ``k`` key ranges, each in a table worker, at once
        (engine/compaction/subcompaction.py); returns ``(numbers reserved, the combined
        CompactionResult, ranges run)``, or None when the inputs give no split point (the
        caller runs the job whole). A range whose worker is lost or cannot start runs in a
        thread of this DB instead, as a whole job would. If any range fails, the others are
        waited for, every table the ranges wrote is removed and the first error is raised."""
        points = split_points(task, self._tables.get, k)
        if not points:
            return None
        parts = split(job, points)
        raw = raw_input_bytes(task, self._tables.get)
        for part in parts:
            part.input_raw_bytes = raw
            part.numbers = [self._manifest.new_file_number() for _ in range(max_outputs(part))]
            for n in part.numbers:
                self._reserve(n)
        # Every number the ranges may write: reserved up front, then those a range rerun in a
        # thread allocates as it goes (progress in stats() reads the tables so named).
        running.outputs = [n for part in parts for n in part.numbers]
        results: list = [None] * len(parts)
        errors: list[BaseException] = []

        def on_number(n: int) -> None:
            self._reserve(n)
            running.outputs.append(n)

        def run(i: int) -> None:
            part = parts[i]
            try:
                r = self._in_worker(part.numbers, compaction_job, part)
                if r is None:
                    r = execute(part, fs=self._fs, open_table=self._tables.get,
                                new_number=self._manifest.new_file_number,
                                on_number=on_number, should_stop=lambda: self._closing)
                results[i] = r
            except BaseException as exc:  # noqa: BLE001 (re-raised below, after the join)
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(i,), name=f"sievekv-subcompaction-{i}",
                                    daemon=True) for i in range(1, len(parts))]
        for t in threads:
            t.start()
        run(0)  # the first range in this thread, which would otherwise only wait
        for t in threads:
            t.join()
        reserved = list(running.outputs)
        if errors:
            for r in results:
                for f in (r.outputs if r is not None else ()):
                    self._remove_file(filenames.table_file_name(self.path, f.number))
            if not any(isinstance(e, Cancelled) for e in errors):
                self._unreserve(reserved)
            raise next((e for e in errors if not isinstance(e, Cancelled)), errors[0])
        edit = VersionEdit()
        for level, number in task.deletions():
            edit.delete_file(level, number)
        outputs = [f for r in results for f in r.outputs]
        for f in outputs:
            edit.add_file(task.output_level, f)
        return reserved, CompactionResult(
            edit, outputs, bytes_read=task.input_bytes(),
            bytes_written=sum(f.size for f in outputs),
            entries_in=sum(f.num_entries for f in task.all_inputs),
            entries_out=sum(f.num_entries for f in outputs)), len(parts)

    def _install(self, task, result, t0: float, reserved) -> None:
        """Apply a finished compaction's edit, publish the new version and remove its inputs;
        ``reserved``: the output numbers reserved for it, released once the edit is applied."""
        # A trivial move's "outputs" are its input, open and published already.
        opened = [] if task.trivial_move else self._open_outputs(
            result.outputs, reserved, "compaction", "its input tables stay live")
        with self._version_lock:
            new_version = self._log_and_apply(result.edit, reserved,
                                              [f.number for f in result.outputs], opened)
            with self._mu:
                self._version = new_version
                if not task.trivial_move:  # for stats()["snapshots"]: held only by old reads
                    self._tables.mark_obsolete([f.number for f in task.all_inputs])
                self._births.compacted(task, result.outputs, time.monotonic())
                self._publish()
                self.counters.note_compaction(task, result, time.perf_counter() - t0)
                self._bg_cv.notify_all()
        self._unreserve(reserved)
        self._unreserve(f.number for f in result.outputs)
        if not task.trivial_move:
            for f in task.all_inputs:
                self._remove_file(filenames.table_file_name(self.path, f.number))

    def _check_open_for_compaction(self) -> None:
        with self._mu:
            self._check_writable()
