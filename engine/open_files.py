"""The process's open-file limit, raised when the DB's tables need it.

Every open table holds up to three descriptors: its file, and one per mapping (the filter
region, and the data blocks with ``mmap_reads``: CPython's mmap duplicates the descriptor).
The engine keeps every live table open (RocksDB's default, ``max_open_files = -1``), so at a
common soft limit of 1024 a DB stops opening tables at about 340 (~1.3 GB at the default
4 MiB target table size). Go's runtime raises the soft ``RLIMIT_NOFILE`` to the hard limit for
every program for the same reason; the DB does so when, and only when, its tables need it
(option ``raise_open_file_limit``, default on), and logs it once. Past the hard limit the
table that cannot be opened raises a StorageIOError saying so (engine/table_set.py).

The soft limit is process-wide: a program that relies on descriptors staying below 1024
(``select.select``) should turn the option off and set its own limit.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)

DESCRIPTORS_PER_TABLE = 3
# Descriptors kept for everything else of the process: the DB's log, manifest, lock and
# directory, table workers' pipes, sockets of a server, the caller's own files.
RESERVE = 128

_lock = threading.Lock()


def soft_limit() -> int | None:
    """The soft RLIMIT_NOFILE now (None: unlimited, or no such limit on this platform)."""
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def raise_to_hard(logger: logging.Logger = log, why: str = "") -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; return (old, new) soft. A failure
    leaves the limit as it was and is logged, never raised."""
    import resource

    with _lock:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard != resource.RLIM_INFINITY and soft >= hard:
            return soft, soft
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            logger.warning("could not raise the open-file limit from %d to %d: %s", soft,
                           target, exc)
            return soft, soft
    logger.info("open-file limit raised from %d to %d%s", soft, target, why)
    return soft, target


def needed(tables: int) -> int:
    """Descriptors to have room for ``tables`` open tables and the rest of the process."""
    return DESCRIPTORS_PER_TABLE * tables + RESERVE


class _ProcessTables:
    """Tables open in this process, over every DB (the limit is the process's, not a DB's)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.count = 0
        self.watch = True  # False after the one attempt to raise (then it is the hard limit)


_process = _ProcessTables()


class Headroom:
    """Raises the soft limit, once per process, when the open tables of all its DBs are about
    to need more descriptors than it allows. One per DB (``enabled``: the DB's option; a DB
    with it off still counts its tables, as they hold descriptors all the same).

    ``opening()`` before a table is opened, ``closed()`` after one is closed: one comparison
    until the limit is near. Thread-safe.
    """

    def __init__(self, enabled: bool, logger: logging.Logger = log):
        self.enabled = enabled
        self.logger = logger

    def opening(self) -> None:
        with _process.lock:
            _process.count += 1
            tables = _process.count
            if not (self.enabled and _process.watch):
                return
            limit = soft_limit()
            if limit is None or needed(tables) <= limit:
                return
            _process.watch = False
        raise_to_hard(self.logger, f" for {tables} open tables in this process (up to "
                      f"{DESCRIPTORS_PER_TABLE} descriptors each)")

    def closed(self) -> None:
        with _process.lock:
            _process.count -= 1

    def retry_after_emfile(self, limit_before: int | None) -> bool:
        """After EMFILE: raise the soft limit if this DB may and it is below the hard one; True
        if the limit is now above ``limit_before`` (the soft limit when the failed open began:
        another thread may have raised it meanwhile), so one more try is worth it."""
        if not self.enabled:
            return False
        raise_to_hard(self.logger, " after 'too many open files'")
        now = soft_limit()
        return now is None or (limit_before is not None and now > limit_before)
