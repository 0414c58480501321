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
from a newer format, or damage that a checksum cannot see). A CLOSED record (log format 2,
docs/format.md "Record") ends the log: ``LogReadResult.closed``; bytes after it are dropped
like a torn tail unless a valid record starts there (corruption). Because it is a valid record
after the last batch, damage to that batch is corruption in the middle by the rule above.

``strict_tail`` (the manifest's rule): a bad last record is corruption, not a torn tail, when a
torn write cannot explain it (:func:`_damaged_last_record`): a complete record whose checksum
fails, unless its bytes from a 512-byte boundary inside it to the end of the file are all zero
(sectors a crash never wrote); or a record that is valid once its length field is read as
"to the end of the file", or its type byte as FULL. A crash during an append leaves a short
record or unwritten (zero) sectors; anything else is damage to a record the engine may already
have acted on (LevelDB's log reader reports a checksum mismatch the same way, though it drops
a last record whose length runs past the end).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..checksum import MASK_DELTA as _MASK_DELTA
from ..errors import CorruptionError
from ..format import LOG_HEADER, LOG_HEADER_SIZE, LOG_RECORD_CLOSED, LOG_RECORD_FULL
from .record import _extend, _pack_prefix, _value, record_crc

_unpack_header = LOG_HEADER.unpack_from
_U32 = 0xFFFFFFFF
_SCAN_CHUNK = 1 << 16


def _mask(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & _U32) + _MASK_DELTA) & _U32


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
    closed: bool = False  # the log ends with its CLOSED record (the writer finished with it)

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
    """Offset of the first valid FULL or CLOSED record starting at or after ``start``, or -1.

    Runs only on a damaged log. numpy picks, 64 KiB of offsets at a time, the candidates whose
    type byte is FULL or CLOSED and whose length fits in the file; only those are checksummed,
    so a long zero-filled or garbage tail costs O(n) at C speed.
    """
    arr = np.frombuffer(data, dtype=np.uint8)
    last = size - LOG_HEADER_SIZE  # the last offset where a header fits
    lo = start
    while lo <= last:
        hi = min(lo + _SCAN_CHUNK, last + 1)
        types = arr[lo + LOG_HEADER_SIZE - 1 : hi + LOG_HEADER_SIZE - 1]
        ys = np.flatnonzero((types == LOG_RECORD_FULL) | (types == LOG_RECORD_CLOSED))
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


SECTOR = 512


ONE_BIT_SEARCH_MAX = 4096
"""Largest payload searched for a single flipped bit (8 checksums per byte: ~0.1 s at 4 KiB;
runs only on a damaged last record)."""


def _one_bit_from_valid(pos: int, rtype: int, payload: bytes, masked: int) -> int | None:
    """Where one flipped bit makes the record valid: the payload index of the byte, -1 for the
    stored (masked) checksum itself, None if no single bit does (or the payload is too long to
    search). ``masked`` is the checksum field as stored."""
    diff = _mask(record_crc(pos, rtype, payload)) ^ masked
    if diff & (diff - 1) == 0:
        return -1  # a bit of the stored field (compared masked: unmasking spreads a bit)
    crc = _unmask(masked)
    if len(payload) > ONE_BIT_SEARCH_MAX:
        return None
    head = _value(_pack_prefix(pos, len(payload), rtype))  # the checksum of payload[:i]
    for i, orig in enumerate(payload):
        rest = payload[i + 1:]
        for bit in (1, 2, 4, 8, 16, 32, 64, 128):
            if _extend(_extend(head, bytes((orig ^ bit,))), rest) == crc:
                return i
        head = _extend(head, payload[i:i + 1])
    return None


