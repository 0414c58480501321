"""The open tables of one DB, by file number, with reference counts.

A table is opened (metadata only: engine/sstable reads the footer, index and filter index) the
first time a read state needs it, or before: a flush or compaction opens its new tables before
their version is published (engine/background.py ``_open_outputs``), outside the DB mutex.
Between that open and the publish the table is open with no reference and listed by no read
state; an :meth:`unref` of it (what a failed manifest edit does) closes it. Every
:class:`engine.read_state.ReadState` holds one
reference to each table it lists; the DB's current read state therefore keeps every live
table open, and a table that compaction removed stays open until the last read state that
lists it is gone (a ``get`` or ``scan`` still running on it). Its file may already be
deleted: POSIX keeps an open (or mapped) file readable after unlink.

Counters of closed tables (data blocks read, filter probes...) are folded into ``retired`` so
the DB's statistics stay cumulative.

Thread safety: all methods take one internal lock; the table objects themselves are safe for
concurrent readers.

Releasing references never blocks the caller: :meth:`release_later` (what a read state's
finalizer calls) only puts the numbers on a ``queue.SimpleQueue`` (reentrant by design) and a
small thread of this set does the :meth:`unref`. A finalizer may run anywhere: the cyclic GC
runs it in whatever thread allocates when a collection is due, possibly one that holds this
set's lock (or the filter cap's) at that moment; unref there would wait for a lock its own
thread holds, forever.
"""

from __future__ import annotations

import errno
import logging
import queue
import threading

from .errors import CorruptionError, StorageIOError, release_all
from .filenames import table_file_name
from .open_files import Headroom, soft_limit
from .sstable import Table

log = logging.getLogger(__name__)

_RETIRED_KEYS = ("data_blocks_read", "map_failures", "filter_positives", "filter_negatives",
                 "filter_true_positives", "filter_errors")


def _counter(t, key: str) -> int:
    """Table ``t``'s counter ``key`` (filter_* from its filter; 0 for a table without one)."""
    if key.startswith("filter_"):
        f = getattr(t, "_filter", None)
        return getattr(f, key[7:] if key != "filter_errors" else key, 0) if f is not None else 0
    return getattr(t, key, 0)


