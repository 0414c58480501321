"""``DB.verify``: check every checksum of every live table, on demand, while the DB serves.

Scrubbing finds damage in blocks that no read has touched (a get checks only what it reads),
so an operator learns of it while replicas or backups can still help. It reads each table of
the current version again through its file (engine/sstable/verify.py), one table at a time,
holding the read state that lists them (so a compaction may replace a table meanwhile, but its
file stays open until the check is done). Damage does not stop the scan: every damaged table is
listed, with the file and offset that failed. Reads and writes go on meanwhile; nothing is
changed, repaired or deleted.

The memtable and the write-ahead log are not covered (the log is checked record by record when
it is replayed at open), nor the manifest (checked at every open).

While it runs, ``stats()["verify_running"]`` shows its progress (:class:`Progress.report`).
"""

from __future__ import annotations

import threading
import time

from .errors import ClosedError, CorruptionError
from .reports import _live_tables
from .sstable.verify import verify_table


class Progress:
    """Bytes and tables checked so far by one ``verify`` call (read from other threads)."""

    def __init__(self, tables: int, total_bytes: int):
        self.tables = tables
        self.total_bytes = total_bytes
        self.tables_done = 0
        self.bytes_done = 0
        self.started = time.monotonic()

    def add(self, n: int) -> None:
        self.bytes_done += n

    def report(self) -> dict:
        return {"tables": self.tables, "tables_done": self.tables_done,
                "bytes": self.total_bytes, "bytes_done": min(self.bytes_done, self.total_bytes),
                "seconds": round(time.monotonic() - self.started, 3)}


_lock = threading.Lock()  # one verify per process at a time keeps the disk load predictable


def verify_db(db) -> dict:
    """Check every live table of ``db`` (module docstring). Returns::

        {"tables": n, "data_blocks": n, "filter_partitions": n, "bytes": n, "seconds": s,
         "damaged": [{"file": path, "level": L, "offset": o, "error": message}, ...]}

    ``bytes``: of every table read; ``data_blocks`` and ``filter_partitions``: of the tables
    found intact. ``damaged`` is empty when every checksum matched. Raises ClosedError if the DB is closed
    (before or during the check), StorageIOError if a table cannot be read.
    """
    with _lock:
        rs = db._rs
        if rs is None:
            raise ClosedError("DB is closed")
        live = _live_tables(rs)  # rs stays referenced: its tables stay open until we return
        progress = Progress(len(live), sum(t.file_size for _, _, t in live))
        db._verify_progress = progress
        out = {"tables": len(live), "data_blocks": 0, "filter_partitions": 0, "bytes": 0,
               "damaged": []}
        try:
            for level, _meta, table in live:
                if db._rs is None:
                    raise ClosedError("DB is closed")
                before = progress.bytes_done
                try:
                    got = verify_table(table, progress.add)
                except CorruptionError as exc:
                    if db._rs is None:  # closed under us: the table's reads failed for that
                        raise ClosedError("DB is closed") from None
                    out["damaged"].append({"file": exc.path or table.path, "level": level,
                                           "offset": exc.offset, "error": str(exc)})
                    progress.bytes_done = before + table.file_size
                else:
                    out["data_blocks"] += got["data_blocks"]
                    out["filter_partitions"] += got["filter_partitions"]
                finally:
                    if db._rs is None:
                        raise ClosedError("DB is closed")
                progress.tables_done += 1
                out["bytes"] += table.file_size
        finally:
            db._verify_progress = None
        out["seconds"] = round(time.monotonic() - progress.started, 3)
        return out


def running(db) -> dict | None:
    """The verify in progress on ``db`` (``Progress.report``), or None."""
    p = getattr(db, "_verify_progress", None)
    return p.report() if p is not None else None
