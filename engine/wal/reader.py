"""Reads a log file back, separating a torn tail from corruption (docs/format.md,
"Write-ahead log", "Reading rule").

The rule, precisely: records are read from offset 0. The first record that is *bad* (its header
or payload runs past the end of the file, its checksum fails, or its type is 0) ends the good
prefix at offset ``X``. Then every later offset ``Y > X`` is tried as the start of a record.

* If no valid record starts anywhere after ``X``, the bytes from ``X`` to the end of the file are
  a torn tail (what a crash during an append, or a zero-filled / preallocated tail, leaves).
  They are dropped and reported in ``LogReadResult.dropped_bytes``.
* If a valid record starts at some ``Y > X``, data that was written after the damage is still
  there: this is corruption in the middle, and :class:`CorruptionError` is raised naming the
  file and ``X``. Acknowledged records are never skipped silently.

A record whose checksum passes but whose type is unknown raises :class:`CorruptionError` (a file
from a newer format, or damage that a checksum cannot see).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..checksum import MASK_DELTA as _MASK_DELTA
from ..errors import CorruptionError
from ..format import LOG_HEADER, LOG_HEADER_SIZE, LOG_RECORD_FULL
from .record import _extend, _pack_prefix, _value, record_crc

_unpack_header = LOG_HEADER.unpack_from
_U32 = 0xFFFFFFFF
_SCAN_CHUNK = 1 << 16


def _unmask(masked: int) -> int:
    rot = (masked - _MASK_DELTA) & _U32
    return ((rot >> 17) | (rot << 15)) & _U32


@dataclass
class LogReadResult:
    """What :func:`read_log` found. Iterating yields the payloads in file order."""

    path: str
    records: list[bytes] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)  # start offset of each record
    end_offset: int = 0  # end of the last good record
    file_size: int = 0

    @property
    def dropped_bytes(self) -> int:
        """Bytes of torn tail that were dropped (0 for a clean log)."""
        return self.file_size - self.end_offset

    @property
    def torn_tail(self) -> bool:
        return self.end_offset != self.file_size

    def __iter__(self):
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)


def _record_end(data: bytes, pos: int, size: int) -> int:
    """End offset of the record at ``pos`` if it is complete and its checksum passes, else -1.

    A type-0 header (zero fill) is never valid. The type is not otherwise checked here.
    """
    if size - pos < LOG_HEADER_SIZE:
        return -1
    masked, n, rtype = _unpack_header(data, pos)
    start = pos + LOG_HEADER_SIZE
    end = start + n
    if end > size or rtype == 0:
        return -1
    if record_crc(pos, rtype, data[start:end]) != _unmask(masked):
        return -1
    return end


def _find_valid_record(data: bytes, start: int, size: int) -> int:
    """Offset of the first valid FULL record starting at or after ``start``, or -1.

    Runs only on a damaged log. numpy picks, 64 KiB of offsets at a time, the candidates whose
    type byte is FULL and whose length fits in the file; only those are checksummed, so a long
    zero-filled or garbage tail costs O(n) at C speed.
    """
    arr = np.frombuffer(data, dtype=np.uint8)
    last = size - LOG_HEADER_SIZE  # the last offset where a header fits
    lo = start
    while lo <= last:
        hi = min(lo + _SCAN_CHUNK, last + 1)
        ys = np.flatnonzero(arr[lo + LOG_HEADER_SIZE - 1 : hi + LOG_HEADER_SIZE - 1] == LOG_RECORD_FULL)
        if ys.size:
            ys = ys + lo
            n = (
                arr[ys + 4].astype(np.int64)
                | arr[ys + 5].astype(np.int64) << 8
                | arr[ys + 6].astype(np.int64) << 16
                | arr[ys + 7].astype(np.int64) << 24
            )
            for pos in ys[ys + LOG_HEADER_SIZE + n <= size].tolist():
                if _record_end(data, pos, size) >= 0:
                    return pos
        lo = hi
    return -1


def parse_log(data: bytes, path: str = "<memory>") -> LogReadResult:
    """Parse a whole log image held in memory. See the module docstring for the rule."""
    if type(data) is not bytes:
        data = bytes(data)
    size = len(data)
    result = LogReadResult(path=path, file_size=size)
    records = result.records
    offsets = result.offsets
    pos = 0
    while pos < size:
        # Inlined _record_end, slicing the payload once.
        end = -1
        if size - pos >= LOG_HEADER_SIZE:
            masked, n, rtype = _unpack_header(data, pos)
            start = pos + LOG_HEADER_SIZE
            if start + n <= size and rtype:
                payload = data[start : start + n]
                if _extend(_value(_pack_prefix(pos, n, rtype)), payload) == _unmask(masked):
                    end = start + n
        if end < 0:
            later = _find_valid_record(data, pos + 1, size)
            if later >= 0:
                raise CorruptionError(
                    f"bad log record followed by a valid record at offset {later}",
                    path=path,
                    offset=pos,
                )
            break  # torn tail: nothing valid after pos
        if rtype != LOG_RECORD_FULL:
            raise CorruptionError(f"unknown log record type {rtype}", path=path, offset=pos)
        records.append(payload)
        offsets.append(pos)
        pos = end
    result.end_offset = pos
    return result


def read_log(fs, path: str) -> LogReadResult:
    """Read every record of the log at ``path`` through ``fs`` (an engine.vfs.FileSystem).

    Returns the good records, the offset where they end and how many torn-tail bytes were
    dropped. Raises CorruptionError(path=, offset=) for corruption before the tail and
    StorageIOError if the file cannot be read. Reads the whole file into memory: O(file size).
    Safe to call from any thread; the file must not be appended to while it is read.
    """
    return parse_log(fs.read_file(path), path)
