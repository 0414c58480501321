"""The one file-system layer that every engine file operation goes through.

LevelDB has ``Env``, Pebble has ``vfs.FS``; this is ours. Tables, the write-ahead log, the
manifest and the lock file all take a :class:`FileSystem`, so tests can substitute
:class:`engine.faultfs.FaultInjectionFS` to drop unsynced data, fail writes with ENOSPC or
fail fsync, and then prove that recovery loses nothing that was acknowledged.

Every call that touches the OS converts ``OSError`` into :class:`StorageIOError` naming the
path. Counters (``bytes_read``, ``read_calls``, ...) let benchmarks and tests measure exactly
how much a code path read.

Thread safety: a :class:`FileSystem` may be shared by many threads. A :class:`WritableFile`
must be used by one thread at a time (callers hold their own lock); a
:class:`RandomAccessFile` may be read by many threads at once (``os.pread`` is positional).
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import threading
from dataclasses import dataclass, field

from .errors import ClosedError, LockedError, StorageIOError

PAGE_SIZE = mmap.PAGESIZE
_FADV_DONTNEED = getattr(os, "POSIX_FADV_DONTNEED", None)  # None: no posix_fadvise here


def _io_error(exc: OSError, what: str, path: str) -> StorageIOError:
    return StorageIOError(f"{what} failed ({exc.strerror or exc})", path=path, errno_=exc.errno)


@dataclass
class IOCounters:
    """Cumulative I/O done through one FileSystem. Updated without a lock: good enough for
    statistics, exact in single-threaded tests and benchmarks."""

    read_calls: int = 0
    bytes_read: int = 0
    write_calls: int = 0
    bytes_written: int = 0
    syncs: int = 0
    maps: int = 0
    opens: dict = field(default_factory=dict)

    def snapshot(self) -> dict:
        return {
            "read_calls": self.read_calls,
            "bytes_read": self.bytes_read,
            "write_calls": self.write_calls,
            "bytes_written": self.bytes_written,
            "syncs": self.syncs,
            "maps": self.maps,
        }


class WritableFile:
    """An append-only file. ``append`` buffers in the OS; ``sync`` makes it durable (fsync).

    REQUIRES: one thread at a time.
    """

    def __init__(self, fs: "FileSystem", path: str, fd: int, size: int = 0):
        self._fs = fs
        self.path = path
        self._fd = fd
        self.size = size
        self.closed = False

    def append(self, data) -> None:
        if self.closed:  # (an empty append too: os.write is never reached for it)
            raise self._closed_error("write")
        mv = memoryview(data)
        try:
            while mv:
                n = os.write(self._fd, mv)
                mv = mv[n:]
                self.size += n
        except OSError as exc:
            raise _io_error(exc, "write", self.path) from exc
        c = self._fs.counters
        c.write_calls += 1
        c.bytes_written += len(data)

    def start_writeback(self, offset: int, length: int) -> None:
        """Ask the OS to start writing ``[offset, offset + length)`` to the disk now, without
        waiting for it (RocksDB's ``wal_bytes_per_sync``), so that a later :meth:`sync` has
        little left to write. Advice only: nothing is durable until ``sync`` returns, and a
        failure is ignored. Linux starts the writeback on ``POSIX_FADV_DONTNEED`` (and drops
        the range's pages from the page cache once clean: written-ahead data is not read
        back). One cost: if that writeback fails (a disk error), Linux marks the pages clean
        anyway, and dropping them loses bytes a process restart could otherwise still have
        read from the page cache; the kernel may evict clean pages at any time, so no
        guarantee changes, and the fsync that follows reports the error."""
        if _FADV_DONTNEED is None:
            return
        try:
            os.posix_fadvise(self._fd, offset, length, _FADV_DONTNEED)
        except (OSError, ValueError):  # (ValueError: closed)
            pass

    def flush(self) -> None:
        """Nothing is buffered in user space; present for API symmetry."""

    def sync(self) -> None:
        try:
            os.fsync(self._fd)
        except OSError as exc:
            raise _io_error(exc, "fsync", self.path) from exc
        except ValueError:  # the descriptor is -1: closed
            raise self._closed_error("fsync") from None
        self._fs.counters.syncs += 1

    def _closed_error(self, op: str) -> StorageIOError:
        return _io_error(OSError(errno.EBADF, f"{op} on a closed file"), op, self.path)

    def close(self) -> None:
        """Close the file (idempotent). The descriptor is gone even if close reports an error:
        later appends and syncs fail with EBADF instead of reaching whichever file reuses
        its number (review 21: a closed log's fsync "succeeded" on the next log)."""
        if not self.closed:
            self.closed = True
            fd, self._fd = self._fd, -1
            try:
                os.close(fd)
            except OSError as exc:
                raise _io_error(exc, "close", self.path) from exc

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class RandomAccessFile:
    """A read-only file read with positional reads; safe for concurrent readers, and against
    a :meth:`close` racing them: the descriptor is closed only once no read or map is using
    it, so a read in flight never reaches another file that reused the number (it completes
    on this file), and a read started after close raises ClosedError."""

    def __init__(self, fs: "FileSystem", path: str, fd: int, size: int):
        self._fs = fs
        self.path = path
        self._fd = fd
        self.size = size
        self.closed = False
        self._mu = threading.Lock()
        self._users = 0  # reads and maps using the descriptor now

    def _enter(self) -> int:
        with self._mu:
            if self.closed:
                raise ClosedError(f"file {self.path} is closed")
            self._users += 1
            return self._fd

    def _leave(self) -> None:
        with self._mu:
            self._users -= 1
            last = self.closed and not self._users
        if last:  # close() ran while this call used the descriptor: close it now
            os.close(self._fd)

    def read_at(self, offset: int, n: int) -> bytes:
        """Read up to ``n`` bytes at ``offset``; fewer only at end of file."""
        fd = self._enter()
        try:
            data = os.pread(fd, n, offset)
        except OSError as exc:
            raise _io_error(exc, "read", self.path) from exc
        finally:
            self._leave()
        c = self._fs.counters
        c.read_calls += 1
        c.bytes_read += len(data)
        return data

    def map(self, offset: int, length: int) -> mmap.mmap:
        """Map ``length`` bytes read-only starting at ``offset`` (a multiple of PAGE_SIZE).

        The OS reads nothing until a page is touched. The caller owns the mapping and closes it.
        """
        if offset % mmap.ALLOCATIONGRANULARITY:
            raise ValueError(f"map offset {offset} is not page aligned")
        fd = self._enter()
        try:
            mm = mmap.mmap(fd, length, access=mmap.ACCESS_READ, offset=offset)
        except OSError as exc:
            raise _io_error(exc, "mmap", self.path) from exc
        finally:
            self._leave()
        self._fs.counters.maps += 1
        return mm

    def close(self) -> None:
        """Close the file (idempotent); the descriptor goes when the last read using it ends.
        Mappings made from it stay valid until their owners close them."""
        with self._mu:
            if self.closed:
                return
            self.closed = True
            busy = self._users
        if not busy:
            os.close(self._fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class FileLock:
    """An exclusive ``flock`` on a file, held until :meth:`release` (or process exit)."""

    def __init__(self, path: str, fd: int):
        self.path = path
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = -1


class FileSystem:
    """The real file system (POSIX). Subclass to inject faults."""

    def __init__(self):
        self.counters = IOCounters()
        self._locks: set[str] = set()
        self._locks_mu = threading.Lock()

    # -- opening files -------------------------------------------------------------------
    def open_writable(self, path: str) -> WritableFile:
        """Create (or truncate) ``path`` for appending."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise _io_error(exc, "create", path) from exc
        return WritableFile(self, path, fd, 0)

    def open_appendable(self, path: str) -> WritableFile:
        """Open ``path`` (creating it if missing) to append after its current end."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
            size = os.fstat(fd).st_size
        except OSError as exc:
            raise _io_error(exc, "open for append", path) from exc
        return WritableFile(self, path, fd, size)

    def open_readable(self, path: str) -> RandomAccessFile:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            size = os.fstat(fd).st_size
        except OSError as exc:
            raise _io_error(exc, "open", path) from exc
        return RandomAccessFile(self, path, fd, size)

    def read_file(self, path: str) -> bytes:
        """Read a whole (small) file."""
        with self.open_readable(path) as f:
            return f.read_at(0, f.size)

    # -- directory operations ------------------------------------------------------------
    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except OSError as exc:
            raise _io_error(exc, "list", path) from exc

    def makedirs(self, path: str) -> None:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise _io_error(exc, "mkdir", path) from exc

    def remove(self, path: str) -> None:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise _io_error(exc, "remove", path) from exc

    def rename(self, src: str, dst: str) -> None:
        """Atomically replace ``dst`` with ``src``. Durable only after :meth:`sync_dir`."""
        try:
            os.replace(src, dst)
        except OSError as exc:
            raise _io_error(exc, "rename", src) from exc

    def link(self, src: str, dst: str) -> None:
        """Make ``dst`` a hard link to ``src`` (same file system; ``dst`` must not exist).
        Durable only after :meth:`sync_dir` of ``dst``'s directory."""
        try:
            os.link(src, dst)
        except OSError as exc:
            raise _io_error(exc, "link", src) from exc

    def rmdir(self, path: str) -> None:
        """Remove the empty directory ``path`` (missing: no error)."""
        try:
            os.rmdir(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise _io_error(exc, "rmdir", path) from exc

    def sync_dir(self, path: str) -> None:
        """fsync a directory so that creations, renames and removals in it are durable."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise _io_error(exc, "fsync directory", path) from exc
        self.counters.syncs += 1

    def file_size(self, path: str) -> int:
        try:
            return os.stat(path).st_size
        except OSError as exc:
            raise _io_error(exc, "stat", path) from exc

    def lock(self, path: str, *, create: bool = True) -> FileLock:
        """Take an exclusive, non-blocking flock on ``path`` (created if missing; with
        ``create=False`` the file is opened read-only, which flock allows, and a missing file
        raises StorageIOError with errno ENOENT: nothing is created).

        Raises LockedError if another process, or another holder in this process, has it.
        """
        real = os.path.realpath(path)
        with self._locks_mu:
            if real in self._locks:
                raise LockedError(f"{path} is already locked by this process")
            flags = (os.O_RDWR | os.O_CREAT) if create else os.O_RDONLY
            try:
                fd = os.open(path, flags | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                raise _io_error(exc, "open lock file", path) from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise LockedError(f"{path} is locked by another process") from exc
                raise _io_error(exc, "flock", path) from exc
            self._locks.add(real)
        lock = FileLock(path, fd)
        release = lock.release

        def _release():
            with self._locks_mu:
                self._locks.discard(real)
            release()

        lock.release = _release  # type: ignore[method-assign]
        return lock


_default = FileSystem()


def default_fs() -> FileSystem:
    """The process-wide real file system."""
    return _default
