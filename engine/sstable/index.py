"""The index block: one entry per data block (docs/format.md, "SSTable", "Index block").

Entry ``i`` maps a separator key ``S_i`` to the handle of data block ``i``, where
``last_key(i) <= S_i < first_key(i + 1)`` (the last entry's key is the table's largest key), so
``bisect_left(separators, key)`` names the only block that can hold ``key``. Separators are
shortened like LevelDB's ``FindShortestSeparator``. Index blocks use restart interval 1 (every
key whole), so :func:`decode_index` decodes the block in one tight loop into plain lists that
the table keeps in memory.
"""

from __future__ import annotations

import operator

from ..errors import CorruptionError
from ..format import BLOCK_TRAILER_SIZE
from .block import Block


def shortest_separator(start: bytes, limit: bytes) -> bytes:
    """A short key ``s`` with ``start <= s < limit``. REQUIRES: ``start < limit``."""
    n = min(len(start), len(limit))
    i = 0
    while i < n and start[i] == limit[i]:
        i += 1
    if i < n:
        b = start[i]
        if b < 0xFF and b + 1 < limit[i]:
            return start[:i] + bytes((b + 1,))
    return start


def decode_index(block: Block, data_end: int) -> tuple[list[bytes], list[int], list[int]]:
    """Decode an index block into ``(separators, offsets, sizes)``.

    Checks what the format promises: keys whole and strictly increasing, data blocks laid out
    back to back from offset 0 (each followed by its trailer) and ending at ``data_end``.
    Raises CorruptionError naming the file and the index block's offset otherwise.
    """
    data = block.data
    entries = block.whole_entries()
    keys = [e[0] for e in entries]
    offsets: list[int] = []
    sizes: list[int] = []
    expect = 0
    try:
        for _, vs, ve in entries:
            # The two varints of the handle, decoded inline (get_varint without the call):
            # this loop runs once per data block at every table open. A varint running past
            # its entry ends at p != ve (an error below); past the block, IndexError.
            b = data[vs]
            off = b & 0x7F
            shift = 7
            p = vs + 1
            while b & 0x80:
                b = data[p]
                off |= (b & 0x7F) << shift
                shift += 7
                p += 1
            # docs/format.md "Varints": a varint64 takes at most 10 bytes, and its value fits
            # 64 bits (ten 7-bit groups hold 70: a larger value is damage, not a handle).
            if shift > 70 or off >> 64:
                raise ValueError("data block offset is not a varint64")
            b = data[p]
            size = b & 0x7F
            shift = 7
            p += 1
            while b & 0x80:
                b = data[p]
                size |= (b & 0x7F) << shift
                shift += 7
                p += 1
            if shift > 70 or size >> 64:
                raise ValueError("data block size is not a varint64")
            if p != ve or off != expect:
                raise ValueError(f"data block handle ({off}, {size}) out of place")
            expect = off + size + BLOCK_TRAILER_SIZE
            offsets.append(off)
            sizes.append(size)
        if expect != data_end:
            raise ValueError(f"data blocks end at {expect}, expected {data_end}")
        if not all(map(operator.lt, keys, keys[1:])):
            raise ValueError("index keys out of order")
    except IndexError:
        raise CorruptionError("index block: truncated block handle", path=block.path,
                              offset=block.offset) from None
    except ValueError as exc:
        raise CorruptionError(f"index block: {exc}", path=block.path, offset=block.offset) from None
    return keys, offsets, sizes
