"""``DB.verify``: check every checksum of every live table, on demand, while the DB serves.

Scrubbing finds damage in blocks that no read has touched (a get checks only what it reads),
so an operator learns of it while replicas or backups can still help. It reads each table of
the current version again through its file (engine/sstable/verify.py), one table at a time,
holding the read state that lists them (a compaction may replace a table meanwhile; a table
whose file is then gone is skipped, not reported). Damage does not stop the scan: every
damaged table is listed, with the file and offset that failed. Reads and writes go on meanwhile; nothing is
changed, repaired or deleted.

The memtable and the write-ahead log are not covered (the log is checked record by record when
it is replayed at open), nor the manifest (checked at every open).

While it runs, ``stats()["verify_running"]`` shows its progress (:class:`Progress.report`).
"""

from __future__ import annotations

import errno
import threading
import time

from .errors import ClosedError, CorruptionError, StorageIOError
from .progress import Progress
from .reports import _live_tables
from .sstable.verify import verify_table


_lock = threading.Lock()  # one verify per process at a time keeps the disk load predictable

_DAMAGE_ERRNOS = frozenset({errno.EIO, errno.ENOENT})
"""A table that cannot be read for these (a bad sector; the file gone while the manifest lists
it) is damage. Other errors (EMFILE, ENOMEM...) are the machine's, and end the check."""


def verify_db(db) -> dict:
    """Check every live table of ``db`` (module docstring), each file opened again by its path
    (a file deleted or replaced under an open table is not read through the old descriptor).
    Returns::

        {"tables": n, "data_blocks": n, "filter_partitions": n, "bytes": n, "seconds": s,
         "damaged": [{"file": path, "level": L, "offset": o, "error": message}, ...]}

    ``tables`` and ``bytes``: of every table checked (a table a compaction replaced during the
    check, and so deleted, is left out); ``data_blocks`` and ``filter_partitions``: of the
    tables found intact. ``damaged`` is empty when every checksum matched; a table whose file
    is missing, has another size than the manifest records, or cannot be read (EIO) is listed
    too, with offset None. Raises ClosedError if the DB is closed (before or during the check),
    StorageIOError if a table cannot be opened for any other reason (out of descriptors).
    """
    with _lock:
        rs = db._rs
        if rs is None:
            raise ClosedError("DB is closed")
        live = _live_tables(rs)  # rs stays referenced: its tables stay open until we return
        progress = Progress(len(live), sum(t.file_size for _, _, t in live))
        db._verify_progress = progress
        out = {"tables": 0, "data_blocks": 0, "filter_partitions": 0, "bytes": 0,
               "damaged": []}
        try:
            for level, meta, table in live:
                if db._rs is None:
                    raise ClosedError("DB is closed")
                got = _check_one(db, level, meta, table, progress, out["damaged"])
                progress.tables_done += 1
                if got is None:  # replaced by a compaction meanwhile: not ours to judge now
                    continue
                out["tables"] += 1
                out["bytes"] += got.get("bytes", 0)
                out["data_blocks"] += got.get("data_blocks", 0)
                out["filter_partitions"] += got.get("filter_partitions", 0)
        finally:
            db._verify_progress = None
        out["seconds"] = round(time.monotonic() - progress.started, 3)
        return out


def _check_one(db, level: int, meta, table, progress: Progress, damaged: list) -> dict | None:
    """One table's counts (``{"bytes"}`` only if it is damaged, appended to ``damaged``), or
    None if its file is gone because it is no longer live."""
    before = progress.bytes_done

    def bad(offset, error: str) -> dict:
        damaged.append({"file": table.path, "level": level, "offset": offset, "error": error})
        progress.bytes_done = before + table.file_size
        return {"bytes": table.file_size}

    try:
        file = db._fs.open_readable(table.path)
    except StorageIOError as exc:
        if db._rs is None:
            raise ClosedError("DB is closed") from None
        if exc.errno == errno.ENOENT and meta.number not in db._rs.numbers:
            progress.bytes_done = before + table.file_size
            return None
        if exc.errno in _DAMAGE_ERRNOS:
            return bad(None, f"table file cannot be opened: {exc}")
        raise
    try:
        if file.size != meta.size:
            return bad(None, f"table file {table.path} is {file.size} bytes, the manifest "
                             f"records {meta.size}")
        return verify_table(table, progress.add, file=file)
    except CorruptionError as exc:
        if db._rs is None:  # closed under us: the reads failed for that
            raise ClosedError("DB is closed") from None
        return bad(exc.offset, str(exc))
    except StorageIOError as exc:
        if db._rs is None:
            raise ClosedError("DB is closed") from None
        if exc.errno in _DAMAGE_ERRNOS:
            return bad(None, f"table file cannot be read: {exc}")
        raise
    finally:
        file.close()


def running(db) -> dict | None:
    """The verify in progress on ``db`` (``Progress.report``), or None."""
    p = getattr(db, "_verify_progress", None)
    return p.report() if p is not None else None
