"""The engine's error hierarchy.

Every failure the engine reports is a :class:`SieveError`. Callers (the shard server, the CLI)
map the subclasses to gRPC status codes and exit codes:

==========================  ==================  =================================
class                       gRPC status         meaning
==========================  ==================  =================================
InvalidArgumentError        INVALID_ARGUMENT    the caller passed a bad key, value, option
  AlreadyExistsError        ALREADY_EXISTS      ... a path that must be new exists (checkpoint)
CorruptionError             DATA_LOSS           stored bytes fail a checksum or the format
StorageIOError              INTERNAL            the operating system refused an I/O call
  (errno ENOSPC or EDQUOT)  RESOURCE_EXHAUSTED  ... because the disk or quota is full (unless
                                                ``retryable`` is False: reopen needed)
ClosedError                 UNAVAILABLE         the DB (or table) was already closed
LockedError                 FAILED_PRECONDITION another process holds the directory lock
ResultTooLargeError         RESOURCE_EXHAUSTED  an answer would exceed the byte limit asked for
WriteStalledError           RESOURCE_EXHAUSTED  a write with a timeout was held longer (write
                                                stall) and was not applied
==========================  ==================  =================================
"""

from __future__ import annotations


class SieveError(Exception):
    """Base class of every error raised by sievekv's engine."""


class InvalidArgumentError(SieveError, ValueError):
    """The caller passed something the engine cannot accept (empty key, value over a limit...)."""


class AlreadyExistsError(InvalidArgumentError):
    """A path the caller named must not exist yet, and does (or another call is creating it)."""


class CorruptionError(SieveError):
    """Stored data failed a checksum or does not follow docs/format.md.

    Always names the file and, where known, the byte offset of the damaged structure.
    """

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None):
        self.path = path
        self.offset = offset
        where = ""
        if path is not None:
            where = f" in {path}"
            if offset is not None:
                where += f" at offset {offset}"
        super().__init__(f"corruption{where}: {message}")
        self.message = message


class StorageIOError(SieveError, OSError):
    """An operating-system I/O call failed (ENOSPC, EIO, a failed fsync...).

    ``retryable = False`` marks a refusal that no retry can end (the DB must be reopened), even
    if its cause's errno is ENOSPC: callers then must not say "retry later"."""

    def __init__(self, message: str, *, path: str | None = None, errno_: int | None = None,
                 retryable: bool | None = None):
        self.path = path
        self.retryable = retryable
        super().__init__(errno_ or 0, message if path is None else f"{message}: {path}")

    def __str__(self) -> str:
        # OSError's "[Errno N] message"; without an errno (a failure that is not an OS call's,
        # e.g. "DB refuses writes after an earlier failure (...)") just the message.
        return super().__str__() if self.errno else str(self.strerror)


class ResultTooLargeError(SieveError):
    """An answer would be larger than the caller's byte limit (``DB.multi_get(max_bytes=)``);
    raised before the whole answer is built."""


class WriteStalledError(SieveError):
    """A write given a ``timeout`` would have waited longer for room (a write stall: L0 or
    the frozen memtables at their limit, writes held to a rate) or in the write queue
    (behind a stalled or slow write) and was **not applied**: nothing of it reached the log,
    so retrying it is safe."""


class ClosedError(SieveError):
    """The object was used after close()."""


class LockedError(SieveError):
    """A data directory is locked by another process (or another DB in this process)."""


def release_all(*steps) -> None:
    """Call every one of ``steps`` (each releases something: a file, a lock) even when an
    earlier one raised, then raise the first error. A close that stopped at its first failure
    kept the rest: the directory lock stayed held until the process exited (session 20)."""
    first: BaseException | None = None
    for step in steps:
        try:
            step()
        except BaseException as exc:  # noqa: BLE001 (re-raised below)
            if first is None:
                first = exc
    if first is not None:
        raise first
