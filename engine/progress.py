"""Progress of one long DB operation (``verify``, ``checkpoint``), read by ``stats()`` from
other threads while it runs."""

from __future__ import annotations

import time


class Progress:
    """Bytes and tables done so far by one long call (plain ints, written by one thread)."""

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
