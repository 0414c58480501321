"""Appends records to a log file (docs/format.md, "Write-ahead log").

Used for the write-ahead log and the manifest. A record is written with a single ``append`` so
a crash leaves at most one torn record, at the tail.
"""

from __future__ import annotations

from ..checksum import MASK_DELTA as _MASK_DELTA
from ..errors import InvalidArgumentError, StorageIOError
from ..format import LOG_HEADER, LOG_MAX_PAYLOAD, LOG_RECORD_CLOSED, LOG_RECORD_FULL
from ..vfs import WritableFile
from .record import _extend, _pack_prefix, _value

_pack_header = LOG_HEADER.pack
WRITEBACK_BYTES = 1 << 20
"""Every this many bytes appended, the writer asks the OS to start writing them to the disk
(``WritableFile.start_writeback``), so that the fsync when the log ends (a memtable switch,
which a writer waits for) or a synced write has at most about this much left to write. With
unsynced writes at the defaults, the switch's fsync took 3.6-5.0 ms median (up to 12 ms), and
the slowest put of a 1.2M-put run (101 ms) was at a switch; with this, 1.2 ms median
(bench/results/db.md "Session 19"). Advice only: no durability rule depends on it."""
_U32 = 0xFFFFFFFF


class _Closed(Exception):
    """The writer's state after its CLOSED record (not a failure: sync still works)."""

    def __str__(self) -> str:
        return "the log was closed with its CLOSED record"


class LogWriter:
    """Writes framed records to ``wfile``, starting at its current size.

    Contract:

    * REQUIRES: one thread at a time (the DB calls it under its write lock / from the group
      commit leader).
    * ``add_record`` hands the record to the OS; it is durable only after ``sync`` returns.
    * Once ``add_record`` or ``sync`` has raised, the writer is *failed*: the file may end in a
      partial record, so every later call raises :class:`StorageIOError`. The caller must stop
      writing to this file and start a new one (a record appended after a torn one would turn a
      harmless torn tail into corruption in the middle).
    * Never open a log that was read with a torn tail (``LogReadResult.torn_tail``) for
      appending, for the same reason: write a new log file instead.

    Cost: O(len(payload)) for the checksum plus one ``write`` system call per record.
    """

    __slots__ = ("_file", "_failed", "_written_back")

    def __init__(self, wfile: WritableFile):
        self._file = wfile
        self._failed: BaseException | None = None
        self._written_back = wfile.size  # writeback asked for up to here (WRITEBACK_BYTES)

    @property
    def size(self) -> int:
        """Bytes in the file, including records not yet synced."""
        return self._file.size

    @property
    def path(self) -> str:
        return self._file.path

    def _check(self) -> None:
        if self._failed is not None:
            raise StorageIOError(
                f"log writer stopped after an earlier failure ({self._failed})", path=self._file.path
            )

    def add_record(self, payload: bytes) -> None:
        """Append one record holding ``payload`` (bytes; may be empty).

        A payload over ``LOG_MAX_PAYLOAD`` (the u32 length field) raises InvalidArgumentError
        before anything is written; the writer stays usable. (The DB refuses such a write
        before it encodes it: engine/db.py ``_check_log_room``.)"""
        if self._failed is not None:
            self._check()
        n = len(payload)
        if n > LOG_MAX_PAYLOAD:
            raise InvalidArgumentError(f"log record of {n} bytes is over the {LOG_MAX_PAYLOAD} limit")
        if type(payload) is not bytes:
            payload = bytes(payload)
        crc = _extend(_value(_pack_prefix(self._file.size, n, LOG_RECORD_FULL)), payload)  # record_crc
        masked = ((((crc >> 15) | (crc << 17)) & _U32) + _MASK_DELTA) & _U32
        f = self._file
        try:
            f.append(_pack_header(masked, n, LOG_RECORD_FULL) + payload)
        except BaseException as exc:
            self._failed = exc
            raise
        if f.size - self._written_back >= WRITEBACK_BYTES:
            f.start_writeback(self._written_back, f.size - self._written_back)
            self._written_back = f.size

    def add_closed_marker(self) -> None:
        """Append the CLOSED record (docs/format.md, "Record"): nothing follows it, and once
        it is read every record before it must be intact (damage to the last batch is then
        corruption, not a torn tail). Durable after ``sync``; the writer takes no records after
        it."""
        self._check()
        crc = _value(_pack_prefix(self._file.size, 0, LOG_RECORD_CLOSED))  # record_crc
        masked = ((((crc >> 15) | (crc << 17)) & _U32) + _MASK_DELTA) & _U32
        try:
            self._file.append(_pack_header(masked, 0, LOG_RECORD_CLOSED))
        except BaseException as exc:
            self._failed = exc
            raise
        self._failed = _Closed()  # no record may follow; sync and close still work

    def sync(self) -> None:
        """fsync the file: every record added so far is durable when this returns."""
        if not isinstance(self._failed, _Closed):
            self._check()
        try:
            self._file.sync()
        except BaseException as exc:
            self._failed = exc
            raise

    def sync_what_was_written(self) -> None:
        """fsync the file even if the writer has failed: every complete record before a failed
        append becomes durable (the failed append leaves at most a torn tail, which readers
        drop). Call it before abandoning a failed log for a newer one, so that the newer log
        never outlives acknowledged records of this one after a power loss. Raises
        StorageIOError if the fsync fails."""
        self._file.sync()

    def close(self) -> None:
        """Close the file (does not sync). Idempotent."""
        self._file.close()