def _unwritten_from(data: bytes, pos: int, end: int, size: int) -> int | None:
    """The first ``SECTOR`` boundary inside the record ``[pos, end)`` from which the file is
    all zero to its end (sectors a crash never wrote), or None."""
    nonzero_end = len(data[pos:size].rstrip(b"\0")) + pos  # data[nonzero_end:] is all zero
    z = (pos // SECTOR + 1) * SECTOR  # the first sector boundary after the record's start
    if nonzero_end > z:
        z = -(-nonzero_end // SECTOR) * SECTOR  # the first boundary at or after it
    return z if z < end else None


def _damaged_last_record(data: bytes, pos: int, size: int) -> bool:
    """Whether the bad last record at ``pos`` is damage rather than a torn write (strict tail):

    * its length field is wrong: the record is valid when it runs to the end of the file;
    * its type byte is wrong: the record is valid as a FULL record of its stated length;
    * it is complete (header and stated payload in the file, type not 0) and one flipped bit
      (of the checksum or a payload of at most ``ONE_BIT_SEARCH_MAX`` bytes) makes it valid,
      unless that bit lies in trailing zero sectors (below);
    * or it is complete and its bytes are not a crash's unwritten sectors (a zero run from a
      ``SECTOR`` boundary inside the record to the end of the file).

    A torn write is a short record, or one ending in zero sectors: a checksum that matches
    another reading of the header is never a torn write (a 2^-32 chance).
    """
    if size - pos < LOG_HEADER_SIZE:
        return False
    masked, n, rtype = _unpack_header(data, pos)
    crc = _unmask(masked)
    start = pos + LOG_HEADER_SIZE
    end = start + n
    if rtype and end != size and record_crc(pos, rtype, data[start:size]) == crc:
        return True  # the length field
    if end > size:
        return False  # short: torn
    if rtype != LOG_RECORD_FULL and record_crc(pos, LOG_RECORD_FULL, data[start:end]) == crc:
        return True  # the type byte
    if rtype == 0:
        return False  # zero fill
    zeros = _unwritten_from(data, pos, end, size)
    flipped = _one_bit_from_valid(pos, rtype, data[start:end], masked)
    if flipped is not None:
        # One bit away from valid. A bit inside trailing zero sectors is what a crash leaves
        # when that sector held a byte with one bit set; a bit before them, or anywhere with
        # no such zeros, no crash can have changed (the payload may end in zeros by itself).
        return zeros is None or (flipped < 0 or start + flipped < zeros)
    return zeros is None  # unwritten sectors: torn; other wrong bytes: damage


def parse_log(data: bytes, path: str = "<memory>", strict_tail: bool = False) -> LogReadResult:
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
            if strict_tail and _damaged_last_record(data, pos, size):
                raise CorruptionError(
                    "the last record is damaged (a checksum, length or type that a torn write "
                    "cannot leave)", path=path, offset=pos)
            break  # torn tail: nothing valid after pos
        if rtype != LOG_RECORD_FULL:
            if rtype == LOG_RECORD_CLOSED and not payload:
                # Nothing is written after it; bytes there (zero fill) hide no write and are
                # dropped like a torn tail, but a valid record there is not ours to skip.
                if end < size and _find_valid_record(data, end, size) >= 0:
                    raise CorruptionError("a record after the log's CLOSED record", path=path,
                                          offset=end)
                result.closed = True
                pos = end
                break
            raise CorruptionError(f"unknown log record type {rtype}", path=path, offset=pos)
        records.append(payload)
        offsets.append(pos)
        pos = end
    result.end_offset = pos
    return result


def read_log(fs, path: str, strict_tail: bool = False) -> LogReadResult:
    """Read every record of the log at ``path`` through ``fs`` (an engine.vfs.FileSystem).

    Returns the good records, the offset where they end and how many torn-tail bytes were
    dropped. Raises CorruptionError(path=, offset=) for corruption before the tail and
    StorageIOError if the file cannot be read. Reads the whole file into memory: O(file size).
    Safe to call from any thread; the file must not be appended to while it is read.
    """
    return parse_log(fs.read_file(path), path, strict_tail)
