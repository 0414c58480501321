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

Thread-safe: one snapshot may be read by many threads, and closed by any. Reads after
``close()``, or after the DB is closed, raise ClosedError; a read that runs while another
thread closes the snapshot either raises it or returns the snapshot's moment, never a mix.
"""

from __future__ import annotations

import itertools
import threading
import time

from .errors import ClosedError, ResultTooLargeError
from .format import KIND_DELETE
from .memtable import decode_record


_tokens = itertools.count(1)  # names each snapshot in its DB's _open_snapshots


class Snapshot:
    """Reads at one moment; see the module docstring. Made by ``DB.snapshot()``."""

    __slots__ = ("_db", "_rs", "_seq", "_close_lock", "_token", "__weakref__")

    def __init__(self, db, rs):
        self._db = db
        self._rs = None
        self._close_lock = threading.Lock()
        # The largest sequence number in the active memtable then: its records <= this
        # number are what it held (engine/memtable.py, "Snapshots").
        self._seq = rs.mem.snapshot()
        self._rs = rs  # only once the memtable snapshot is held: close() releases it
        # Listed for DB.stats() ("snapshots") until closed: one dict store and one pop, each
        # atomic under the GIL, so close() stays lock-free enough for a finalizer.
        self._token = next(_tokens)
        db._open_snapshots[self._token] = time.monotonic()

    def __enter__(self) -> "Snapshot":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        # A snapshot dropped without close() gives back its memtable snapshot. Safe in a
        # finalizer: release() takes no lock, and no one else can hold _close_lock (nothing
        # else refers to this object any more).
        if getattr(self, "_rs", None) is not None:
            self.close()

    def close(self) -> None:
        """Release what the snapshot holds (the module docstring). Idempotent, and once only
        when threads close it at once. A read running meanwhile finishes at the snapshot's
        moment (it holds the memtable itself: :meth:`_hold`)."""
        with self._close_lock:
            rs = self._rs
            self._rs = None
        if rs is not None:
            self._db._open_snapshots.pop(self._token, None)
            rs.mem.release()

    def _hold(self):
        """The read state, with one more memtable snapshot held for one read: release it
        (``rs.mem.release()``) when the read is done. Holding it before checking that the
        snapshot is still open means that a close() meanwhile cannot let the kept records go
        while the read uses them: either the read sees the close and raises ClosedError, or
        the records stay until the read releases its hold."""
        rs = self._rs
        if rs is None:
            raise ClosedError("snapshot is closed")
        if self._db._rs is None:
            raise ClosedError("DB is closed")
        rs.mem.snapshot()
        if self._rs is None:  # closed meanwhile: its kept records may be gone already
            rs.mem.release()
            raise ClosedError("snapshot is closed")
        return rs

    def _find(self, rs, key: bytes):
        r = rs.mem.record_at(key, self._seq)
        if r is not None:
            return decode_record(r)
        return rs.find_older(key)

    def get(self, key: bytes) -> bytes | None:
        """``DB.get(key)`` as of the snapshot's moment."""
        key = self._db._check_key(key)
        rs = self._hold()
        try:
            e = self._find(rs, key)
        finally:
            rs.mem.release()
        self._db.gets += 1  # stats(): gets, and data blocks read per get, count these too
        return None if e is None or e[1] == KIND_DELETE else e[2]

    def multi_get(self, keys, max_bytes: int | None = None) -> list:
        """``DB.multi_get(keys, max_bytes)`` as of the snapshot's moment."""
        check = self._db._check_key
        keys = [check(k) for k in keys]
        out = []
        budget = max_bytes
        rs = self._hold()
        try:
            for key in keys:
                e = self._find(rs, key)
                v = None if e is None or e[1] == KIND_DELETE else e[2]
                if v is not None and budget is not None:
                    budget -= len(v)
                    if budget < 0:
                        self._db.gets += len(out) + 1
                        raise ResultTooLargeError(
                            f"the values found exceed {max_bytes} bytes by key {len(out) + 1} "
                            f"({max_bytes - budget} bytes); ask for fewer keys at a time")
                out.append(v)
        finally:
            rs.mem.release()
        self._db.gets += len(out)
        return out

    def scan(self, start: bytes | None = None, end: bytes | None = None,
             limit: int | None = None):
        """``DB.scan(start, end, limit)`` as of the snapshot's moment. The iterator holds the
        memtable itself (``DB._scan``), so it reads on after the snapshot is closed."""
        rs = self._hold()  # until the scan holds its own
        try:
            return self._db._scan_of(rs, start, end, limit, self._seq)
        finally:
            rs.mem.release()
