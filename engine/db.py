"""``engine.DB``: the LSM key-value store of one directory.

Public API (see the README and engine/options.py for every option)::

    db = DB.open(path, **options)          # creates the directory if missing; locks it
    db.put(key, value, sync=None); db.get(key) -> bytes | None; db.delete(key, sync=None)
    db.write([(key, value_or_None), ...], sync=None)   # atomic; None deletes
    db.multi_get(keys) -> list[bytes | None]
    db.scan(start=None, end=None, limit=None)         # (key, value) in key order, end exclusive
    with db.snapshot() as snap: snap.get(key) ...    # get, multi_get, scan at one moment
    db.flush(); db.compact(); db.stats(); db.filter_report(); db.close()

Writes (engine/group_commit.py): a write is one log record, appended (and, with ``sync``,
fsynced) before it is applied to the memtable and acknowledged; concurrent writers share one
record and one fsync. Without sync a process crash loses nothing (the bytes are in the OS);
a machine crash may lose the most recent unsynced writes. With sync an acknowledged write
survives both.

The memtable is frozen when full and flushed to an L0 table by the flush thread while writes
go to a new memtable and a new log; the compaction thread keeps the levels within their
targets (engine/background.py, engine/compaction/). Tables are written by worker processes
(engine/table_workers.py) so that this CPU work does not take the GIL from gets and puts.
Writers are held to an adaptive byte rate (``delayed_write_rate``, engine/write_controller.py)
once L0 holds ``l0_slowdown_trigger`` tables and wait once it holds ``l0_stop_trigger`` or
when ``max_frozen_memtables`` are waiting for a flush; the time is counted in stats(). A write
given a ``timeout`` gives up with WriteStalledError, nothing applied, rather than wait longer
(the shard passes what is left of the call's deadline; engine/group_commit.py, "Deadlines").

Unsynced writes take a fast path when no other writer is active: they are logged and applied
under the mutex without entering the group-commit queue. The group-commit leader releases the
mutex for its I/O (the log append and fsync, and a memtable switch's new log, directory sync
and old log's fsync): the writers behind it wait in the queue, where a write's timeout holds.

Reads take no lock: they read ``self._rs``, an immutable :class:`engine.read_state.ReadState`
replaced whenever the memtable is frozen or a new version is installed.

Errors: a write whose log append fails (e.g. ENOSPC) raises StorageIOError, is not
acknowledged, and the next write starts a new log (the DB stays usable). A write too large
for one log record (4 GiB - 1 encoded, engine/wal/writer.py) is InvalidArgumentError before
it reaches the log. A failed log fsync, a failed flush or compaction, or a failed manifest
write put the DB in a *failed* state:
writes raise StorageIOError naming the first error, reads keep working, and reopening the DB
recovers everything acknowledged from the logs and tables. A full disk is the exception
(engine/background.py, "Full disk"): a flush or compaction that fails with ENOSPC or EDQUOT
while the manifest is intact is retried, and the DB takes writes again once space is back.

Locks (acquire in this order): ``_compaction_lock`` (one compaction at a time),
``_version_lock`` (computing and installing a version), ``_mu`` (memtables, sequence numbers,
the writers queue, background state).
"""

from __future__ import annotations

import math
import threading
import time
from bisect import bisect_left

from . import filenames, reports
from .background import RETRY_WAIT_S, Background
from .block_cache import BlockCache
from .compaction import full_task, pick, rewrite_tasks
from .compaction.births import Births
from .errors import (ClosedError, CorruptionError, InvalidArgumentError, ResultTooLargeError,
                     SieveError, StorageIOError, release_all)
from .filter_cap import FilterCap
from .format import KIND_DELETE, KIND_VALUE
from .group_commit import GroupCommit, Withdrawn
from .iterators import merge_newest
from .manifest import Manifest
from .memtable import MemTable
from .options import Options
from .read_state import ReadState
from .snapshot import Snapshot
from .recovery import recover
from .table_set import TableSet
from .table_writer import Cancelled
from .table_workers import shared_pool
from .write_controller import WriteController
from .write_stall import WriteStalls
from .checkpoint import checkpoint_db
from .verify import verify_db
from .vfs import FileSystem, default_fs
from .wal import LogWriter, encode_batch, encoded_size
from .wal import writer as wal_writer



def _finish_log(log: LogWriter, broken: bool) -> None:
    """End a log the DB is done with (a memtable switch, close): its CLOSED record, then fsync,
    so that damage to its last batch reads as corruption later, not as a torn tail that drops
    an acknowledged write (docs/format.md, "Record"). A broken log (a failed append) gets no
    marker: only what was written before the failure is synced. The marker is best effort: if
    appending it fails (a full disk), what was written is synced all the same and a torn marker
    reads as a torn tail. Raises StorageIOError if the fsync fails."""
    if broken:
        log.sync_what_was_written()
        return
    try:
        log.add_closed_marker()
    except SieveError:
        log.sync_what_was_written()
        return
    log.sync()

