"""Reads one table (docs/format.md, "SSTable"). LevelDB's ``table.cc`` with a lazily mapped,
partitioned filter.

:meth:`Table.open` reads only the footer and the metadata tail (filter index, index, properties,
metaindex: two ``pread`` calls), verifies their checksums and keeps the index and the filter
index in memory as plain lists. It neither reads nor maps the filter region.

``get`` checks the key range, then probes the key's filter partition (mapping the region on the
first probe), and only on "may match" finds the key's data block, searching the index over that
partition's blocks only (docs/format.md invariant 7, checked at open), and reads it. How it
reads the block:

* ``mmap_reads=True`` (the DB's default, LevelDB's choice on 64-bit hosts): the data blocks
  are mapped read-only (``MADV_RANDOM``) on the first get that needs one: no system call, and
  the block cache is not consulted (the OS page cache is the cache; copying a 4 KiB block into
  an LRU costs more than slicing it again, ``bench/results/db.md`` bench 6). Each get slices
  its block and checks its CRC (``verify_every_read=True``, the DB's default): against the
  trailer on the block's first read, later against the checksum that read found (``_crc_of``:
  no second read of the trailer, the same check of the bytes). Those later reads of a
  hash-indexed block run as one compiled call where engine/speedups.py has its module
  (``_read_verified``: the same copy, checksum, lookup and decode; any other case goes the
  Python way). With ``verify_every_read=False`` only a block's first get does; once it
  passed and the block has a hash index, later gets read the few bytes they need in place
  (:func:`~engine.sstable.block.find_hashed`: no copy, no CRC; 10-25% faster gets,
  ``bench/results/db.md`` "Session 7"). The price: a mapping shows what the disk holds now,
  not the checked copy a block cache would keep, so damage that appears on disk under the
  open table after a block's first read can come back as a wrong value until the table is
  reopened.
* ``mmap_reads=False``: one ``pread`` per block through the block cache, if any.

A compressed data block (docs/format.md "Block compression") is checked (CRC of the stored
bytes) and then decompressed (engine/sstable/compression.py); its contents always go through
the block cache, mapped reads included: a mapped get that finds the block compressed marks it
(``_in_place[i] = 2``) and later gets look in the cache first, so a hot block is decompressed
once. Raw blocks keep the paths above.

Tables written with restart interval 1 (the properties say so) are searched by
:func:`~engine.sstable.block.find_whole` on the verified contents, and the cache holds those
contents; other tables build and cache a :class:`Block`. Scans (``iterate``) always read with
``pread`` through the block cache, so the kernel's readahead serves them.
A checksum mismatch in a data block raises CorruptionError naming the file and offset; a filter
partition that fails its checksum, or a filter policy this build does not know, answers "may
match" and counts a ``filter_error``: errors never turn into a false "absent".

Thread safety: after ``open``, ``get``/``may_match``/``iterate``/``release_partition`` may run
from many threads (statistics are plain ints, updated without a lock). REQUIRES: no call in
flight when ``close`` runs; calls after ``close`` raise ClosedError (a get racing ``close`` on a
mapped table also gets ClosedError: slicing a closed mapping fails cleanly, it never reads
another file).

A mapped table's file must not shrink while it is open (the same rule as LevelDB's mapped
reads): a page past the end of a truncated file raises SIGBUS, as does a disk read error (EIO)
under a mapped page, where ``pread`` would raise StorageIOError. Tables are immutable and only
the DB deletes them, after closing them. The mapping holds its own file descriptor (CPython's
mmap duplicates it): a mapped table uses three (file, filter region, data); if the OS refuses
the mapping (EMFILE near the open-file limit, ENOMEM), the table falls back to ``pread`` and
counts ``map_failures``.
"""

from __future__ import annotations

import itertools
import mmap
import struct
import threading
from array import array
from bisect import bisect_left
from typing import Iterator

import google_crc32c

