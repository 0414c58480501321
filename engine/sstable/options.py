"""Options of one table build (docs/format.md, "SSTable" and "Filter partitions")."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgumentError
from ..format import FILTER_PAGE_SIZE
from .compression import compression_code

# Largest filter partition a builder makes: every partition is built in memory whole, and a
# probe faults in (and filter_memory_cap evicts) one at a time. engine.options caps the DB
# option at the same value.
MAX_PARTITION_BYTES = 1 << 20


@dataclass(frozen=True)
class TableOptions:
    """How :class:`TableBuilder` lays out a table. Readers need none of it (it is all stored).

    ``block_size``: a data block is cut once its contents reach this many bytes (about 4 KiB;
    an entry is never split, so a large value makes one large block).
    ``restart_interval``: keys between restart points inside a data block. 1 (every key whole,
    the default) lets ``Table.get`` binary-search a block without decoding entries
    (``Block.get_whole``); larger values shrink tables with long shared key prefixes.
    ``data_block_hash_index``: with restart interval 1, end each data block of at most 255
    entries with a hash index (docs/format.md, "Data block hash index": 2 bytes per entry,
    ~1.6% of a 4 KiB block of 100-byte values) so a point read hashes to its entry instead of
    binary-searching; a block with more entries (tiny values in big blocks) gets none.
    ``compression``: how data blocks are stored (docs/format.md, "Block compression"):
    ``"none"`` (the default here: a builder used directly writes what it always wrote; the DB
    passes its own ``compression`` option), ``"lz4"`` or ``"zstd"``. A block is kept
    compressed only if that saves at least 1/8; a table with a compressed block is format 3.
    ``filter_policy``: the filter kind (``engine.filters.get_policy`` name); None = no filter.
    ``bits_per_key``: filter bits per key the partitions are sized for (> 0 with a policy).
    ``partition_bytes``: target size of one filter partition. Partitions are whole pages, so
    it is rounded up to a multiple of 4096; consecutive data blocks are grouped into one
    partition while their keys fit it at ``bits_per_key``, then the partition is built to fill
    its pages exactly.
    ``blocks_per_partition``: if set, a fixed number of data blocks per partition instead
    (partitions then take as many pages as their keys need, at least ``partition_bytes``).
    ``creation_time``: the ``creation_time`` property to store, seconds since the Unix epoch;
    None (the default): when the table is finished. A tombstone compaction passes its
    youngest input's time (engine/compaction/births.py).
    """

    block_size: int = 4096
    restart_interval: int = 1
    data_block_hash_index: bool = True
    compression: str = "none"
    filter_policy: str | None = "blocked-bloom"
    bits_per_key: float = 10.0
    partition_bytes: int = 4096
    blocks_per_partition: int | None = None
    creation_time: int | None = None

    def __post_init__(self):
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise InvalidArgumentError(f"block_size must be a positive int, not {self.block_size!r}")
        if not isinstance(self.restart_interval, int) or self.restart_interval < 1:
            raise InvalidArgumentError(
                f"restart_interval must be a positive int, not {self.restart_interval!r}")
        if not isinstance(self.data_block_hash_index, bool):
            raise InvalidArgumentError("data_block_hash_index must be a bool")
        compression_code(self.compression)  # InvalidArgumentError for an unknown name
        if self.filter_policy is not None:
            if not isinstance(self.filter_policy, str):
                raise InvalidArgumentError("filter_policy must be a str or None")
            if not self.bits_per_key > 0:
                raise InvalidArgumentError(
                    f"bits_per_key must be > 0 with a filter, not {self.bits_per_key!r}")
        if (not isinstance(self.partition_bytes, int) or isinstance(self.partition_bytes, bool)
                or not 1 <= self.partition_bytes <= MAX_PARTITION_BYTES):
            raise InvalidArgumentError(
                f"partition_bytes must be an int from 1 to {MAX_PARTITION_BYTES} (1 MiB), "
                f"not {self.partition_bytes!r}")
        bpp = self.blocks_per_partition
        if bpp is not None and (not isinstance(bpp, int) or bpp < 1):
            raise InvalidArgumentError(f"blocks_per_partition must be None or >= 1, not {bpp!r}")
        ct = self.creation_time
        if ct is not None and (not isinstance(ct, int) or isinstance(ct, bool) or ct < 0):
            raise InvalidArgumentError(f"creation_time must be None or an int >= 0, not {ct!r}")

    @property
    def partition_pages_bytes(self) -> int:
        """``partition_bytes`` rounded up to whole filter pages."""
        return -(-self.partition_bytes // FILTER_PAGE_SIZE) * FILTER_PAGE_SIZE
