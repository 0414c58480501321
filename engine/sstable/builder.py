"""Writes one table (docs/format.md, "SSTable"). LevelDB's ``table_builder.cc``, plus the
page-aligned partitioned filter region.

Usage: ``b = TableBuilder(wfile, options); b.add(...)*; props = b.finish()`` (or ``abandon()``).
``finish`` writes everything after the last data block and the footer; it does not sync or
close ``wfile``: the caller syncs, closes and renames. Not thread safe (one writer).

Layout written: data blocks from offset 0 (each sealed with a trailer), zero padding to a page
boundary, the filter region (partitions on page boundaries, each padded to whole pages), then
the metadata tail ``filter index, index, properties, metaindex`` (each sealed) and the footer.
"""

from __future__ import annotations

import time

from ..errors import InvalidArgumentError
from ..filters import get_policy
from ..format import (BLOCK_HASH_MAX_ENTRIES, BLOCK_HASH_SLOTS_PER_ENTRY,
                      BLOCK_TRAILER_SIZE, BLOCK_TYPE_FILTER_INDEX,
                      BLOCK_TYPE_INDEX, BLOCK_TYPE_METAINDEX, BLOCK_TYPE_PROPERTIES, ENTRY_TAG,
                      FILTER_PAGE_SIZE, KIND_DELETE, KIND_VALUE, MAX_SEQUENCE,
                      META_FILTER_INDEX, META_PROPERTIES, TABLE_FORMAT_VERSION,
                      TABLE_FORMAT_VERSION_HASHED, TABLE_FORMAT_VERSION_PLAIN)
from ..vfs import WritableFile
from .block_builder import BlockBuilder
from .coding import put_varint
from .compression import compression_code, seal_data
from .filter_builder import PartitionedFilterBuilder, round_up_pages
from .footer import Footer
from .handle import BlockHandle, seal
from .index import shortest_separator
from .options import TableOptions
from .properties import TableProperties, encode_properties

_pack_tag = ENTRY_TAG.pack


def _policy(options: TableOptions):
    """The configured filter policy. get_policy raises InvalidArgumentError (its subclass
    UnknownFilterPolicy for an unknown name) for a bad name or bits per key."""
    if options.filter_policy is None:
        return None
    return get_policy(options.filter_policy, options.bits_per_key)


