"""Read-only open: ``DB.open(path, read_only=True, ...)`` (RocksDB's ``OpenForReadOnly``).

For a command that only reads a stopped DB (``sievekv cluster reshard`` reading the old shards)
and must leave it exactly as it was, also when it then refuses.

Contract:

- ``LOCK``, if present, is opened read-only and flock'ed as by a normal open, so a process
  that has the DB open makes this open fail with LockedError, and nobody opens it for writing
  meanwhile. A directory without ``LOCK`` (a checkpoint, a copy staged by ``cluster restore
  --no-verify``) is opened without a lock and without creating one: no process has it open
  (every writable open creates ``LOCK``), but a writer that opens it meanwhile is not kept
  out, so a caller that needs that holds its own lock (``cluster reshard`` holds the
  cluster's). Nothing at all is created, not even ``LOCK``.
- ``CURRENT`` must exist (InvalidArgumentError "holds no DB" otherwise: nothing is created).
- The manifest is read (:meth:`Manifest.recover` with ``read_only=True``): no new manifest,
  no ``CURRENT`` switch, no append.
- Every log numbered >= the manifest's log number is replayed, oldest first, into ONE memtable
  (a torn last record dropped, damage before the tail CorruptionError, as engine/recovery.py).
  Nothing is written to a table, no new log is started, nothing is synced, no file is removed:
  every file's bytes and mtime stay as they were. The memtable holds all the logs' writes, so
  the memory used is about the size of the unflushed writes (a DB closed cleanly has at most a
  memtable's worth).
- No flush or compaction thread runs (the table set's unref thread does, engine/table_set.py:
  it only closes tables a read state no longer lists; ``close()`` joins it). Reads (get,
  multi_get, scan, verify, stats) work as usual; put, delete, write, flush, compact and
  checkpoint raise :class:`ReadOnlyError`.
- ``close()`` releases the tables, the manifest and the lock; it writes nothing.

Only the thread that calls ``open`` runs the recovery, before the DB is shared.
"""

from __future__ import annotations

import errno
import threading

from . import filenames
from .errors import InvalidArgumentError, StorageIOError, release_all
from .manifest import Manifest
from .memtable import MemTable
from .recovery import RecoveredState, new_records
from .wal import read_log


class _NoLock:
    """The lock of a directory without ``LOCK`` (module docstring): nothing to release."""

    def release(self) -> None:
        pass


class ReadOnlyError(InvalidArgumentError):
    """A write, flush, compaction or checkpoint asked of a DB opened with ``read_only=True``."""


def recover_read_only(fs, path: str) -> RecoveredState:
    """Lock ``path`` and rebuild its state without writing (module docstring). The returned
    state's ``log`` is None. On failure nothing is left locked or open."""
    if not fs.exists(filenames.current_file_name(path)):
        raise InvalidArgumentError(f"{path} holds no DB (no {filenames.CURRENT}; read_only=True "
                                   f"creates nothing)")
    try:
        lock = fs.lock(filenames.lock_file_name(path), create=False)
    except StorageIOError as exc:
        if exc.errno != errno.ENOENT:
            raise
        lock = _NoLock()
    try:
        manifest = Manifest.recover(fs, path, read_only=True)
        try:
            mem, last_seq, replayed = _replay(fs, path, manifest)
        except BaseException:
            manifest.close()
            raise
    except BaseException:
        lock.release()
        raise
    return RecoveredState(lock, manifest, None, manifest.log_number, mem, last_seq, replayed,
                          0, 0)


def _replay(fs, path: str, manifest: Manifest) -> tuple[MemTable, int, int]:
    mem = MemTable()
    last_seq = manifest.last_sequence
    replayed = 0
    newest = 0
    for _number, log_path in manifest.logs_to_replay():
        result = read_log(fs, log_path)
        # Without the writes an earlier log held (a crashed recovery's partial copy).
        for first_seq, ops, _payload in new_records(result, log_path, newest):
            mem.add(first_seq, ops)
            replayed += len(ops)
            newest = first_seq + len(ops) - 1
            last_seq = max(last_seq, newest)
    return mem, last_seq, replayed


# The DB class of a read-only open (DB.open picks it for read_only=True). Imported here, not
# by engine/db.py at module level: db.py imports this module only inside DB.open.
from .db import DB  # noqa: E402
from .errors import ClosedError  # noqa: E402


class ReadOnlyDB(DB):
    """A DB opened with ``read_only=True`` (module docstring). Thread safe for reads."""

    def _recover(self, fs, path: str, opts):
        return recover_read_only(fs, path)

    def _start_background(self, path: str) -> None:
        self._threads = []  # nothing is flushed or compacted

    def _refuse(self, what: str):
        if self._rs is None:
            raise ClosedError("DB is closed")
        raise ReadOnlyError(f"{self.path} is open read-only: {what} is not allowed")

    def put(self, key, value, sync=None, *, timeout=None):
        self._refuse("put")

    def delete(self, key, sync=None, *, timeout=None):
        self._refuse("delete")

    def write(self, batch, sync=None, *, timeout=None):
        self._refuse("write")

    def flush(self):
        self._refuse("flush")

    def compact(self):
        self._refuse("compact")

    def checkpoint(self, dest, create_parents: bool = False):
        self._refuse("checkpoint")

    def wait_for_compactions(self, timeout=None, delayed: bool = False) -> bool:
        """Nothing is ever flushed or compacted here: True at once (ClosedError once closed)."""
        if self._rs is None:
            raise ClosedError("DB is closed")
        return True

    def close(self) -> None:
        """Release the tables, the manifest and the lock; writes nothing. Idempotent: a call
        while another thread's close() runs returns once that one has released everything."""
        with self._mu:
            closing = self._closing
            self._closing = True
            self._rs = None
        if closing:
            if self._closer is not threading.current_thread():
                self._closed.wait()
            return
        self._closer = threading.current_thread()
        try:
            release_all(self._manifest.close, self._tables.close, self._lock_file.release)
        finally:
            self._closed.set()