from .. import speedups
from ..checksum import MASK_DELTA as _MASK_DELTA, mask
from ..errors import ClosedError, CorruptionError, StorageIOError
from ..filters import UnknownFilterPolicy, policy_from_stored_name
from ..format import (BLOCK_COMPRESSION_SHIFT, BLOCK_HASH_FLAG, BLOCK_KIND_MASK,
                      BLOCK_TRAILER_SIZE, BLOCK_TYPE_DATA, BLOCK_TYPE_FILTER_INDEX,
                      BLOCK_TYPE_INDEX, BLOCK_TYPE_METAINDEX, BLOCK_TYPE_PROPERTIES,
                      ENTRY_TAG, KIND_DELETE, KIND_VALUE, META_FILTER_INDEX, META_PROPERTIES,
                      TABLE_FOOTER_SIZE)
from ..vfs import FileSystem
from .block import (Block, block_layout, find_hashed, find_whole, restart_entries,
                    seek_restart)
from .filter_builder import round_up_pages
from .filter_reader import PartitionedFilter
from .footer import Footer
from .compression import decompress, unseal_data
from .handle import BlockHandle, decode_handle, unseal
from .index import decode_index
from .properties import decode_properties

_tag_at = ENTRY_TAG.unpack_from
_u32_at = struct.Struct("<I").unpack_from
_DATA_TYPE_BYTE = bytes((BLOCK_TYPE_DATA,))
_HASH_FLAG_TOP = BLOCK_HASH_FLAG >> 24  # the flag in the top byte of the restart count
# engine/checksum.py's CRC32C (google-crc32c) without its type checks: contents are bytes here.
_crc_value = google_crc32c.value
# engine/speedups.py: Table.get's checked read of a verified block in one compiled call
_read_verified = speedups.native.read_verified if speedups.native is not None else None
_SLOW = speedups.native.SLOW if speedups.native is not None else None
_crc_extend = google_crc32c.extend
_anonymous_ids = itertools.count(1)
_chain_lists = itertools.chain.from_iterable
SCAN_FIRST_RESTARTS = 4
"""Restart intervals decoded into a scan's first list (``Table.blocks``): 4 entries with
restart interval 1, so a seek that reads one entry decodes a few, not its whole block."""


def _filter_decoder(name: str, params: dict):
    """The policy that reads filters stored under ``name``/``params``, or None if this build
    cannot read them (the table then answers "may match" and counts filter errors)."""
    try:
        return policy_from_stored_name(name, params)
    except UnknownFilterPolicy:
        return None


