"""Builds the partitioned filter: the page-aligned filter region and the top-level filter index
(docs/format.md, "Filter partitions", "Placement" and "Filter index block").

Consecutive data blocks are grouped into partitions; each partition is one filter (built by the
table's policy) over the keys of its blocks, stored on its own pages, so a probe reads one
partition and ``madvise(DONTNEED)`` of a partition drops exactly its pages.

The sequence of calls must be ``(add_key* end_block)* finish``; ``end_block`` is called with
the data block's index separator, after the block's last key and before the next block's first.
Not thread safe.
"""

from __future__ import annotations

import struct

from ..checksum import masked_crc
from ..format import FILTER_PAGE_SIZE
from .block_builder import BlockBuilder
from .coding import put_varint

_U32 = struct.Struct("<I")


def round_up_pages(n: int) -> int:
    return -(-n // FILTER_PAGE_SIZE) * FILTER_PAGE_SIZE


class PartitionedFilterBuilder:
    """Collects keys per partition and builds each partition once its blocks are complete.

    ``partition_bytes`` (a multiple of the page size) is the target size of a partition: blocks
    join the current partition while its keys plus one more block's worth (the running average)
    fit that size at the policy's bits per key. ``blocks_per_partition`` overrides the rule with
    a fixed group size. Each partition is then built with ``size_bytes`` = its pages, so the
    filter fills them (effective bits per key >= configured).
    """

    def __init__(self, policy, partition_bytes: int, blocks_per_partition: int | None = None):
        self.policy = policy
        self._page_bytes = round_up_pages(max(partition_bytes, 1))
        self._fixed_blocks = blocks_per_partition
        self._capacity = self._keys_that_fit(self._page_bytes)
        self._keys: list[bytes] = []
        self._blocks_in_partition = 0
        self._first_block = 0
        self._num_blocks = 0
        self._num_keys = 0
        # Built partitions: (separator, filter bytes, first data block, number of keys).
        self.partitions: list[tuple[bytes, bytes, int, int]] = []
        self.region_bytes = 0

    def _keys_that_fit(self, size: int) -> int:
        """The most keys whose filter, at the configured bits per key, fits ``size`` bytes."""
        est = self.policy.estimate_size
        lo, hi = 0, size * 8 + 1
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if est(mid) <= size:
                lo = mid
            else:
                hi = mid - 1
        return max(lo, 1)

    def add_key(self, key: bytes) -> None:
        self._keys.append(key)
        self._num_keys += 1

    def add_keys(self, keys: list) -> None:
        """:meth:`add_key` of each of ``keys``, in order."""
        self._keys.extend(keys)
        self._num_keys += len(keys)

    def end_block(self, separator: bytes) -> None:
        """The data block whose keys were just added ended; ``separator`` is its index key."""
        self._blocks_in_partition += 1
        self._num_blocks += 1
        if self._fixed_blocks is not None:
            full = self._blocks_in_partition >= self._fixed_blocks
        else:
            avg = self._num_keys / self._num_blocks
            full = len(self._keys) + avg > self._capacity
        if full:
            self._cut(separator)

    def finish(self, last_separator: bytes | None) -> None:
        """Build the last partition (if any keys remain) under ``last_separator``."""
        if self._keys:
            self._cut(last_separator)

    def _cut(self, separator: bytes) -> None:
        keys = self._keys
        size = max(self._page_bytes, round_up_pages(self.policy.estimate_size(len(keys))))
        data = bytes(self.policy.build(keys, size_bytes=size))
        self.partitions.append((separator, data, self._first_block, len(keys)))
        self.region_bytes += round_up_pages(len(data))
        self._first_block = self._num_blocks
        self._blocks_in_partition = 0
        self._keys = []

    def estimated_bytes(self) -> int:
        """Region bytes so far plus the pending partition's pages."""
        pending = round_up_pages(self.policy.estimate_size(len(self._keys))) if self._keys else 0
        return self.region_bytes + pending

    def filter_data_bytes(self) -> int:
        """Filter bytes without page padding (for the effective bits per key)."""
        return sum(len(p[1]) for p in self.partitions)

    def index_block(self) -> bytes:
        """The filter index block contents (restart interval 1), one entry per partition:
        separator -> varint64 offset in region, varint64 size, u32 masked CRC32C of the
        partition bytes, varint64 first data block, varint64 number of keys."""
        b = BlockBuilder(1)
        offset = 0
        for sep, data, first_block, nkeys in self.partitions:
            v = bytearray()
            put_varint(v, offset)
            put_varint(v, len(data))
            v += _U32.pack(masked_crc(data))
            put_varint(v, first_block)
            put_varint(v, nkeys)
            b.add(sep, bytes(v))
            offset += round_up_pages(len(data))
        return b.finish()
