"""Block handles and block trailers (docs/format.md, "SSTable": "Grammar", "Blocks").

A handle locates a block's contents: ``varint64 offset, varint64 size``; the size excludes the
5-byte trailer that follows the contents. The trailer is ``u8 block type`` then ``u32 masked
CRC32C`` of the contents followed by the type byte, so a handle that points at the wrong kind of
block, a flipped byte or a short read is reported as :class:`CorruptionError` with the file and
offset, never returned as data.
"""

from __future__ import annotations

from typing import NamedTuple

from ..checksum import crc32c, mask
from ..errors import CorruptionError
from ..format import BLOCK_TRAILER, BLOCK_TRAILER_SIZE
from .coding import get_varint, put_varint


class BlockHandle(NamedTuple):
    offset: int
    size: int

    def encode_to(self, out: bytearray) -> None:
        put_varint(out, self.offset)
        put_varint(out, self.size)

    def encode(self) -> bytes:
        out = bytearray()
        self.encode_to(out)
        return bytes(out)


def decode_handle(data, pos: int = 0, limit: int | None = None) -> tuple[BlockHandle, int]:
    """Decode a handle at ``data[pos:]``; return it and the position after it.

    Raises ValueError on malformed input (callers turn it into a CorruptionError).
    """
    if limit is None:
        limit = len(data)
    offset, pos = get_varint(data, pos, limit)
    size, pos = get_varint(data, pos, limit)
    return BlockHandle(offset, size), pos


def seal(contents: bytes, block_type: int) -> bytes:
    """Return ``contents`` followed by its trailer (type byte and masked CRC32C)."""
    crc = mask(crc32c(bytes((block_type,)), crc32c(contents)))
    return contents + BLOCK_TRAILER.pack(block_type, crc)


def unseal(raw: bytes, handle: BlockHandle, block_type: int, path: str | None) -> bytes:
    """Verify ``raw`` (contents + trailer read at ``handle``) and return the contents.

    Raises CorruptionError (naming ``path`` and ``handle.offset``) on a short read, a wrong block
    type or a checksum mismatch.
    """
    size = handle.size
    if len(raw) != size + BLOCK_TRAILER_SIZE:
        raise CorruptionError(
            f"truncated block: wanted {size + BLOCK_TRAILER_SIZE} bytes, got {len(raw)}",
            path=path, offset=handle.offset)
    btype, stored = BLOCK_TRAILER.unpack_from(raw, size)
    contents = raw[:size]
    if mask(crc32c(raw[size : size + 1], crc32c(contents))) != stored:
        raise CorruptionError("block checksum mismatch", path=path, offset=handle.offset)
    if btype != block_type:
        raise CorruptionError(f"block type {btype}, expected {block_type}",
                              path=path, offset=handle.offset)
    return contents
