"""``DB.snapshot()``: reads of the DB as it was at one moment, for as long as the caller likes.

    with db.snapshot() as snap:
        snap.get(k); snap.multi_get(keys); snap.scan(start, end, limit)

A :class:`Snapshot` holds the read state of its moment (engine/read_state.py: the memtables
and tables then) and a snapshot of the active memtable (engine/memtable.py, "Snapshots"):
frozen memtables and tables never change, and the active memtable keeps the records that
later writes replace. Each read returns what a read of the DB would have returned at that
moment; ``DB.multi_get`` and ``DB.scan`` are one-moment reads too, each at its own moment.

What a snapshot holds until :meth:`Snapshot.close` (or until it is freed): the tables of its
moment stay open and on disk even once compactions replace them, and the memtable of its
moment keeps every record that a write replaces in it (counted in its size, so it is still
flushed on time; once frozen it takes no more). Close snapshots you are done with, as with
RocksDB's ReleaseSnapshot. A scan from a snapshot keeps reading right after the snapshot is
closed (the scan holds what it needs itself).

Thread-safe: one snapshot may be read by many threads. Reads after ``close()``, or after the
DB is closed, raise ClosedError.
"""

from __future__ import annotations

from .errors import ClosedError, ResultTooLargeError
from .format import KIND_DELETE
from .memtable import decode_record


class Snapshot:
    """Reads at one moment; see the module docstring. Made by ``DB.snapshot()``."""

    __slots__ = ("_db", "_rs", "sequence", "__weakref__")

    def __init__(self, db, rs):
        self._db = db
        self._rs = rs
        # The largest sequence number in the active memtable then: its records <= this
        # number are what it held (engine/memtable.py, "Snapshots").
        self.sequence = rs.mem.snapshot()

    def __enter__(self) -> "Snapshot":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        # A snapshot dropped without close() gives back its memtable snapshot. release()
        # takes no lock, so this is safe in a finalizer.
        rs = getattr(self, "_rs", None)
        if rs is not None:
            self._rs = None
            rs.mem.release()

    def close(self) -> None:
        """Release what the snapshot holds (the module docstring). Idempotent."""
        rs = self._rs
        if rs is not None:
            self._rs = None
            rs.mem.release()

    def _state(self):
        rs = self._rs
        if rs is None:
            raise ClosedError("snapshot is closed")
        if self._db._rs is None:
            raise ClosedError("DB is closed")
        return rs

    def _find(self, rs, key: bytes):
        r = rs.mem.record_at(key, self.sequence)
        if r is not None:
            return decode_record(r)
        return rs.find_older(key)

    def get(self, key: bytes) -> bytes | None:
        """``DB.get(key)`` as of the snapshot's moment."""
        rs = self._state()
        key = self._db._check_key(key)
        e = self._find(rs, key)
        return None if e is None or e[1] == KIND_DELETE else e[2]

    def multi_get(self, keys, max_bytes: int | None = None) -> list:
        """``DB.multi_get(keys, max_bytes)`` as of the snapshot's moment."""
        rs = self._state()
        check = self._db._check_key
        keys = [check(k) for k in keys]
        out = []
        budget = max_bytes
        for key in keys:
            e = self._find(rs, key)
            v = None if e is None or e[1] == KIND_DELETE else e[2]
            if v is not None and budget is not None:
                budget -= len(v)
                if budget < 0:
                    raise ResultTooLargeError(
                        f"the values found exceed {max_bytes} bytes by key {len(out) + 1} "
                        f"({max_bytes - budget} bytes); ask for fewer keys at a time")
            out.append(v)
        return out

    def scan(self, start: bytes | None = None, end: bytes | None = None,
             limit: int | None = None):
        """``DB.scan(start, end, limit)`` as of the snapshot's moment."""
        rs = self._state()
        return self._db._scan_of(rs, start, end, limit, self.sequence)
