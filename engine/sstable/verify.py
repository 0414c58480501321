"""Checking every checksum of an open table on demand (``DB.verify``; RocksDB's
``VerifyChecksum``, Cassandra's ``nodetool verify``).

Gets check only the blocks they read, when they read them; a block nobody reads can rot
unseen. :func:`verify_table` reads the whole file again (``pread``, in chunks of about
:data:`CHUNK_BYTES`, never through the table's mappings or the block cache)
and checks, in file order: the footer and the metadata tail (the checks of
:meth:`Table.open <engine.sstable.reader.Table.open>`, docs/format.md "Reading"), every data
block's trailer (type and CRC) and, for a compressed block, that it decompresses to exactly
its stated length (docs/format.md, "Block compression") and passes the O(1) checks of
:class:`~engine.sstable.block.Block`, then that the counts of compressed
blocks and uncompressed bytes agree with the properties; and every filter partition's CRC.
It raises the first CorruptionError, naming the file and the offset of the damaged block or partition; it changes
nothing and leaves the table's own state (mappings, counters) alone.
"""

from __future__ import annotations

import struct

from ..checksum import crc32c, mask
from ..errors import CorruptionError
from ..format import BLOCK_TRAILER_SIZE, BLOCK_TYPE_DATA
from .block import Block
from .compression import unseal_data
from .handle import BlockHandle
from .reader import Table

CHUNK_BYTES = 1 << 20
"""About this many bytes per read (whole blocks or partitions; one larger block is read alone)."""

_u32_at = struct.Struct("<I").unpack_from


def verify_table(table: Table, progress=None, file=None) -> dict:
    """Check every checksum of ``table`` (module docstring), read through ``file`` (default:
    the table's own descriptor; DB.verify passes the file opened again by its path, so a file
    deleted or replaced on disk is not read through the old descriptor). ``progress(n)`` is
    called with the bytes checked since its last call. Returns ``{"data_blocks",
    "filter_partitions", "bytes"}``; raises CorruptionError on damage, StorageIOError if the
    file cannot be read, ClosedError once the table is closed."""
    file = table._file if file is None else file
    path = table.path
    # A second reader on the same descriptor re-reads and re-checks the footer and the
    # metadata tail; it maps nothing and is dropped without close (the file is the table's).
    fresh = Table(file, path, table.file_number, None, None)
    if progress is not None:
        progress(file.size - fresh.properties.data_bytes - fresh.properties.filter_bytes)
    offsets, sizes = fresh._offsets, fresh._sizes
    i, n = 0, len(offsets)
    compressed = 0
    uncompressed = 0
    while i < n:  # data blocks, a chunk of whole blocks per read
        start = offsets[i]
        j = i + 1
        while j < n and offsets[j] + sizes[j] + BLOCK_TRAILER_SIZE - start <= CHUNK_BYTES:
            j += 1
        end = offsets[j - 1] + sizes[j - 1] + BLOCK_TRAILER_SIZE
        chunk = file.read_at(start, end - start)
        if len(chunk) != end - start:
            raise CorruptionError("data blocks run past the end of the file", path=path,
                                  offset=start + len(chunk))
        for k in range(i, j):
            lo = offsets[k] - start
            size = sizes[k]
            # The stored CRC covers contents + type byte, which lie side by side: one slice and
            # one CRC per block (docs/format.md "SSTable": trailer).
            if (chunk[lo + size] != BLOCK_TYPE_DATA
                    or mask(crc32c(chunk[lo : lo + size + 1])) != _u32_at(chunk, lo + size + 1)[0]):
                # Compressed (checked, then decompressed), or damaged (raises).
                raw = chunk[lo : lo + size + BLOCK_TRAILER_SIZE]
                contents = unseal_data(raw, BlockHandle(offsets[k], size), path)
                if chunk[lo + size] == BLOCK_TYPE_DATA:  # pragma: no cover - unseal_data raised
                    raise CorruptionError("data block: bad trailer", path=path, offset=offsets[k])
                # A stream that decodes to the stated length but not to a block (possible only
                # under a valid CRC, so fabricated): the O(1) checks of every block read.
                Block(contents, path=path, offset=offsets[k])
                compressed += 1
                uncompressed += len(contents) + BLOCK_TRAILER_SIZE
            else:
                uncompressed += size + BLOCK_TRAILER_SIZE
        if progress is not None:
            progress(end - start)
        i = j
    props = fresh.properties
    if (compressed, uncompressed) != (props.compressed_data_blocks,
                                      props.uncompressed_data_bytes):
        raise CorruptionError(
            f"data blocks: {compressed} compressed, {uncompressed} bytes uncompressed; the "
            f"properties say {props.compressed_data_blocks} and "
            f"{props.uncompressed_data_bytes}", path=path, offset=0)
    partitions = 0
    f = fresh._filter
    if f is not None:
        base = f.region_offset
        for p in range(f.num_partitions):
            off, size = base + f._offsets[p], f._sizes[p]
            data = file.read_at(off, size)
            if len(data) != size or mask(crc32c(data)) != f._crcs[p]:
                raise CorruptionError(f"filter partition {p}: checksum mismatch", path=path,
                                      offset=off)
            partitions += 1
        if progress is not None:
            progress(fresh.properties.filter_bytes)
    return {"data_blocks": n, "filter_partitions": partitions, "bytes": file.size}
