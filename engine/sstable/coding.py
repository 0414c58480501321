"""Varint coding shared by the SSTable's blocks (docs/format.md, "SSTable", "Varints").

A varint is LevelDB's base-128 little-endian encoding: seven value bits per byte, the high bit
set on every byte but the last. ``varint32`` values use at most 5 bytes, ``varint64`` at most 10.
Decoders raise :class:`ValueError` on truncated or over-long input; the block readers turn that
into a CorruptionError naming the file and offset.
"""

from __future__ import annotations


def put_varint(out: bytearray, value: int) -> None:
    """Append the varint encoding of ``value`` (>= 0) to ``out``."""
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def encode_varint(value: int) -> bytes:
    """The varint encoding of ``value`` as bytes."""
    out = bytearray()
    put_varint(out, value)
    return bytes(out)


def get_varint(data, pos: int, limit: int) -> tuple[int, int]:
    """Decode the varint at ``data[pos:limit]``; return ``(value, position after it)``.

    Raises ValueError if it runs past ``limit`` or is longer than 10 bytes.
    """
    if pos < limit:
        b = data[pos]
        if b < 0x80:
            return b, pos + 1
    result = 0
    shift = 0
    while pos < limit and shift <= 63:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
    raise ValueError("truncated or over-long varint")