class Table:
    """An open, immutable table. See the module docstring; build with :meth:`open`."""

    def __init__(self, file, path: str, file_number: int, block_cache, residency,
                 mmap_reads: bool = False, verify_every_read: bool = True):
        self._file = file
        self.path = path
        self.file_number = file_number
        self.file_size = size = file.size
        self._cache = block_cache
        self._scan_cache = block_cache  # iterate() reads through the cache in both modes
        self._data_map: mmap.mmap | None = None
        self._map_lock = threading.Lock()
        self.map_failures = 0  # data mappings the OS refused (the table then preads)
        # Blocks of tables opened without a file number must not collide in a shared cache.
        self._cache_id = file_number if file_number else -next(_anonymous_ids)
        self._closed = False
        self.data_blocks_read = 0  # data blocks consulted by get (cache hits included)
        self.scan_blocks_read = 0  # data blocks consulted by iterate (scans, compactions)
        self.data_block_file_reads = 0  # blocks read from the file (get and iterate)
        if size < TABLE_FOOTER_SIZE:
            raise CorruptionError(f"file of {size} bytes is too short for a table", path=path,
                                  offset=0)
        footer = Footer.decode(file.read_at(size - TABLE_FOOTER_SIZE, TABLE_FOOTER_SIZE), size,
                               path)
        start = footer.meta_start
        tail = file.read_at(start, size - TABLE_FOOTER_SIZE - start)

        def meta_block(handle: BlockHandle, block_type: int) -> Block:
            lo = handle.offset - start
            hi = lo + handle.size + BLOCK_TRAILER_SIZE
            if lo < 0 or hi > len(tail):
                raise CorruptionError("block handle outside the metadata tail", path=path,
                                      offset=handle.offset)
            return Block(unseal(tail[lo:hi], handle, block_type, path), path=path,
                         offset=handle.offset)

        metaindex = meta_block(footer.metaindex, BLOCK_TYPE_METAINDEX)
        handles = {}
        try:
            for name, vs, ve in metaindex.whole_entries():
                handle, end = decode_handle(metaindex.data, vs, ve)
                if end != ve:
                    raise ValueError("trailing bytes")
                handles[name] = handle
        except ValueError as exc:
            raise CorruptionError(f"metaindex: {exc}", path=path,
                                  offset=footer.metaindex.offset) from None
        if META_PROPERTIES not in handles:
            raise CorruptionError("metaindex has no properties block", path=path,
                                  offset=footer.metaindex.offset)
        self.properties = props = decode_properties(
            meta_block(handles[META_PROPERTIES], BLOCK_TYPE_PROPERTIES))
        self.smallest = props.smallest_key
        self.largest = props.largest_key
        index = meta_block(footer.index, BLOCK_TYPE_INDEX)
        keys, offsets, sizes = decode_index(index, props.data_bytes)
        # Per data block the table keeps its last key (a bytes object, for bisect) and its
        # offset and size in flat arrays: 8 + 8 bytes instead of two int objects and their
        # list slots (~80 bytes). An open table's index then takes ~100 bytes per block
        # instead of ~200 (bench/results/db.md "Session 13").
        self._index_keys = keys
        self._offsets = array("Q", offsets)  # decode_index: each < 2**64 (varint64)
        self._sizes = array("Q", sizes)
        self._nblocks = n = len(keys)
        # Block cache key of block i: _cache_base + its offset (table id above bit 48, block
        # offset below: offsets < 2**48 as files are; a negative id for anonymous tables
        # stays distinct), computed where a get or scan goes to the cache.
        self._cache_base = self._cache_id << 48
        # Every entry a restart point: Table.get searches block contents with find_whole
        # (a pure binary search) and the block cache holds contents, not Blocks.
        self._whole = props.restart_interval == 1
        if n != props.num_data_blocks or (n and self._index_keys[-1] != props.largest_key) \
                or (n == 0) != (props.num_entries == 0):
            raise CorruptionError("index disagrees with the properties", path=path,
                                  offset=footer.index.offset)
        # Mapped reads: gets bypass the block cache (module docstring); an empty table has
        # nothing to map. Compressed blocks are the exception: their decompressed contents
        # go through the block cache (a hot block is decompressed once), found by the
        # _in_place mark of restart-interval-1 tables and, in tables of another interval that
        # hold any compressed block, by every get.
        self._mapped = mmap_reads and n > 0
        if self._mapped and (self._whole or not props.compressed_data_blocks):
            self._cache = None
        # Per data block of a mapped table: 1 (verify_every_read off) once a get has verified
        # its checksum and seen its hash index, so later gets read it in place (find_hashed);
        # 2 once a get found it compressed, so later gets take its decompressed contents from
        # the block cache.
        self._in_place = bytearray(n if self._mapped else 0)
        # Per data block of a mapped restart-interval-1 table (the only gets that read it):
        # the CRC32C (unmasked) of its contents and type byte once a get has checked them
        # against the trailer, -1 before. Later gets compare their copy's CRC with it instead
        # of reading and unmasking the trailer again (~0.3 us of a ~6 us get,
        # bench/results/db.md "Session 19"): the bytes are still checked on every read,
        # against the checksum the file held when the block was first read.
        self._crc_of = array("q", [-1]) * (n if self._mapped and self._whole else 0)
        self._verify_every_read = verify_every_read
        self._filter: PartitionedFilter | None = None
        fi = handles.get(META_FILTER_INDEX)
        # Invariant 4 (docs/format.md, "Invariants"): the meta blocks fill the tail in grammar
        # order, [filter index] index properties metaindex, with no gap and nothing after.
        pos = start
        for handle in (fi, footer.index, handles[META_PROPERTIES], footer.metaindex):
            if handle is None:
                continue
            if handle.offset != pos:
                raise CorruptionError("metadata tail: a meta block is not where the one before "
                                      "it ends", path=path, offset=handle.offset)
            pos = handle.offset + handle.size + BLOCK_TRAILER_SIZE
        if pos != size - TABLE_FOOTER_SIZE:
            raise CorruptionError("metadata tail: bytes between the metaindex and the footer",
                                  path=path, offset=pos)
        region_offset = round_up_pages(props.data_bytes)
        if fi is None:
            if start != props.data_bytes:
                raise CorruptionError("metadata does not follow the data blocks", path=path,
                                      offset=start)
        else:
            if region_offset + props.filter_bytes != start:
                raise CorruptionError("filter region does not end at the metadata", path=path,
                                      offset=start)
            self._filter = PartitionedFilter(
                file, meta_block(fi, BLOCK_TYPE_FILTER_INDEX), region_offset,
                props.filter_bytes, _filter_decoder(props.filter_policy, props.filter_params),
                n, owner=self, residency=residency)
        # Invariant 7: the properties' partition count agrees with the filter index, and each
        # partition's separator is the index key of its last data block (Table.get relies on
        # it: it searches the index only over the blocks of the key's partition).
        if (self._filter.num_partitions if self._filter is not None else 0) \
                != props.num_filter_partitions:
            raise CorruptionError("filter index disagrees with the properties", path=path,
                                  offset=fi.offset if fi is not None else start)
        if self._filter is not None and self._filter.separators != [
                keys[e - 1] for e in self._filter.block_ends]:
            raise CorruptionError("filter index separators disagree with the index", path=path,
                                  offset=fi.offset)

    @classmethod
    def open(cls, fs: FileSystem, path: str, *, file_number: int = 0, block_cache=None,
             residency=None, mmap_reads: bool = False,
             verify_every_read: bool = True) -> "Table":
        """Open the table at ``path``: reads the footer and the metadata tail only.

        ``mmap_reads``: gets read data blocks from a read-only mapping of the data region
        (made on the first such read, not here) instead of ``pread`` + block cache.
        ``verify_every_read``: mapped gets check a block's checksum on every read; False: on
        its first read only, then read it in place (the module docstring says what that risks).

        Raises CorruptionError (naming the file and offset) if they fail a checksum or the
        format, StorageIOError if the file cannot be read.
        """
        file = fs.open_readable(path)
        try:
            return cls(file, path, file_number, block_cache, residency, mmap_reads,
                       verify_every_read)
        except BaseException:
            file.close()
            raise

    # -- point lookups -----------------------------------------------------------------------
    def get(self, key: bytes) -> tuple[int, int, bytes] | None:
        """``(seq, kind, value)`` of ``key`` (tombstones included), or None if absent.

        Probes the filter before any data block; on a filter negative reads nothing. The hot
        path of every present-key read: the cache lookup and the value decode are inlined, and
        tables written with restart interval 1 search their block with ``find_hashed`` (or
        ``find_whole`` where a block has no hash index).
        """
        if key > self.largest or key < self.smallest:
            return None
        f = self._filter
        if f is None:
            i = bisect_left(self._index_keys, key)
            if i == self._nblocks:  # an empty table (the last index key is the largest key)
                return None
        else:
            # The key's filter partition (p < partitions: the last separator is the largest
            # key); on "may match", the one data block that can hold the key is among the
            # partition's blocks (each separator is its last block's index key, checked at
            # open), so the index is searched over those only.
            p = bisect_left(f.separators, key)
            m = f.may_match_partition(p, key)
            if not m:
                return None
            i = bisect_left(self._index_keys, key, f.first_blocks[p], f.block_ends[p])
            if m is not True:  # no filter answered (UNCHECKED): not a positive, so no true one
                f = None
        self.data_blocks_read += 1
        m = self._data_map
        if m is None and self._mapped and self._map_data():  # the table's first mapped get
            m = self._data_map
        if m is not None and self._whole:
            # Mapped, restart interval 1 (the default).
            off = self._offsets[i]
            end = off + self._sizes[i]
            mark = self._in_place[i]
            if mark == 2:  # compressed: the decompressed contents, through the block cache
                data = self._cached_contents(i)
                r = find_whole(data, key, self.path, off)
            elif mark:
                self.data_block_file_reads += 1
                # verify_every_read off, and the block verified by an earlier get and hash-
                # indexed: read the few bytes the lookup needs in place (no 4 KiB copy and CRC;
                # bench/results/db.md "Session 7").
                try:
                    r = find_hashed(m, off, end, key, self.path, off)
                    if r is None:
                        return None
                    if f is not None:  # counted where the copying path counts it
                        f.true_positives += 1
                    vs, ve = r
                    if ve - vs >= 8:
                        tag = _tag_at(m, vs)[0]
                        kind = tag & 0xFF
                        if kind == KIND_VALUE or kind == KIND_DELETE:
                            return tag >> 8, kind, m[vs + 8 : ve]
                    return self._decode(m, vs, ve, off)  # raises the CorruptionError
                except (CorruptionError, ValueError):
                    if m.closed:  # close() ran: not damage
                        raise ClosedError(f"table {self.path} is closed") from None
                    raise
            else:
                if _read_verified is not None:
                    # A block verified before, hash-indexed, unchanged: the steps below in
                    # one compiled call (engine/speedups.py), or SLOW for any other case.
                    r = _read_verified(m, off, end, key, self._crc_of[i])
                    if r is not _SLOW:
                        self.data_block_file_reads += 1
                        if not self._verify_every_read:
                            self._in_place[i] = 1
                        if r is not None and f is not None:
                            f.true_positives += 1
                        return r
                # A read that checks the block: _read_contents inlined. One slice copies the
                # contents with the trailer's type byte, so one CRC call covers what the
                # trailer's checksum covers (docs/format.md "Blocks"); mask() is inlined.
                try:
                    data = m[off : end + 1]
                except ValueError:  # the mapping was closed: close() ran
                    raise ClosedError(f"table {self.path} is closed") from None
                c = _crc_value(data)
                n = len(data) - 1  # the contents' length
                ok = c == self._crc_of[i] and n == end - off  # checked before: the same bytes
                if not ok:  # the block's first checked read: against its trailer
                    try:
                        stored = _u32_at(m, end + 1)[0]
                    except ValueError:  # the mapping was closed: close() ran
                        raise ClosedError(f"table {self.path} is closed") from None
                    except struct.error:  # the trailer runs past the mapping: a short file
                        stored = None
                    ok = (n == end - off and data[-1] == BLOCK_TYPE_DATA
                          and (((c >> 15 | c << 17) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF
                          == stored)
                    if ok:
                        self._crc_of[i] = c
                if not ok:
                    # Damaged (raises the CorruptionError naming it) or compressed (checked
                    # and decompressed: kept in the block cache, and marked so later gets
                    # look there first).
                    # The type byte is read from the slice, not the mapping again: close()
                    # may have run since (a get then raises ClosedError, never ValueError).
                    compressed = (stored is not None and n == end - off
                                  and data[-1] != BLOCK_TYPE_DATA)
                    # A block cache miss, counted as one (or a hit, if a scan cached it).
                    data = self._cached_contents(i)
                    if compressed:
                        self._in_place[i] = 2
                    r = find_whole(data, key, self.path, off)
                else:
                    self.data_block_file_reads += 1
                    # The restart count's top byte (a u32 at n - 4): its top bit flags a
                    # hash index (find_hashed checks the rest).
                    if n >= 4 and data[n - 1] & _HASH_FLAG_TOP:
                        # The hash index answers, on the contents inside data (no second
                        # copy to drop the type byte).
                        if not self._verify_every_read:
                            self._in_place[i] = 1
                        r = find_hashed(data, 0, n, key, self.path, off)
                    else:
                        data = data[:n]
                        r = find_whole(data, key, self.path, off)
        elif self._whole:  # restart interval 1: search the contents, no Block built or cached
            cache = self._cache
            if cache is None:
                data = self._read_contents(i)
            else:
                ck = self._cache_base + self._offsets[i]
                data = cache.get(ck)
                if data is None:
                    data = self._read_contents(i)
                    cache.insert(ck, data, len(data))
            r = find_whole(data, key, self.path, self._offsets[i])
        else:
            cache = self._cache
            if cache is None:
                block = Block(self._read_contents(i), path=self.path, offset=self._offsets[i])
            else:
                ck = self._cache_base + self._offsets[i]
                block = cache.get(ck)
                if block is None:
                    block = Block(self._read_contents(i), path=self.path,
                                  offset=self._offsets[i])
                    cache.insert(ck, block, len(block.data))
            r = block.get(key)
            data = block.data
        if r is None:
            return None
        if f is not None:
            f.true_positives += 1
        vs, ve = r
        if ve - vs >= 8:
            tag = _tag_at(data, vs)[0]
            kind = tag & 0xFF
            if kind == KIND_VALUE or kind == KIND_DELETE:
                return tag >> 8, kind, data[vs + 8 : ve]
        return self._decode(data, vs, ve, self._offsets[i])  # raises the CorruptionError

    def may_match(self, key: bytes) -> bool:
        """The filter's answer (range check included); True when the table has no filter."""
        if key > self.largest or key < self.smallest:
            return False
        f = self._filter
        return f.may_match(key) if f is not None else self._nblocks > 0

    def _decode(self, data: bytes, vs: int, ve: int, offset: int) -> tuple[int, int, bytes]:
        """``(seq, kind, value)`` of the entry value at ``data[vs:ve]`` of the data block at
        ``offset`` (named by the CorruptionError a malformed value raises)."""
        if ve - vs < ENTRY_TAG.size:
            raise CorruptionError("entry shorter than its tag", path=self.path, offset=offset)
        tag = _tag_at(data, vs)[0]
        kind = tag & 0xFF
        if kind != KIND_VALUE and kind != KIND_DELETE:
            raise CorruptionError(f"bad entry kind {kind}", path=self.path, offset=offset)
        return tag >> 8, kind, data[vs + 8 : ve]

    def block_separators(self) -> list:
        """The index's separator keys, one per data block (a sample of the key distribution)."""
        return list(self._index_keys)

    # -- scans -------------------------------------------------------------------------------
    def iterate(self, start: bytes | None = None, *, fill_cache: bool = True
                ) -> Iterator[tuple[bytes, int, int, bytes]]:
        """Entries ``(key, seq, kind, value)`` in key order from the first key >= ``start``.

        Reads blocks through the block cache (``fill_cache=False``: do not insert what a scan
        reads, e.g. for compaction), a block when the entries before it are used up: the
        lists of :meth:`blocks` chained (``itertools.chain``: no Python frame per entry).
        """
        return _chain_lists(self.blocks(start, fill_cache))

    def blocks(self, start: bytes | None = None, fill_cache: bool = True
               ) -> Iterator[list[tuple[bytes, int, int, bytes]]]:
        """Lists of entries ``(key, seq, kind, value)`` in key order from the first key >=
        ``start``, the next decoded when the one before it has been taken: the first list holds
        the entries of ``SCAN_FIRST_RESTARTS`` restart intervals from the seek's restart point
        (the block's first if ``start`` is None), each next one twice as many (a list ends at
        its block's end), until one list is one whole block. So a short scan decodes a few
        entries and a long one pays a call per block
        (:func:`~engine.sstable.block.restart_entries`). A damaged block raises CorruptionError
        naming the file and the block's offset (its checksum is verified when it is read from
        the file, as every read's is)."""
        n = self._nblocks
        i = 0 if start is None else bisect_left(self._index_keys, start)
        path = self.path
        offsets = self._offsets
        step = SCAN_FIRST_RESTARTS
        while i < n:
            data = self._scan_contents(i, fill_cache)
            off = offsets[i]
            limit, num = block_layout(data, path, off)
            r = seek_restart(data, limit, num, start, path, off)
            while r < num:
                yield restart_entries(data, limit, num, r, r + step, start, path, off)
                start = None
                r += step
                if step < num:
                    step *= 2
            i += 1

    def _scan_contents(self, i: int, fill_cache: bool = True) -> bytes:
        """Data block ``i``'s verified (decompressed) contents for a scan, through the block
        cache (``fill_cache=False``: a block read from the file is not inserted)."""
        self.scan_blocks_read += 1
        cache = self._scan_cache
        if cache is not None:
            ck = self._cache_base + self._offsets[i]
            got = cache.get(ck)
            if got is not None:  # interval-1 tables cache the contents, others the Block
                return got if self._whole else got.data
        contents = self._read_contents(i, False)
        if cache is not None and fill_cache:
            cache.insert(ck, contents if self._whole else
                         Block(contents, path=self.path, offset=self._offsets[i]),
                         len(contents))
        return contents

    def _read_contents(self, i: int, mapped: bool = True) -> bytes:
        """Read data block ``i``'s contents and verify its trailer: from the mapping if the
        table reads mapped (and ``mapped``), else with one ``pread``. Raises CorruptionError
        naming the block's offset (a short read, wrong type or bad CRC); ClosedError once the
        table is closed."""
        offset = self._offsets[i]
        size = self._sizes[i]
        m = self._data_map
        if m is not None and mapped:
            try:
                raw = m[offset : offset + size + BLOCK_TRAILER_SIZE]
            except ValueError:  # the mapping was closed: close() ran
                raise ClosedError(f"table {self.path} is closed") from None
        elif self._closed:
            raise ClosedError(f"table {self.path} is closed")
        elif mapped and self._mapped and self._map_data():
            return self._read_contents(i)
        else:
            raw = self._file.read_at(offset, size + BLOCK_TRAILER_SIZE)
        contents = raw[:size]
        self.data_block_file_reads += 1
        # Fast check of the trailer (type byte, then the masked CRC32C of the stored bytes +
        # type); a compressed block that passes it is decompressed (which raises the
        # CorruptionError of a bad stream); anything else goes through unseal_data, which
        # names the exact failure.
        if len(raw) == size + BLOCK_TRAILER_SIZE:
            t = raw[size]
            if t == BLOCK_TYPE_DATA:
                if (mask(_crc_extend(_crc_value(contents), _DATA_TYPE_BYTE))
                        == _u32_at(raw, size + 1)[0]):
                    return contents
            elif (t & BLOCK_KIND_MASK == BLOCK_TYPE_DATA
                  and mask(_crc_extend(_crc_value(contents), raw[size:size + 1]))
                  == _u32_at(raw, size + 1)[0]):
                return decompress(contents, t >> BLOCK_COMPRESSION_SHIFT, self.path, offset)
        return unseal_data(raw, BlockHandle(offset, size), self.path)  # raises

    def _cached_contents(self, i: int) -> bytes:
        """Data block ``i``'s verified (decompressed) contents through the block cache (the
        scans' cache, which mapped tables keep too): read, checked and inserted on a miss."""
        cache = self._scan_cache
        if cache is None:
            return self._read_contents(i)
        ck = self._cache_base + self._offsets[i]
        data = cache.get(ck)
        if data is None:
            data = self._read_contents(i)
            cache.insert(ck, data, len(data))
        return data

    def _map_data(self) -> bool:
        """Map the data blocks ``[0, data_bytes)`` read-only, ``MADV_RANDOM`` (no readahead
        for point reads); True once mapped. Once per table; concurrent first readers wait for
        one mapping. If the OS refuses the mapping (a mapping holds its own descriptor, so
        EMFILE near the open-file limit; ENOMEM; a file system without mmap), the table reads
        with ``pread`` through the block cache from then on, as LevelDB does past its mapping
        limit, and this returns False: a speed option never turns into read errors."""
        with self._map_lock:
            if self._data_map is not None:
                return True
            if self._closed:
                raise ClosedError(f"table {self.path} is closed")
            if not self._mapped:  # an earlier attempt failed
                return False
            try:
                m = self._file.map(0, self.properties.data_bytes)
            except StorageIOError:
                self._mapped = False
                self._cache = self._scan_cache
                self.map_failures += 1
                return False
            try:
                m.madvise(mmap.MADV_RANDOM)
            except (AttributeError, OSError):  # advice only: reads are right without it
                pass
            self._data_map = m
            return True

    # -- filter memory -----------------------------------------------------------------------
    @property
    def filter_ref(self) -> bytearray:
        """One CLOCK reference byte per filter partition, set to 1 by every probe."""
        f = self._filter
        return f.ref if f is not None else bytearray()

    def release_partition(self, p: int) -> int:
        """``madvise(DONTNEED)`` partition ``p``'s pages; return the bytes released."""
        f = self._filter
        return f.release(p) if f is not None else 0

    @property
    def residency_key(self) -> int | None:
        """Start address of this table's filter mapping (None while nothing is mapped): a
        target for :func:`engine.sstable.residency.resident_bytes` (one smaps pass)."""
        f = self._filter
        return f.mapping_address if f is not None else None

    def filter_stats(self) -> dict:
        """The filter accounting of this table (docs/format.md, "Filter partitions").

        ``resident_bytes`` is measured by the OS: the pages of this table's filter mapping
        present in the process's page tables (``/proc/self/pagemap``, ~10 us; 0 while
        unmapped). ``useful`` = ``negatives`` (probes that saved a read); ``true_positives`` are
        positives whose key ``get`` then found, so ``false_positives`` and ``observed_fpr``
        describe probes made through ``get``.
        """
        f = self._filter
        props = self.properties
        resident_now = f.resident_bytes() if f is not None else 0
        pos = f.positives if f is not None else 0
        neg = f.negatives if f is not None else 0
        tp = f.true_positives if f is not None else 0
        errors = f.filter_errors if f is not None else 0
        fp = max(pos - tp, 0)
        return {
            "policy": props.filter_policy or None,
            "policy_known": f is not None and f.policy is not None,
            "keys": props.num_entries,
            "bits_per_key": props.bits_per_key,
            "effective_bits_per_key": props.effective_bits_per_key,
            "filter_bytes": props.filter_bytes,
            "filter_index_bytes": props.filter_index_bytes,
            "mapped_bytes": f.mapped_bytes if f is not None else 0,
            "resident_bytes": resident_now,
            "partitions": f.num_partitions if f is not None else 0,
            "partitions_touched": f.partitions_touched() if f is not None else 0,
            "partitions_resident": f.partitions_resident() if f is not None else 0,
            "probes": pos + neg + errors,
            "negatives": neg,
            "useful": neg,
            "positives": pos,
            "true_positives": tp,
            "false_positives": fp,
            "filter_errors": errors,
            "observed_fpr": fp / (fp + neg) if fp + neg else None,
        }

    # -- lifetime ----------------------------------------------------------------------------
    def close(self) -> None:
        """Unmap the filter region and close the file. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._filter is not None:
            self._filter.close()
        with self._map_lock:
            m, self._data_map = self._data_map, None
        if m is not None:
            m.close()
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return (f"Table({self.path!r}, entries={self.properties.num_entries}, "
                f"blocks={self._nblocks})")