class DB(Background, WriteStalls):
    """An open sievekv database. Thread safe. Create with :meth:`open`.

    Close it (:meth:`close`, or use it as a context manager): its flush and compaction
    threads hold it, so a DB dropped without close() is not garbage-collected, and keeps its
    threads, files and directory lock (another open of the path in this process raises
    LockedError) until the process exits. A process that exits without close() loses
    nothing acknowledged: the next open recovers as after a crash.
    """

    # ------------------------------------------------------------------------------------
    # opening and closing
    # ------------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str, **options) -> "DB":
        """Open (creating if missing) the DB in ``path``. See engine/options.py for options.

        Raises LockedError if another DB holds the directory, InvalidArgumentError for a bad
        option, CorruptionError if the manifest or a log is damaged before its tail.

        ``read_only=True``: open an existing DB without writing anything, not even during
        recovery; writes, flush, compact and checkpoint then raise ReadOnlyError
        (engine/read_only.py: the contract).
        """
        if options.pop("read_only", False):
            from .read_only import ReadOnlyDB
            cls = ReadOnlyDB
        opts = Options.from_kwargs(**options)
        db = cls.__new__(cls)
        db._init(str(path), opts)
        return db

    def _init(self, path: str, opts: Options) -> None:
        self.path = path
        self.options = opts
        fs = self._fs = opts.fs if opts.fs is not None else default_fs()
        self._max_key = opts.max_key_size
        self._max_value = opts.max_value_size
        self._sync = opts.sync
        # Keys and values of up to this many bytes always fit one log record: n operations
        # hold n bytes or more (keys are not empty), so a record is at most header + nbytes x
        # (op header + 1). A larger write is checked exactly by _check_log_room.
        per_byte = encoded_size(1, 1) - encoded_size(0, 0)
        self._log_check_bytes = (wal_writer.LOG_MAX_PAYLOAD - encoded_size(0, 0)) // per_byte
        self._sentinel = b"\xff" * (opts.max_key_size + 1)  # sorts after every valid key
        self._mu = threading.Lock()
        self._bg_cv = threading.Condition(self._mu)
        self._version_lock = threading.Lock()
        self._compaction_lock = threading.Lock()
        self._gc = GroupCommit(self._mu)
        self._gc_queue = self._gc.queue  # read by the fast path: empty = no writer active
        self._rs: ReadState | None = None
        self._closing = False
        self._closed = threading.Event()  # set when close() has released everything
        self._closer: threading.Thread | None = None  # the thread running close()
        self._bg_error: BaseException | None = None
        # The failed state may be *recoverable*: a flush that failed with ENOSPC while the
        # manifest stayed writable (engine/background.py, "Full disk"). Writes are refused
        # while it lasts, each asking the flush thread for one more try; the first flush that
        # succeeds clears it.
        self._bg_recoverable = False
        self._flush_attempts = 0  # flush attempts finished, for writers waiting on a retry
        self._retry_now = False
        self._compaction_full_disk: BaseException | None = None  # the compaction thread is
        # backing off after ENOSPC (engine/background.py, "Full disk")
        self._log_broken = False
        self._log_sync_failed = False  # an fsync of the current log failed: close() must not
        # sync it again (Linux may have dropped the pages and would then report success)
        self._pending_outputs: set[int] = set()
        self.counters = reports.Counters()
        self.gets = 0
        # Open DB.snapshot()s: token -> time.monotonic() when taken (engine/snapshot.py),
        # for stats()["snapshots"]
        self._open_snapshots: dict[int, float] = {}
        self._writes = self._write_groups = self._synced_groups = 0
        self._memtable_bytes = opts.memtable_bytes
        # L0 count at which _commit must look at stalls (never, without auto compaction).
        self._l0_slowdown = (opts.l0_slowdown_trigger if not opts.disable_auto_compactions
                             else float("inf"))
        self.write_controller = WriteController(opts.delayed_write_rate, opts.slowdown_sleep_s)
        self.block_cache = BlockCache(opts.block_cache_bytes) if opts.block_cache_bytes else None
        self.filter_cap = FilterCap(opts.filter_memory_cap)
        self._tables = TableSet(fs, path, block_cache=self.block_cache, residency=self.filter_cap,
                                mmap_reads=opts.mmap_reads,
                                verify_every_read=opts.verify_every_read,
                                raise_open_file_limit=opts.raise_open_file_limit)
        # Worker processes need the real file system (a test fs cannot cross processes).
        self._pool = (shared_pool(opts.table_workers + opts.max_subcompactions - 1)
                      if opts.table_workers > 0 and type(fs) is FileSystem else None)
        state = self._recover(fs, path, opts)
        self._lock_file = state.lock
        self._manifest: Manifest = state.manifest
        self._version = state.manifest.current
        self._log: LogWriter = state.log
        self._mem = state.mem  # the last log's carried-over writes (engine/recovery.py), or empty
        self._frozen: list[MemTable] = []  # newest first
        self._last_seq = state.last_sequence
        self.counters.recovered_entries = state.replayed_entries
        self.counters.recovered_tables = state.tables_written
        try:
            self._publish()  # opens every live table: a damaged one raises here
        except BaseException:
            # Give back what recovery took (the lock first of all): a later open of this
            # directory in this process must see the damage again, not a LockedError.
            for release in (state.log and state.log.close, state.manifest.close,
                            self._tables.close, state.lock.release):
                try:
                    if release is not None:
                        release()
                except Exception:  # noqa: BLE001 - the first failure is the one to report
                    pass
            raise
        # Birth times for tombstone_compaction_delay (engine/compaction/births.py): every
        # table is open now, so its stored creation time costs a lookup.
        self._births = Births()
        self._births.at_open(self._version,
                             lambda n: self._tables.get(n).properties.creation_time,
                             time.time(), time.monotonic())
        self._start_background(path)

    def _recover(self, fs, path: str, opts: Options):
        """engine/recovery.py's RecoveredState (a read-only DB overrides this)."""
        return recover(fs, path, opts)

    def _start_background(self, path: str) -> None:
        self._threads = [threading.Thread(target=self._flush_loop, name=f"sievekv-flush {path}",
                                          daemon=True),
                         threading.Thread(target=self._compaction_loop,
                                          name=f"sievekv-compact {path}", daemon=True)]
        for t in self._threads:
            t.start()

    def close(self) -> None:
        """Wait for background work in progress, sync the log, release files and the lock.

        Idempotent: a call while another thread's close() runs returns when that one has
        released everything (the directory lock included), so the path can be opened again
        at once. Later calls on this DB raise ClosedError (a scan still running may too).
        Raises StorageIOError if the final sync of the log fails (everything is released all
        the same): unsynced writes may then be lost by a machine crash.
        """
        with self._mu:
            closing = self._closing
            self._closing = True
            self._bg_cv.notify_all()
        if closing:
            if self._closer is not threading.current_thread():  # (not from inside a close)
                self._closed.wait()
            return
        self._closer = threading.current_thread()
        try:
            self._close()
        finally:
            self._closed.set()

    def _close(self) -> None:
        if self._pool is not None:
            # A job in a worker stops now (its files are removed below); one waiting for a
            # worker sees _closing and stops waiting (engine/background.py: Cancelled).
            self._pool.cancel(self)
        for t in self._threads:
            t.join()
        with self._compaction_lock:  # a manual compact() sees _closing and stops
            pass
        with self._mu:
            # Writers queued now fail with ClosedError; wait for the one doing I/O.
            while self._gc.pending():
                self._mu.release()
                time.sleep(0.001)
                self._mu.acquire()
            rs, self._rs = self._rs, None
            log = self._log
            leftovers = [n for n in self._pending_outputs if n not in self._version.live_numbers()]
        del rs
        for n in leftovers:  # outputs of cancelled jobs (never named by the manifest)
            self._remove_file(filenames.table_file_name(self.path, n))
        # The log is synced whatever failed before (a flush, a compaction: its writes were
        # acknowledged), unless its own fsync failed: then a second fsync proves nothing.
        try:
            if not self._log_sync_failed:  # (a broken log: its records before the failed
                _finish_log(log, self._log_broken)  # append were acknowledged: synced too)
        finally:
            release_all(log.close, self._manifest.close, self._tables.close,
                        self._lock_file.release)

    def __enter__(self) -> "DB":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------------------
    # reads
    # ------------------------------------------------------------------------------------
    def get(self, key: bytes) -> bytes | None:
        """The value of ``key``, or None if absent or deleted. Lock-free.

        Hot path (readmissing): one dict lookup per memtable, then per L0 table and per level
        one bisect and the table's own filter probe; no allocation of our own.
        """
        rs = self._rs
        if rs is None:
            raise ClosedError("DB is closed")
        if type(key) is not bytes or not key or len(key) > self._max_key:
            key = self._check_key(key)
        self.gets += 1
        r = rs.mem_get(key)  # a memtable record: byte 0 is the kind (the tag's low byte)
        if r is not None:
            return None if r[0] == KIND_DELETE else r[8:]
        for get in rs.older:
            e = get(key)
            if e is not None:
                break
        else:
            for largests, smallests, gets in rs.lookup:
                i = bisect_left(largests, key)
                if smallests[i] <= key:
                    e = gets[i](key)
                    if e is not None:
                        break
            else:
                return None
        if e[1] == KIND_DELETE:
            return None
        return e[2]

    def multi_get(self, keys, max_bytes: int | None = None) -> list:
        """[get(k) for k in keys], read at one moment: a write batch applied while it runs is
        seen whole or not at all, as RocksDB's MultiGet reads one implicit snapshot.

        How: frozen memtables and tables never change, so only the active memtable can move
        under the read. Its records for every key are taken in one C call (``list(map(
        dict.get, keys))`` runs no Python code for bytes keys, so no other thread runs in the
        middle of it; a batch is stored with one ``dict.update``, engine/memtable.py), then
        the keys it does not hold are looked up in the older sources. Until session 18 each
        key was read in turn and a batch written meanwhile could be seen in part
        (tests/test_batch_visibility.py).

        ``max_bytes``: raise ResultTooLargeError as soon as the values found add up to more
        (a server answering within a message limit stops there, instead of first building an
        answer that may be many times the limit: 100 copies of a 4 MiB key took 1.7 GB).
        """
        rs = self._rs
        if rs is None:
            raise ClosedError("DB is closed")
        check = self._check_key
        maxk = self._max_key
        keys = [k if type(k) is bytes and k and len(k) <= maxk else check(k) for k in keys]
        records = list(map(rs.mem_get, keys))  # the active memtable at one moment (above)
        out = []
        append = out.append
        find = rs.find_older
        budget = max_bytes
        for key, r in zip(keys, records):
            if r is not None:
                if r[0] == KIND_DELETE:
                    append(None)
                    continue
                v = r[8:]
            else:
                e = find(key)
                if e is None or e[1] == KIND_DELETE:
                    append(None)
                    continue
                v = e[2]
            if budget is not None:
                budget -= len(v)
                if budget < 0:
                    self.gets += len(out) + 1
                    raise ResultTooLargeError(
                        f"the values found exceed {max_bytes} bytes by key {len(out) + 1} "
                        f"({max_bytes - budget} bytes); ask for fewer keys at a time")
            append(v)
        self.gets += len(out)
        return out

    def scan(self, start: bytes | None = None, end: bytes | None = None,
             limit: int | None = None):
        """Iterator of (key, value) with start <= key < end, in key order, at most ``limit``.

        A point-in-time read: the iterator returns the DB as it was when ``scan`` was called,
        whatever is written while it is read (a write batch is seen whole or not at all).
        Tables stay open, and the records that writes replace in the active memtable are
        kept, while the iterator is neither exhausted, closed nor dropped (engine/memtable.py,
        "Snapshots"); so close or drop a scan you stop reading early. Until session 18 the
        memtable was read as it was when each chunk of it was copied.
        """
        rs = self._rs
        if rs is None:
            raise ClosedError("DB is closed")
        return self._scan_of(rs, start, end, limit)

    def snapshot(self) -> Snapshot:
        """A :class:`engine.snapshot.Snapshot` of now: ``get``, ``multi_get`` and ``scan`` as
        the DB is at this moment, until it is closed (a context manager). It keeps the tables
        and memtable records of its moment: close it when done (engine/snapshot.py)."""
        rs = self._rs
        if rs is None:
            raise ClosedError("DB is closed")
        return Snapshot(self, rs)

    def _scan_of(self, rs, start, end, limit, sequence: int | None = None):
        """:meth:`scan` over the read state ``rs``, its active memtable read at a snapshot
        taken now, or at ``sequence`` (a :class:`Snapshot`'s, still open)."""
        if start is not None:
            start = self._check_key(start, allow_empty=True)
        if end is not None:
            end = self._check_key(end, allow_empty=True)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise InvalidArgumentError(f"scan limit must be None or an int >= 0, got {limit!r}")
        if (start is not None and end is not None and start >= end) or limit == 0:
            return iter(())
        it = self._scan(rs, start or None, end, limit, sequence)
        next(it)  # takes the snapshot now; from here on its finally releases it
        return it

    def _scan(self, rs, start, end, limit, sequence):
        """Newest entry per key from every source; tombstones hidden; stop at end / limit.
        (engine.iterators.live_items, inlined: one generator layer less per entry.) Yields
        None first, once the snapshot is taken (``_scan_of`` consumes it). With ``sequence``
        the scan still opens its own memtable snapshot: it keeps the records replaced since
        ``sequence`` for as long as the scan runs, even if the Snapshot that gave
        ``sequence`` is closed meanwhile (the caller holds one until this one is taken:
        ``Snapshot.scan``)."""
        mem = rs.mem
        snapshot = mem.snapshot()
        if sequence is not None:
            snapshot = sequence
        try:
            yield None
            n = 0
            for key, _seq, kind, value in merge_newest(rs.sources(start, end, snapshot)):
                if end is not None and key >= end:
                    return
                if kind == KIND_DELETE:
                    continue
                if self._rs is None:
                    raise ClosedError("DB was closed during the scan")
                yield key, value
                n += 1
                if n == limit:
                    return
        finally:
            mem.release()

    # ------------------------------------------------------------------------------------
    # writes
    # ------------------------------------------------------------------------------------
    def put(self, key: bytes, value: bytes, sync: bool | None = None, *,
            timeout: float | None = None) -> None:
        """Set ``key`` to ``value``. Returns once logged (and fsynced if sync).

        ``timeout`` (seconds; every write takes it): wait at most this long for room while
        writes are held (a write stall: L0 or the frozen memtables at their limit, or writes
        held to ``delayed_write_rate``), or in the write queue behind slower writes (a slow
        fsync), else raise WriteStalledError with nothing applied. A write that a group
        commit has taken, or that finds room, is applied, however late. None (or a timeout
        of threading.TIMEOUT_MAX or more): wait as long as it takes.
        """
        if type(key) is not bytes or not key or len(key) > self._max_key:
            key = self._check_key(key)
        if type(value) is not bytes or len(value) > self._max_value:
            value = self._check_value(value)
        self._write([(KIND_VALUE, key, value)], len(key) + len(value), sync, timeout)

    def delete(self, key: bytes, sync: bool | None = None, *,
               timeout: float | None = None) -> None:
        """Delete ``key`` (a tombstone; deleting an absent key is not an error)."""
        if type(key) is not bytes or not key or len(key) > self._max_key:
            key = self._check_key(key)
        self._write([(KIND_DELETE, key, b"")], len(key), sync, timeout)

    def write(self, batch, sync: bool | None = None, *, timeout: float | None = None) -> None:
        """Apply ``batch`` = iterable of (key, value) atomically; value None deletes the key.

        All or nothing, also across a crash (one log record), and for readers: once a read
        has returned one of its writes, every later read sees all of them, or newer ones (the
        memtable stores a batch in one step, engine/memtable.py). Later pairs win over
        earlier pairs for the same key.
        """
        ops = []
        nbytes = 0
        for pair in batch:
            try:
                key, value = pair
            except (TypeError, ValueError):
                raise InvalidArgumentError(f"batch items must be (key, value) pairs, got {pair!r}") from None
            key = self._check_key(key)
            if value is None:
                ops.append((KIND_DELETE, key, b""))
                nbytes += len(key)
            else:
                value = self._check_value(value)
                ops.append((KIND_VALUE, key, value))
                nbytes += len(key) + len(value)
        if ops:
            self._write(ops, nbytes, sync, timeout)
        elif self._rs is None:
            raise ClosedError("DB is closed")

    def _write(self, ops: list, nbytes: int, sync, timeout=None) -> None:
        if nbytes > self._log_check_bytes:  # one compare on the hot path
            self._check_log_room(ops, nbytes)
        deadline = None if timeout is None else self._deadline(timeout)
        if sync is None:
            sync = self._sync
        if not sync:
            # Fast path for an unsynced write when no other writer is queued or writing and
            # no memtable switch or stall is due: log and apply it under the mutex, skipping
            # the group-commit queue (other writers wait on the mutex meanwhile). A synced
            # write always queues, so that concurrent synced writers share one fsync.
            mu = self._mu
            mu.acquire()
            try:
                if (not self._gc_queue and not self._log_broken and self._bg_error is None
                        and not self._closing
                        and self._mem.approximate_bytes < self._memtable_bytes
                        and len(self._version.levels[0]) < self._l0_slowdown):
                    seq = self._last_seq + 1
                    payload = encode_batch(seq, ops)
                    self._last_seq = seq + len(ops) - 1  # burnt even if the append fails
                    try:
                        self._log.add_record(payload)
                    except InvalidArgumentError:  # too large: raised before any I/O
                        raise
                    except BaseException:
                        self.counters.log_errors += 1
                        self._log_broken = True  # the next write switches to a new log
                        raise
                    self._mem.add(seq, ops)
                    self._writes += 1
                    self._write_groups += 1
                    return
            finally:
                mu.release()
        if self._closing:
            raise ClosedError("DB is closed")
        try:
            self._gc.write(ops, bool(sync), nbytes, self._commit, deadline=deadline,
                           prepare=self._prepare_commit)
        except Withdrawn:  # its deadline passed, in the queue or waiting for room
            raise self._stalled(timeout) from None

    def _commit(self, group) -> None:
        """Group-commit leader: log, sync, apply; room was made by _prepare_commit, under the
        mutex held since. REQUIRES: self._mu held (released for I/O)."""
        if len(group) == 1:
            w = group[0]
            ops = w.ops
            sync = w.sync
        else:
            ops = [op for w in group for op in w.ops]
            sync = group[0].sync
        seq = self._last_seq + 1
        # Burn the numbers even on failure: the record may reach the file.
        self._last_seq = seq + len(ops) - 1
        log = self._log
        mem = self._mem
        mu = self._mu
        failure = None
        mu.release()
        try:
            payload = encode_batch(seq, ops)
            failure = "append"
            log.add_record(payload)
            if sync:
                failure = "sync"
                log.sync()
            failure = None
            mem.add(seq, ops)
        except BaseException as exc:
            mu.acquire()
            # An InvalidArgumentError from add_record (a group too large for one record; each
            # write alone was checked by _check_log_room) is raised before any I/O.
            if failure is not None and not isinstance(exc, InvalidArgumentError):
                self.counters.log_errors += 1
                if failure == "append":
                    self._log_broken = True  # the next write switches to a new log
                else:
                    self._log_sync_failed = True
                    self._set_bg_error(exc)
                    if isinstance(exc, StorageIOError):  # only a reopen ends this failure
                        exc.retryable = False
            raise
        mu.acquire()
        self._writes += len(group)
        self._write_groups += 1
        if sync:
            self._synced_groups += 1

    def _check_log_room(self, ops: list, nbytes: int) -> None:
        """Refuse a write too large for one log record, before it is encoded or logged: a
        caller's error (InvalidArgumentError), not a log failure."""
        size = encoded_size(len(ops), nbytes)
        limit = wal_writer.LOG_MAX_PAYLOAD
        if size > limit:
            raise InvalidArgumentError(
                f"write of {len(ops)} operations is {size} bytes as a log record, over the "
                f"write-ahead log's record limit of {limit} bytes; split it into smaller batches")

    def _set_bg_error(self, exc: BaseException, recoverable: bool = False) -> bool:
        """Enter the failed state with ``exc``, unless already failed (a fatal error replaces
        a recoverable one). True if ``exc`` is now the DB's error. REQUIRES: self._mu held."""
        if self._bg_error is None or (self._bg_recoverable and not recoverable):
            self._bg_error = exc
            self._bg_recoverable = recoverable
            return True
        return False

    def _check_writable(self, until: float | None = None) -> None:
        """Raise unless writes are allowed. In a recoverable failed state (a full disk), first
        ask the flush thread for one more try and wait for it (at most RETRY_WAIT_S, and not
        past ``until``, a write's deadline): a write made once space is back succeeds.
        REQUIRES: self._mu held (released while waiting)."""
        if self._closing:
            raise ClosedError("DB is closed")
        if self._bg_error is not None and self._bg_recoverable:
            attempt = self._flush_attempts
            self._retry_now = True
            self._bg_cv.notify_all()
            deadline = time.monotonic() + RETRY_WAIT_S
            if until is not None:
                deadline = min(deadline, until)
            while (self._bg_error is not None and self._bg_recoverable and not self._closing
                   and self._flush_attempts == attempt):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._bg_cv.wait(left)
            if self._closing:
                raise ClosedError("DB is closed")
        if self._bg_error is not None:
            err = self._bg_error
            if self._bg_recoverable:
                raise StorageIOError(f"DB refuses writes until a flush succeeds ({err}); it "
                                     "retries by itself, and with each write", path=self.path,
                                     errno_=getattr(err, "errno", None)) from err
            raise StorageIOError(f"DB refuses writes after an earlier failure ({err}); reopen it "
                                 "to recover", path=self.path,
                                 errno_=getattr(err, "errno", None), retryable=False) from err

    def _switch_memtable(self) -> None:
        """Freeze the memtable, start a new one with a new log.

        REQUIRES: self._mu held, by the group-commit leader (engine/write_stall.py is the
        only caller, from a leader's ``prepare`` or a flush's solo ``commit``). The mutex is
        released for the I/O (create the new log, sync the directory, end and fsync the old
        log: ~2 ms, unbounded on a stuck disk), as ``_commit`` releases it: nothing it reads
        can change meanwhile, since writers wait in the queue behind the leader (the
        unsynced fast path needs an empty queue), and close() waits for the queue to empty.
        So a write with a timeout gives up in the queue at its deadline instead of waiting
        for the fsync on the mutex (session 20 review), and the flush and compaction threads
        are not held up by it.
        """
        number = self._manifest.new_file_number()
        path = filenames.log_file_name(self.path, number)
        old = self._log
        broken = self._log_broken
        # A log whose append failed before any write reached this memtable holds no
        # acknowledged write (a write enters the memtable only once its record is in the
        # log): it is replaced alone, not frozen. Frozen, the empty memtable's flush was a
        # manifest edit with nothing to write, and a full disk failing that edit made the DB
        # refuse writes until reopened, when space came back (session 20 review).
        empty = len(self._mem) == 0
        mu = self._mu
        failure = None
        close_failed = False
        mu.release()
        try:
            new_log = LogWriter(self._fs.open_writable(path))
            try:
                self._fs.sync_dir(self.path)  # synced writes in the new log need its name durable
            except BaseException:
                new_log.close()
                self._fs.remove(path)
                raise
            try:
                # Keep recovery a prefix: no older log may end unsynced. A broken log (failed
                # append) is synced too: its earlier records were acknowledged, and a synced
                # write in the new log must not survive a power loss that drops them.
                _finish_log(old, broken)
            except SieveError as exc:
                failure = exc
            try:
                old.close()
            except SieveError:
                # close(2) frees the descriptor even when it reports an error (EIO on NFS):
                # the switch goes on. After a good fsync the records are durable; after a
                # failed one the DB enters its failed state below either way (review 21:
                # raising here lost the fsync's failure, and left the closed log current).
                close_failed = True
            if empty:
                self._remove_file(filenames.log_file_name(self.path, self._mem.log_number))
        finally:
            mu.acquire()
        if close_failed:
            self.counters.log_errors += 1
        if failure is not None:
            self._set_bg_error(failure)
        self._log_broken = False
        self._log_sync_failed = False
        if not empty:
            self._mem.freeze()
            self._frozen.insert(0, self._mem)
        self._mem = MemTable(number)
        self._log = new_log
        self._publish()
        self._bg_cv.notify_all()

    def _publish(self) -> None:
        """Build and publish a new read state. REQUIRES: self._mu held (or not yet shared)."""
        self._rs = ReadState.build(self._mem, tuple(self._frozen), self._version, self._tables,
                                   self._sentinel)

    # ------------------------------------------------------------------------------------
    # flush
    # ------------------------------------------------------------------------------------
    def flush(self) -> None:
        """Freeze the memtable (if not empty) and wait until it, and every memtable frozen
        before it, is in L0. Memtables frozen later by other writers are not waited for (under
        a steady stream of writes, "until none is frozen" could wait for ever).

        Raises if the DB fails meanwhile: CorruptionError when the flush of this memtable (or
        an older one) failed with one (its table failed its check, engine/output_check.py),
        else the StorageIOError that refuses writes (naming the DB's error)."""
        with self._mu:
            self._check_writable()
        # Enter as a writer so the switch is ordered with concurrent writes.
        self._gc.write([], False, 0, self._force_switch, solo=True)
        with self._mu:
            # Newest first, flushed oldest first: once this one is gone, so are older ones.
            target = self._frozen[0] if self._frozen else None
            while target is not None and any(m is target for m in self._frozen):
                err = self._flush_failure
                if isinstance(err, CorruptionError) and not self._closing:
                    # A flush this one waits for met damage (flushes run oldest first and stop
                    # at a failure): say so as compact() does (DATA_LOSS through a shard), not
                    # as the refusal of a write. Another job's damage is the refusal's cause.
                    raise CorruptionError(err.message, path=err.path,
                                          offset=err.offset) from err
                self._check_writable()
                self._bg_cv.wait(0.5)

    def _force_switch(self, group) -> None:
        self._make_room_for_write(force=True)

    # ------------------------------------------------------------------------------------
    # compaction
    # ------------------------------------------------------------------------------------
    def compact(self) -> None:
        """Flush, then merge every level into one: the deepest level holding data, or a
        deeper one if the data exceeds that level's target (so no automatic compaction is
        needed afterwards). Tombstones are dropped there. One pass: each entry is rewritten
        once. Then the tables still written with another ``compression`` than the DB's
        (a setting changed since they were written), or still holding tombstones, are
        rewritten in place at their level (picker.rewrite_tasks), so compact() also moves a
        DB to its setting, "none" included (docs/format.md, "Versions": going back to a
        version before table format 3), and drops the tombstones of a DB that background
        compactions had already left in one level (a table can reach the last level by a
        trivial move, tombstones and all; the merge into it then has nothing to do). A DB
        already in one level with every table matching the setting and no tombstone rewrites
        nothing. Waits until done."""
        self.flush()
        with self._compaction_lock:
            self._check_open_for_compaction()
            task = full_task(self._version, self.options)
            if task is not None:
                self._run_manual_task(task)
            for task in rewrite_tasks(self._version, self._to_rewrite):
                self._check_open_for_compaction()
                self._run_manual_task(task)

    def _to_rewrite(self, f) -> bool:
        """Whether compact() rewrites the live table ``f`` in place after its full merge:
        written with another codec, or holding tombstones (after the merge every table is in
        one level, bottommost, so a rewrite drops them)."""
        return f.num_deletions > 0 or self._written_with_another_codec(f)

    def _written_with_another_codec(self, f) -> bool:
        """Whether the live table ``f`` (FileMeta) was written with another compression than
        the DB's now: any compressed block when the setting is "none" (a table written with
        "lz4" whose blocks all stayed raw is what "none" writes), else another setting."""
        p = self._tables.get(f.number).properties
        want = self.options.compression
        return p.compressed_data_blocks > 0 if want == "none" else p.compression != want

    def _run_manual_task(self, task) -> None:
        """Run a task of compact(). REQUIRES: _compaction_lock held."""
        try:
            self._run_task(task, manual=True)
        except Cancelled:  # close() stopped the job (in a table worker)
            raise ClosedError("DB is closed") from None
        except SieveError as exc:
            # As for a background compaction: a failure the DB cannot retry (a manifest
            # write, corruption) puts it in its failed state, so the next write is
            # refused with this cause instead of failing later, away from it.
            if not isinstance(exc, ClosedError) and not self._full_disk(exc):
                with self._mu:
                    if self._set_bg_error(exc):
                        self.counters.background_errors += 1
                    self._bg_cv.notify_all()
                if isinstance(exc, StorageIOError):  # only a reopen ends this failure
                    exc.retryable = False
            raise

    def wait_for_compactions(self, timeout: float | None = None, delayed: bool = False) -> bool:
        """Wait until background work is done (RocksDB's WaitForCompact): no memtable waiting
        for its flush, no compaction running, none due (the picker returns None: every level
        within its target and no table dense enough in tombstones, engine/compaction/picker.py)
        and no compaction backing off after a full disk. A tombstone compaction that
        ``tombstone_compaction_delay`` still holds back is not due, unless ``delayed``: then
        it is waited for too (it runs about the delay after its tables last changed; an idle
        DB giving its space back). With ``disable_auto_compactions`` no compaction is ever
        due. Returns True then; False after ``timeout`` seconds (None: no limit) or when the
        DB is in its failed state. Raises ClosedError if it closes. Writes made meanwhile by
        other threads can keep it waiting (until ``timeout``)."""
        end = None if timeout is None else time.monotonic() + timeout
        opts = self.options
        with self._mu:
            while True:
                if self._closing:
                    raise ClosedError("DB is closed")
                if self._bg_error is not None and not self._bg_recoverable:
                    return False
                # delayed: as if every delay had passed (now = +inf).
                now = math.inf if delayed else time.monotonic()
                due = (not opts.disable_auto_compactions
                       and pick(self._version, opts, now, self._births) is not None)
                if (not due and not self._frozen and self._running is None
                        and self._compaction_full_disk is None):
                    return True
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                # _running is cleared outside the mutex: poll as well as wait for a notify.
                self._bg_cv.wait(0.05 if left is None else min(0.05, left))

    def verify(self) -> dict:
        """Check every checksum of every live table, reading each file again (engine/verify.py:
        what is covered, the report's fields). Damage is listed in the report, not raised;
        reads and writes go on meanwhile. ``stats()["verify_running"]`` shows progress."""
        return verify_db(self)

    def checkpoint(self, dest, create_parents: bool = False) -> dict:
        """Write a consistent copy of the DB to the new directory ``dest``, openable with
        ``DB.open`` (engine/checkpoint.py: steps, costs, what it does not protect against).
        Flushes first; reads and writes go on meanwhile. Tables are hard-linked where the file
        system allows, else copied. Returns what it wrote (tables, bytes, linked, copied,
        last_sequence, seconds). ``create_parents``: create missing parent directories
        instead of refusing."""
        return checkpoint_db(self, dest, create_parents)

    # ------------------------------------------------------------------------------------
    # reports and helpers
    # ------------------------------------------------------------------------------------
    def stats(self) -> dict:
        """Levels, memtables, logs, compactions, stalls, cache and read counters (JSON-able)."""
        return reports.stats(self)

    def filter_report(self) -> dict:
        """Per level and per table filter accounting, budget and cap sections (JSON-able)."""
        return reports.filter_report(self)

    def _check_key(self, key, allow_empty: bool = False) -> bytes:
        if type(key) is not bytes:
            if not isinstance(key, (bytearray, memoryview)):
                raise InvalidArgumentError(f"keys must be bytes, got {type(key).__name__}")
            key = bytes(key)
        if not key and not allow_empty:
            raise InvalidArgumentError("empty key")
        if len(key) > self._max_key:
            raise InvalidArgumentError(
                f"key of {len(key)} bytes is over the max_key_size limit ({self._max_key} bytes)")
        return key

    def _check_value(self, value) -> bytes:
        if type(value) is not bytes:
            if not isinstance(value, (bytearray, memoryview)):
                raise InvalidArgumentError(f"values must be bytes, got {type(value).__name__}")
            value = bytes(value)
        if len(value) > self._max_value:
            raise InvalidArgumentError(
                f"value of {len(value)} bytes is over the max_value_size limit "
                f"({self._max_value} bytes)")
        return value