class TableSet:
    """Open tables keyed by file number, closed when their last reference goes."""

    def __init__(self, fs, dirname: str, *, block_cache=None, residency=None,
                 mmap_reads: bool = False, verify_every_read: bool = True,
                 raise_open_file_limit: bool = False):
        self._fs = fs
        self._mmap_reads = mmap_reads
        self._verify_every_read = verify_every_read
        self._dirname = dirname
        self._block_cache = block_cache
        self._residency = residency
        self._lock = threading.Lock()
        self._tables: dict[int, object] = {}
        self._refs: dict[int, int] = {}
        self._obsolete: set[int] = set()  # open, but no longer in the version (mark_obsolete)
        self._closed = False
        self.retired = {k: 0 for k in _RETIRED_KEYS}
        self._headroom = Headroom(raise_open_file_limit)
        self.opened = 0
        self._released: queue.SimpleQueue = queue.SimpleQueue()
        self._releaser: threading.Thread | None = None  # started by the first ref()

    def get(self, number: int, *, listed: bool = True):
        """The open table for file ``number`` (opened now if needed; no reference taken).
        ``listed``: the current version lists it (False: a new output, not yet installed),
        which only changes the message if its file is missing."""
        with self._lock:
            t = self._tables.get(number)
            if t is not None:
                return t
        path = table_file_name(self._dirname, number)
        self._headroom.opening()
        limit_before = soft_limit()
        try:
            try:
                t = self._open_table(path, number)
            except StorageIOError as exc:
                if (exc.errno not in (errno.EMFILE, errno.ENFILE)
                        or not self._headroom.retry_after_emfile(limit_before)):
                    raise
                t = self._open_table(path, number)
        except StorageIOError as exc:
            self._headroom.closed()
            if exc.errno == errno.ENOENT:  # the version names it: the DB lost a file
                raise CorruptionError("a table the manifest lists is missing" if listed
                                      else "the new table's file is missing",
                                      path=path) from None
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                # Every table stays open (RocksDB's default, max_open_files = -1): say so.
                with self._lock:
                    n = len(self._tables)
                limit = soft_limit()
                how = ("raise the hard open-file limit (ulimit -Hn, or LimitNOFILE= under "
                       "systemd: the DB raises the soft limit up to it by itself)"
                       if self._headroom.enabled else
                       "raise the open-file limit (ulimit -n), or open the DB with "
                       "raise_open_file_limit=True")
                raise StorageIOError(
                    f"too many open files with {n} tables open (each holds up to 3 "
                    "descriptors: the file and its data and filter mappings; the limit is "
                    f"{'unlimited' if limit is None else limit}); {how}", path=path,
                    errno_=exc.errno) from exc
            raise
        except BaseException:
            self._headroom.closed()
            raise
        with self._lock:
            have = self._tables.get(number)
            if have is not None:  # another thread opened it meanwhile
                try:
                    t.close()
                finally:
                    self._headroom.closed()
                return have
            self._tables[number] = t
            self._refs.setdefault(number, 0)
            self.opened += 1
            return t

    def ref(self, numbers) -> None:
        if self._releaser is None:
            self._start_releaser()
        with self._lock:
            refs = self._refs
            for n in numbers:
                refs[n] = refs.get(n, 0) + 1

    def release_later(self, numbers) -> None:
        """Drop one reference to each table soon, on this set's own thread. Never blocks and
        takes no lock: safe from a finalizer (see the module docstring)."""
        self._released.put(numbers)

    def _start_releaser(self) -> None:
        with self._lock:
            if self._releaser is not None or self._closed:
                return
            self._releaser = threading.Thread(target=self._release_loop, daemon=True,
                                              name=f"sievekv-unref {self._dirname}")
            self._releaser.start()

    def _release_loop(self) -> None:
        get = self._released.get
        while True:
            numbers = get()
            if numbers is None:
                return
            try:
                self.unref(numbers)
            except Exception:  # noqa: BLE001 - a failed close must not end the releases
                log.warning("%s: closing a released table failed", self._dirname,
                            exc_info=True)

    def unref(self, numbers) -> None:
        """Drop one reference to each table; close those left without any. Every one of them
        is closed even if closing one raises; the first error is raised after."""
        to_close = []
        with self._lock:
            if self._closed:
                return
            refs = self._refs
            for n in numbers:
                left = refs.get(n, 0) - 1
                if left > 0:
                    refs[n] = left
                    continue
                refs.pop(n, None)
                self._obsolete.discard(n)
                t = self._tables.pop(n, None)
                if t is not None:
                    self._retire_locked(t)
                    to_close.append(t)
        first = None
        for t in to_close:
            try:
                self._close_table(t)
            except BaseException as exc:  # noqa: BLE001 - the rest are closed, then raised
                first = first or exc
        if first is not None:
            raise first

    def _retire_locked(self, t) -> None:
        """Add a table's counters to ``retired`` as it leaves ``_tables`` (under the lock, so
        :meth:`counter_total` counts every table exactly once)."""
        for k in _RETIRED_KEYS:
            self.retired[k] += _counter(t, k)

    def counter_total(self, key: str) -> int:
        """``key`` (one of ``_RETIRED_KEYS``) summed over the open tables and those closed."""
        with self._lock:
            return self.retired[key] + sum(_counter(t, key) for t in self._tables.values())

    def _open_table(self, path: str, number: int):
        return Table.open(self._fs, path, file_number=number, block_cache=self._block_cache,
                          residency=self._residency, mmap_reads=self._mmap_reads,
                          verify_every_read=self._verify_every_read)

    def _close_table(self, t) -> None:
        forget = getattr(self._residency, "forget_table", None)
        if forget is not None:
            forget(t)
        try:
            t.close()
        finally:
            self._headroom.closed()

    def mark_obsolete(self, numbers) -> None:
        """Tables ``numbers`` left the DB's version (a compaction's inputs): from now on they
        stay open only for older reads, and :meth:`held_obsolete` lists them until then."""
        with self._lock:
            self._obsolete.update(n for n in numbers if n in self._tables)

    def held_obsolete(self) -> list:
        """The tables compacted away that older reads (snapshots, scans, gets in flight)
        still keep open, their files already deleted or about to be."""
        with self._lock:
            return [self._tables[n] for n in self._obsolete]

    def open_tables(self) -> dict[int, object]:
        """A copy of {file number: table} for the tables open now."""
        with self._lock:
            return dict(self._tables)

    def close(self) -> None:
        """Close every table (DB close). Later unref calls do nothing."""
        with self._lock:
            self._closed = True
            tables = list(self._tables.values())
            for t in tables:
                self._retire_locked(t)
            self._tables.clear()
            self._refs.clear()
            self._obsolete.clear()
        # Every table is closed and the releaser joined even if one close raises.
        release_all(*(lambda t=t: self._close_table(t) for t in tables), self._stop_releaser)

    def _stop_releaser(self) -> None:
        releaser = self._releaser
        if releaser is not None and releaser is not threading.current_thread():
            self._released.put(None)
            releaser.join()