class TableBuilder:
    """Builds a table into ``wfile`` (which must be empty). See the module docstring."""

    def __init__(self, wfile: WritableFile, options: TableOptions | None = None):
        self._options = options = options if options is not None else TableOptions()
        if wfile.size != 0:
            raise InvalidArgumentError(f"table file {wfile.path} is not empty")
        self._file = wfile
        self._offset = 0
        self._block = BlockBuilder(options.restart_interval, options.data_block_hash_index)
        self._block_size = options.block_size
        self._index = BlockBuilder(1)
        policy = _policy(options)
        self._filter = (PartitionedFilterBuilder(policy, options.partition_pages_bytes,
                                                 options.blocks_per_partition)
                        if policy is not None else None)
        self._last_key: bytes | None = None
        self._pending: BlockHandle | None = None  # last block's handle, awaiting its separator
        self._props = TableProperties(smallest_seq=MAX_SEQUENCE,
                                      compression=options.compression)
        self._compression = compression_code(options.compression)
        self._done = False
        self.num_entries = 0
        # The oldest format that describes what was written (docs/format.md, "Versions"): 1
        # unless some data block carries a hash index (2) or is stored compressed (3), so
        # tables without them stay readable by older readers.
        self._version = TABLE_FORMAT_VERSION_PLAIN

    def add(self, key: bytes, seq: int, kind: int, value: bytes) -> None:
        """Append an entry. REQUIRES: ``key`` > every key added before, ``kind`` in
        (KIND_DELETE, KIND_VALUE), ``0 <= seq < 2**56``; else InvalidArgumentError."""
        self.add_many(((key, seq, kind, value),), 0, 1)

    def add_many(self, entries, start: int, stop: int,
                 max_bytes: int | None = None) -> tuple[int, int]:
        """Append ``entries[start:stop]`` (``(key, seq, kind, value)`` tuples) as :meth:`add`
        of each would; an entry :meth:`add` rejects raises its error, the entries before it
        staying added. Stops early after the entry that brings the key + value bytes added
        by this call to ``max_bytes`` or more. Returns ``(index after the last entry added,
        key + value bytes added)``.

        The bulk path of flushes and compactions (engine/table_writer.py): one loop checks
        each entry, encodes it into the block (inline for restart interval 1, the default;
        through BlockBuilder.add otherwise), collects its key for the filter and counts it in
        the properties (bench/results/db.md, "Session 15: compaction CPU").
        """
        if self._done:
            raise InvalidArgumentError("table builder already finished or abandoned")
        blk = self._block
        inline = blk._interval == 1
        limit = max_bytes if max_bytes is not None else -1
        block_size = self._block_size
        hashing = blk._hash
        fb = self._filter
        p = self._props
        pack_tag = _pack_tag
        buf = blk._buf
        restarts = blk._restarts
        bkeys = blk._keys
        fkeys: list[bytes] = []  # keys of the current block not yet given to the filter
        nent = blk.num_entries
        last = self._last_key
        kbytes = vbytes = tombstones = 0
        small_seq, large_seq = p.smallest_seq, p.largest_seq
        added = 0
        nbytes = 0
        i = start
        try:
            while i < stop:
                key, seq, kind, value = entries[i]
                if type(key) is not bytes:
                    key = bytes(key)
                if type(value) is not bytes:
                    value = bytes(value)
                if last is not None and key <= last:
                    raise InvalidArgumentError(
                        f"key {key[:32]!r} is not greater than {last[:32]!r}")
                if kind != KIND_VALUE and kind != KIND_DELETE:
                    raise InvalidArgumentError(f"bad entry kind {kind!r}")
                if not 0 <= seq <= MAX_SEQUENCE:
                    raise InvalidArgumentError(f"sequence number {seq!r} out of range")
                if self._pending is not None:
                    self._end_block(shortest_separator(last, key))
                elif last is None:
                    p.smallest_key = key
                fkeys.append(key)
                nk = len(key)
                nv = len(value)
                if inline:  # BlockBuilder.add's restart-interval-1 path, inlined
                    if nent:
                        restarts.append(len(buf))
                    if nk < 0x80 and nv < 0x78:  # one-byte varints (nv + 8 < 0x80)
                        buf.append(0)
                        buf.append(nk)
                        buf.append(nv + 8)
                    else:
                        buf.append(0)
                        put_varint(buf, nk)
                        put_varint(buf, nv + 8)
                    buf += key
                    buf += pack_tag(seq << 8 | kind)
                    buf += value
                    nent += 1
                    size = len(buf) + 4 * len(restarts) + 4
                    if hashing:
                        bkeys.append(key)
                        if nent <= BLOCK_HASH_MAX_ENTRIES:
                            size += BLOCK_HASH_SLOTS_PER_ENTRY * nent + 2
                else:
                    size = blk.add(key, pack_tag(seq << 8 | kind) + value)
                    nent = blk.num_entries
                last = key
                if kind == KIND_DELETE:
                    tombstones += 1
                kbytes += nk
                vbytes += nv
                if seq < small_seq:
                    small_seq = seq
                if seq > large_seq:
                    large_seq = seq
                added += 1
                i += 1
                if size >= block_size:
                    blk.num_entries = nent
                    if fb is not None:
                        fb.add_keys(fkeys)
                        fkeys = []
                    self._flush()  # resets the block: new buffers
                    buf = blk._buf
                    restarts = blk._restarts
                    bkeys = blk._keys
                    nent = 0
                nbytes += nk + nv
                if nbytes >= limit >= 0:
                    break
        finally:
            blk.num_entries = nent
            if fb is not None and fkeys:
                fb.add_keys(fkeys)
            self._last_key = last
            self.num_entries += added
            p.raw_key_bytes += kbytes
            p.raw_value_bytes += vbytes
            p.num_tombstones += tombstones
            p.smallest_seq = small_seq
            p.largest_seq = large_seq
        return i, nbytes

    def _flush(self) -> None:
        contents = self._block.finish()
        if contents[-1] & 0x80 and self._version < TABLE_FORMAT_VERSION_HASHED:
            self._version = TABLE_FORMAT_VERSION_HASHED  # bit 31 of the restart count: hashed
        sealed, compressed = seal_data(contents, self._compression)
        size = len(sealed) - BLOCK_TRAILER_SIZE
        self._pending = BlockHandle(self._offset, size)
        self._file.append(sealed)
        self._offset += len(sealed)
        p = self._props
        p.uncompressed_data_bytes += len(contents) + BLOCK_TRAILER_SIZE
        if compressed:
            p.compressed_data_blocks += 1
            self._version = TABLE_FORMAT_VERSION
        self._block.reset()

    def _end_block(self, separator: bytes) -> None:
        self._index.add(separator, self._pending.encode())
        self._pending = None
        if self._filter is not None:
            self._filter.end_block(separator)

    def _write(self, contents: bytes, block_type: int) -> BlockHandle:
        handle = BlockHandle(self._offset, len(contents))
        self._file.append(seal(contents, block_type))
        self._offset += len(contents) + BLOCK_TRAILER_SIZE
        return handle

    def estimated_file_size(self) -> int:
        """Bytes the table would take if finished now (an estimate, for cutting outputs)."""
        size = self._offset + self._block.current_size_estimate()
        size += self._index.current_size_estimate() + 256
        if self._filter is not None:
            size += FILTER_PAGE_SIZE + self._filter.estimated_bytes()
        return size

    def finish(self) -> TableProperties:
        """Write the last block, the filter region, the metadata and the footer.

        Returns the table's properties. Does not sync or close the file.
        """
        if self._done:
            raise InvalidArgumentError("table builder already finished or abandoned")
        self._done = True
        opts = self._options
        p = self._props
        if not self._block.empty:
            self._flush()
        if self._pending is not None:
            self._end_block(self._last_key)
        p.data_bytes = self._offset
        p.num_entries = self.num_entries
        p.num_data_blocks = self._index.num_entries
        if self.num_entries == 0:
            p.smallest_seq = 0
        else:
            p.largest_key = self._last_key
        fb = self._filter
        if fb is not None:
            fb.finish(self._last_key)
            if fb.partitions:
                self._write_filter_region(fb)
            p.filter_policy = fb.policy.name
            p.filter_params = dict(fb.policy.params())
            p.bits_per_key = float(opts.bits_per_key)
            if self.num_entries:
                p.effective_bits_per_key = 8 * fb.filter_data_bytes() / self.num_entries
            p.filter_bytes = fb.region_bytes
            p.num_filter_partitions = len(fb.partitions)
        meta_start = self._offset
        fi_handle = None
        if fb is not None and fb.partitions:
            contents = fb.index_block()
            p.filter_index_bytes = len(contents)
            fi_handle = self._write(contents, BLOCK_TYPE_FILTER_INDEX)
        index_contents = self._index.finish()
        p.index_bytes = len(index_contents)
        index_handle = self._write(index_contents, BLOCK_TYPE_INDEX)
        p.block_size = opts.block_size
        p.restart_interval = opts.restart_interval
        p.partition_bytes = opts.partition_pages_bytes if fb is not None else 0
        p.format_version = self._version
        p.creation_time = int(time.time()) if opts.creation_time is None else opts.creation_time
        props_handle = self._write(encode_properties(p), BLOCK_TYPE_PROPERTIES)
        meta = BlockBuilder(1)
        if fi_handle is not None:
            meta.add(META_FILTER_INDEX, fi_handle.encode())  # names added in sorted order
        meta.add(META_PROPERTIES, props_handle.encode())
        meta_handle = self._write(meta.finish(), BLOCK_TYPE_METAINDEX)
        footer = Footer(meta_handle, index_handle, meta_start, self._version).encode()
        self._file.append(footer)
        self._offset += len(footer)
        return p

    def _write_filter_region(self, fb: PartitionedFilterBuilder) -> None:
        pad = round_up_pages(self._offset) - self._offset
        if pad:
            self._file.append(bytes(pad))
            self._offset += pad
        for _, data, _, _ in fb.partitions:
            padded = round_up_pages(len(data))
            self._file.append(data + bytes(padded - len(data)))
            self._offset += padded

    def abandon(self) -> None:
        """Stop building; the file holds a partial table the caller should delete."""
        self._done = True
        self._filter = None
        self._block.reset()

    @property
    def file_size(self) -> int:
        """Bytes written so far (the file size after :meth:`finish`)."""
        return self._offset
