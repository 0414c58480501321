"""Data block compression (docs/format.md, "SSTable", "Block compression"; format version 3).

A data block is built as before (engine/sstable/block_builder.py), then :func:`seal_data`
compresses its contents with the table's codec and keeps the compressed form only if it saves
at least 1/8 (RocksDB's ``GoodCompressionRatio``), so one table can mix raw and compressed
blocks. The trailer's type byte names how *this* block is stored: ``BLOCK_TYPE_DATA`` (1) in
its low 4 bits, the compression code (``COMPRESSION_*``, RocksDB's ``CompressionType``
numbers: 4 LZ4, 7 Zstandard) in its high 4 bits; the CRC covers the stored bytes and that type
byte, as for every block. A compressed block's stored contents are ``raw_len varint32`` then
the codec's stream, so a reader knows the size before it decompresses and refuses a length
above ``BLOCK_MAX_UNCOMPRESSED`` without allocating it.

:func:`unseal_data` checks the trailer first (length, CRC, kind), then decompresses; every
failure is a CorruptionError naming the file and the block's offset (never the codec's own
exception, never a wrong answer). Only data blocks are compressed: index, filter index,
properties and metaindex blocks are read once at open and kept, and filter partitions are
probed in place through their mapping.

Thread safety: every function may be called from many threads (Zstandard contexts, which are
not thread safe and cost ~30 us to create, are kept one per thread).
"""

from __future__ import annotations

import threading

import google_crc32c
import lz4.block

from ..checksum import mask
from ..errors import CorruptionError, InvalidArgumentError
from ..format import (BLOCK_COMPRESSION_MIN_SAVING, BLOCK_COMPRESSION_SHIFT, BLOCK_KIND_MASK,
                      BLOCK_MAX_UNCOMPRESSED, BLOCK_TRAILER, BLOCK_TRAILER_SIZE, BLOCK_TYPE_DATA,
                      COMPRESSION_CODES, COMPRESSION_LZ4, COMPRESSION_NONE, COMPRESSION_ZSTD)
from .coding import get_varint, put_varint
from .handle import BlockHandle

ZSTD_LEVEL = 3
"""Zstandard level of new blocks (zstd's and RocksDB's default)."""

_NAMES = {code: name for name, code in COMPRESSION_CODES.items()}
_crc_value = google_crc32c.value
_crc_extend = google_crc32c.extend
_local = threading.local()
_lz4_decompress = lz4.block.decompress


def compression_code(name: str) -> int:
    """The code of a compression name (``"none"``, ``"lz4"``, ``"zstd"``);
    InvalidArgumentError for any other."""
    code = COMPRESSION_CODES.get(name) if isinstance(name, str) else None
    if code is None:
        raise InvalidArgumentError(
            f"compression must be one of {', '.join(COMPRESSION_CODES)}, not {name!r}")
    return code


def _zstd():
    """This thread's (compressor, decompressor); zstandard is imported on first use."""
    ctx = getattr(_local, "zstd", None)
    if ctx is None:
        import zstandard

        ctx = _local.zstd = (
            zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=False,
                                     write_checksum=False, write_dict_id=False),
            zstandard.ZstdDecompressor(), zstandard.frame_content_size, zstandard.ZstdError)
    return ctx


def compress(contents: bytes, code: int) -> bytes | None:
    """The stored form of ``contents`` under ``code`` (``raw_len varint32 | stream``), or None
    when the block is to be stored as built: no codec, larger than BLOCK_MAX_UNCOMPRESSED, or
    the compressed form does not save at least 1/8."""
    n = len(contents)
    if code == COMPRESSION_NONE or n > BLOCK_MAX_UNCOMPRESSED or n == 0:
        return None
    out = bytearray()
    put_varint(out, n)
    if code == COMPRESSION_LZ4:
        out += lz4.block.compress(contents, store_size=False)
    elif code == COMPRESSION_ZSTD:
        out += _zstd()[0].compress(contents)
    else:
        raise InvalidArgumentError(f"unknown compression code {code}")
    if len(out) >= n - n // BLOCK_COMPRESSION_MIN_SAVING:
        return None
    return bytes(out)


