"""The fixed-size table footer (docs/format.md, "SSTable", "Footer").

The last 48 bytes of every table: the metaindex and index handles, ``meta_start`` (where the
metadata tail that :meth:`Table.open` reads in one call begins), the format version, a masked
CRC32C of the fields before it and the magic number. Decoding checks the magic, the CRC, the
version and that every handle lies inside ``[meta_start, file_size - 48)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checksum import masked_crc
from ..errors import CorruptionError
from ..format import (BLOCK_TRAILER_SIZE, TABLE_FOOTER, TABLE_FOOTER_SIZE,
                      TABLE_FORMAT_VERSION, TABLE_FORMAT_VERSIONS_READ, TABLE_MAGIC)
from .handle import BlockHandle

_CRC_COVERS = TABLE_FOOTER_SIZE - 12  # every field before the CRC and the magic


@dataclass(frozen=True)
class Footer:
    metaindex: BlockHandle
    index: BlockHandle
    meta_start: int
    version: int = TABLE_FORMAT_VERSION

    def encode(self) -> bytes:
        fields = (self.metaindex.offset, self.metaindex.size, self.index.offset,
                  self.index.size, self.meta_start, self.version)
        crc = masked_crc(TABLE_FOOTER.pack(*fields, 0, TABLE_MAGIC)[:_CRC_COVERS])
        return TABLE_FOOTER.pack(*fields, crc, TABLE_MAGIC)

    @classmethod
    def decode(cls, data: bytes, file_size: int, path: str | None) -> "Footer":
        """Parse the footer read from the end of a ``file_size``-byte file."""
        at = file_size - TABLE_FOOTER_SIZE
        if len(data) != TABLE_FOOTER_SIZE:
            raise CorruptionError(f"file of {file_size} bytes is too short for a table footer",
                                  path=path, offset=max(at, 0))
        mo, ms, io, is_, meta_start, version, crc, magic = TABLE_FOOTER.unpack(data)
        if magic != TABLE_MAGIC:
            raise CorruptionError("bad table magic number (not a sievekv table, or truncated)",
                                  path=path, offset=at)
        if masked_crc(data[:_CRC_COVERS]) != crc:
            raise CorruptionError("footer checksum mismatch", path=path, offset=at)
        if version not in TABLE_FORMAT_VERSIONS_READ:
            raise CorruptionError(f"unsupported table format version {version}",
                                  path=path, offset=at)
        for off, size in ((mo, ms), (io, is_)):
            if off < meta_start or off + size + BLOCK_TRAILER_SIZE > at:
                raise CorruptionError("footer handle outside the metadata tail",
                                      path=path, offset=at)
        return cls(BlockHandle(mo, ms), BlockHandle(io, is_), meta_start, version)