def seal_data(contents: bytes, code: int) -> tuple[bytes, bool]:
    """``(stored bytes + trailer, compressed?)`` of one data block: compressed with ``code``
    when that saves at least 1/8, else as built (type byte 1)."""
    stored = compress(contents, code)
    if stored is None:
        stored, btype = contents, BLOCK_TYPE_DATA
    else:
        btype = BLOCK_TYPE_DATA | code << BLOCK_COMPRESSION_SHIFT
    crc = mask(_crc_extend(_crc_value(stored), bytes((btype,))))
    return stored + BLOCK_TRAILER.pack(btype, crc), stored is not contents


def decompress(stored, code: int, path: str | None, offset: int) -> bytes:
    """The block contents that ``stored`` (``raw_len varint32 | stream``, already checked
    against its CRC) holds under ``code``. CorruptionError naming ``path`` and ``offset`` for
    an unknown code, a stated length above BLOCK_MAX_UNCOMPRESSED, a stream the codec rejects
    or one that does not give exactly the stated length."""
    name = _NAMES.get(code)
    if name is None or code == COMPRESSION_NONE:
        raise CorruptionError(f"data block: unknown compression {code}", path=path,
                              offset=offset)
    try:
        raw_len, pos = get_varint(stored, 0, min(len(stored), 5))
    except ValueError:
        raise CorruptionError(f"{name} data block: bad uncompressed length", path=path,
                              offset=offset) from None
    if raw_len > BLOCK_MAX_UNCOMPRESSED:
        raise CorruptionError(f"{name} data block: uncompressed length {raw_len} is over the "
                              f"maximum of {BLOCK_MAX_UNCOMPRESSED}", path=path, offset=offset)
    stream = memoryview(stored)[pos:]  # no copy: both codecs read buffers
    try:
        if code == COMPRESSION_LZ4:
            out = _lz4_decompress(stream, uncompressed_size=raw_len)
        else:
            _, dctx, content_size, _ = _zstd()
            # A frame that states its own size would be decompressed to that size whatever
            # max_output_size says: it must state ours (writers state none).
            stated = content_size(stream)
            if stated != -1 and stated != raw_len:
                raise ValueError(f"frame states {stated} bytes")
            out = dctx.decompress(stream, max_output_size=raw_len, allow_extra_data=False)
    except Exception as exc:  # noqa: BLE001 - lz4.block.LZ4BlockError, zstandard.ZstdError, ...
        raise CorruptionError(f"{name} data block: cannot decompress ({exc})", path=path,
                              offset=offset) from None
    if len(out) != raw_len:
        raise CorruptionError(f"{name} data block: decompressed to {len(out)} bytes, "
                              f"expected {raw_len}", path=path, offset=offset)
    return out


def unseal_data(raw, handle: BlockHandle, path: str | None) -> bytes:
    """Check ``raw`` (stored bytes + trailer read at ``handle``) as a data block and return its
    contents, decompressed if the type byte says so. CorruptionError (naming ``path`` and
    ``handle.offset``) on a short read, a checksum mismatch, another block kind or a block
    that does not decompress; the CRC is checked before anything else is believed."""
    size = handle.size
    if len(raw) != size + BLOCK_TRAILER_SIZE:
        raise CorruptionError(
            f"truncated block: wanted {size + BLOCK_TRAILER_SIZE} bytes, got {len(raw)}",
            path=path, offset=handle.offset)
    btype, crc = BLOCK_TRAILER.unpack_from(raw, size)
    stored = raw[:size]
    if mask(_crc_extend(_crc_value(bytes(stored)), bytes((btype,)))) != crc:
        raise CorruptionError("block checksum mismatch", path=path, offset=handle.offset)
    if btype & BLOCK_KIND_MASK != BLOCK_TYPE_DATA:
        raise CorruptionError(f"block type {btype}, expected {BLOCK_TYPE_DATA}",
                              path=path, offset=handle.offset)
    code = btype >> BLOCK_COMPRESSION_SHIFT
    if code == COMPRESSION_NONE:
        return bytes(stored)
    return decompress(stored, code, path, handle.offset)

