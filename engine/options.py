"""Options of :class:`engine.DB`, validated in one place.

Every option is a field of :class:`Options` with its default and a one-line description in the
field's ``metadata["doc"]`` (the CLI's config file mirrors these names; ``Options.describe()``
lists them). ``Options.from_kwargs(**kw)`` is the only constructor the DB uses: an unknown name,
a wrong type or an out-of-range value raises :class:`InvalidArgumentError` naming the option.

Sizes are in bytes. The memtable size counts ``len(key) + len(value) + 176`` per entry: the
memory its Python objects really take (engine/memtable.py ``ENTRY_OVERHEAD``), so
``memtable_bytes`` bounds the memtable's memory as RocksDB's write_buffer_size does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from .errors import InvalidArgumentError
from .format import NUM_LEVELS  # levels L0..L6, as in LevelDB and RocksDB
from .format import COMPRESSION_CODES  # why: compression's doc
from .sstable.options import MAX_PARTITION_BYTES  # why: partition_bytes' doc

MiB = 1 << 20
MAX_KEY_SIZE = 1 * MiB  # why: max_key_size's doc


def _opt(default, doc: str, **kw):
    return field(default=default, metadata={"doc": doc, **kw})


@dataclass(frozen=True)
class Options:
    """The validated options of one DB. Immutable; build with :meth:`from_kwargs`."""

    # -- durability and files ----------------------------------------------------------------
    fs: Any = _opt(None, "engine.vfs.FileSystem (or a subclass) for every file operation (None: the real one)")
    create_if_missing: bool = _opt(True, "create the DB directory and files if missing")
    error_if_exists: bool = _opt(False, "refuse to open a DB that already exists")
    sync: bool = _opt(False, "fsync the write-ahead log before a write returns (per-write override)")
    # -- limits ----------------------------------------------------------------------------------
    max_key_size: int = _opt(64 * 1024, "largest key accepted, bytes (at most 1 MiB: the DB holds a key of max_key_size + 1 bytes as its end-of-range sentinel, and a manifest snapshot is one log record of at most 4 GiB - 1 that holds every table's smallest and largest key, so 1 MiB keys still leave room for 2,048 tables)", lo=1, hi=MAX_KEY_SIZE)
    max_value_size: int = _opt(4 * MiB, "largest value accepted, bytes", lo=0)
    # -- memtable and write stalls ---------------------------------------------------------------
    memtable_bytes: int = _opt(8 * MiB, "memtable memory that triggers a flush: keys + values + 176 bytes per entry, what a memtable's Python objects take (so 8 MiB holds ~28,700 entries of 16-byte keys and 100-byte values). Each shard holds up to 1 + max_frozen_memtables of them", lo=1024)
    max_frozen_memtables: int = _opt(2, "frozen memtables waiting for flush before writers stop", lo=1)
    l0_compaction_trigger: int = _opt(4, "L0 table count that triggers an L0->L1 compaction", lo=1)
    l0_slowdown_trigger: int = _opt(20, "L0 table count at which writes are held to delayed_write_rate, adapted to what compaction keeps up with (RocksDB default; engine/write_controller.py)", lo=1)
    l0_stop_trigger: int = _opt(36, "L0 table count at which writers wait for compaction (RocksDB default)", lo=1)
    slowdown_sleep_s: float = _opt(0.001, "shortest sleep of a write held back by delayed_write_rate, seconds (RocksDB's 1 ms refill: a write over the rate's budget sleeps until its bytes are paid for, and at least this); 0: writes are never slowed, only stopped at l0_stop_trigger. At most 10. Until session 16 every write past l0_slowdown_trigger slept this, whatever compaction could take", lo=0.0, hi=10.0)
    delayed_write_rate: int = _opt(16 * MiB, "bytes/s (keys + values) that writes are held to when L0 reaches l0_slowdown_trigger, at most: the rate falls by 0.8x at each flush or compaction that leaves more compaction debt, 0.6x near l0_stop_trigger, rises by 1.25x as the debt shrinks and by 1.4x when L0 falls under the trigger, and is kept between slowdowns (RocksDB's delayed_write_rate and its adjustments; engine/write_controller.py). Adapting never takes it under 16 KiB/s (RocksDB's floor) nor over this value; a value under 16 KiB/s is used as it is, fixed. A slowed write sleeps its bytes / rate, unbounded (a 1 MiB write at 16 KiB/s: 64 s), ended early when L0 falls under the trigger", lo=1)
    # -- compaction ------------------------------------------------------------------------------
    disable_auto_compactions: bool = _opt(False, "no background compaction (flushes still run)")
    max_bytes_for_level_base: int = _opt(64 * MiB, "target size of L1, bytes", lo=1)
    level_size_multiplier: float = _opt(10.0, "each level's target is this times the previous one", lo=1.0)
    target_file_size: int = _opt(4 * MiB, "size at which compaction starts a new output table", lo=1)
    max_grandparent_overlap_factor: int = _opt(10, "stop an output table when it overlaps this many target sizes of the next level", lo=1)
    tombstone_compaction_ratio: Any = _opt(0.2, "when no level is over its target, compact the table whose share of tombstones (deletions / entries, from the manifest) is highest and at least this, if that compaction as a whole (the table with what it overlaps below) is at least this dense too (0 to 1; 0 or None: off, the old behaviour): an Ln table with nothing below it is rewritten in place without its tombstones, any other goes one level down with its overlaps, so deleted data gives its disk space back without DB.compact(). 0.2 is Cassandra's tombstone_threshold: such a compaction rewrites at most 5 entries per tombstone it drops or moves down; writes without deletes never trigger one; without tombstone_compaction_delay a steady load with deletes whose compactions keep up with its flushes pays more compaction bytes (bench/tombstone_steady_wa.py, 600,000 writes, session 14: with a 768 KiB memtable, +4% to +23% for random deletes and up to +17% for a small queue of 5,000 live keys with 50% deletes; on the bench's scaled-down default of 256 KiB, where flushes keep L0 over its trigger and the rule hardly runs during the load, -3% to +8%, the run-to-run noise), which the delay (default 60 s: only tables that have gone unchanged that long) removes for the small queue and only partly for random deletes (+1% to +16% with it, the held-back work included); deleting 30% of a settled 200k-key DB gives back all but the live data, 90% all but the last flush's tombstones and the values they delete (3.2 MiB against a floor of 2.6, 0.12x of the size before the deletes, session 14; bench/results/db.md \"Session 11: space after deletes\", \"Session 12: idle-time rule for tombstone compactions\", \"Session 14: tombstone compaction write amplification, re-measured after the memtable charge\", \"Session 14: space after deletes, re-measured\")")
    tombstone_compaction_delay: float = _opt(60.0, "seconds the tables of a tombstone compaction (tombstone_compaction_ratio) must have gone unchanged before it may run (0: no wait; any finite value, a huge one such as 1e10 holding them back for good, though tombstone_compaction_ratio 0 is the way to turn the rule off): for L0, no flush into L0 for that long; for a table of L1+, that long since it was written (a table found at open: its stored creation time). Cassandra's tombstone_compaction_interval. Under a steady load that flushes more often than this, L0 goes down by its table count as with the rule off, and a table of L1+ is taken only once compactions have left it alone that long (bench/tombstone_steady_wa.py, 600,000 writes, session 14, three runs each: on options scaled down 32x with a 768 KiB memtable, about the entries per memtable of sessions 11-12, a small queue with 50% deletes wrote 1.00-1.17x the compaction bytes of the rule off without the delay (1.19-1.29x in session 12, 1.54x in session 11) and 0.93-1.00x with it, the held-back work included; random deletes (30% or 50% of the writes) 1.04-1.23x without and 1.01-1.16x with it, where the held-back work runs once idle; queue and ttl 0.91-1.16x either way, within their run-to-run noise. With the scaled-down default of 256 KiB, which at 240 bytes per entry flushes so often that L0 stays over its trigger and the rule hardly runs during the load even without the delay, every load wrote 0.97-1.08x without the delay and 0.89-1.04x with it: there the delay saves nothing measurable; bench/results/db.md \"Session 14: tombstone compaction write amplification, re-measured after the memtable charge\"). The space comes back when the load stops, not during it: at 256 KiB a queue's tables held 10.9-16.6 MiB at the end of the load with the delay, 6.6 MiB without it, 7.2-11.2 MiB with the rule off, and 6.6-6.7 MiB once idle. A DB that goes idle after deletes that left L0 below its trigger gives the space back about this long after its last flush (bench/delete_space.py, session 14, 30% of 200k keys deleted: 18.0 MiB, the floor, after 60.9-61.0 s instead of 0.7 s; deleting 90% fills five memtables, so an l0-count compaction takes all but the last flush's tombstones within a second with or without the delay, and those, too sparse for a task, stay: 3.2 MiB against the floor's 2.6, which delay 0 reaches with 17.0 MiB of compactions instead of 3.1), with no write needed to wake it (a tombstone compaction's outputs keep their inputs' time, so the tombstones go down the levels at once). 60 s: idle DBs give space back within about a minute, and a load of 100-byte values fills the 8 MiB memtable more often than once a minute from about 480 writes/s, so only lighter loads, whose compaction bytes hardly matter, still pay the extra compactions", lo=0.0)
    table_workers: int = _opt(2, "worker processes that write flush and compaction tables off the GIL (0: the DB's own threads; always 0 with a custom fs). Started by the first job that needs one; each exits after 60 s without a job (engine/table_workers.py IDLE_EXIT_S), so an idle shard holds none", lo=0)
    max_subcompactions: int = _opt(1, "split a compaction whose inputs hold at least 4 x target_file_size into up to this many key ranges of about equal input bytes, each written by its own table worker at the same time (RocksDB's max_subcompactions; 1: off). The table worker pool grows by max_subcompactions - 1 processes (each ~35 MiB while busy, none when idle), so flushes keep the table_workers - 1 workers a whole compaction leaves them (none with table_workers 1). With table_workers 0 (or a custom fs) nothing is split. One engine taking 5M puts of 16 + 100 bytes from one thread (bench/sustained_fill.py; bench/results/db.md \"Session 15: subcompactions\"), counting the compaction owed when the last put returns: 39-48k puts/s with it off and 52-61k with 2 on the 2-CPU VM (1.27-1.31x, alternating runs), 50k and 74k on a 16-CPU host; write stalls fall from ~60% of the time to ~31%; peak memory +55 MiB (the third worker)", lo=1, hi=16)
    # -- tables and cache ------------------------------------------------------------------------
    block_size: int = _opt(4096, "data block size, bytes", lo=256)
    restart_interval: int = _opt(1, "keys between restart points in a data block (1: keys stored whole, point reads binary-search the restart array)", lo=1)
    data_block_hash_index: bool = _opt(True, "with restart_interval 1, end each data block of at most 255 entries with a hash index (2 bytes per entry) so a get hashes to its entry instead of binary-searching (blocks with more entries, e.g. tiny values in big blocks, get none)")
    compression: str = _opt("lz4", "how new tables store their data blocks: \"lz4\", \"zstd\" (Zstandard level 3) or \"none\". A block is kept compressed only if that saves at least 1/8, so incompressible values are stored raw: they cost a trial compression per 4 KiB block when a table is written (~12 us with lz4, ~5% of building the table, in the table workers) and nothing on reads. A compressed block is decompressed when a get or scan reads it, and its contents kept in the block cache (block_cache_bytes, mapped reads included): gets that miss the cache pay for it (JSON-like 100-300 B records, 200k keys, 8 MiB cache: tables 0.38x the bytes and 1.7x the time per get with lz4, 0.31x and 2.1-2.2x with zstd; with the 32 MiB default, 74% hits: 1.07-1.25x with lz4, 1.31-1.43x with zstd). Tables keep the setting they were written with until compaction rewrites them; DB.compact() (sievekv compact) rewrites every table written with another setting, which with \"none\" makes the DB readable by versions before table format 3 (docs/format.md \"Versions\", \"Block compression\"; bench/results/db.md \"Session 11: block compression\")")
    block_cache_bytes: int = _opt(32 * MiB, "LRU cache of data blocks, decompressed and checked (bytes, 0: none): the blocks scans read, gets when mmap_reads is off, and with mmap_reads the gets of compressed blocks (compression lz4 or zstd, the default: a get that misses the cache decompresses the block again; raw blocks are read from the mapping). Size it to the hot part of the data, decompressed: JSON-like records, 46.5 MiB of blocks raw, lz4, time per get over compression none: 1.76x at 8 MiB, 1.51x at 16, 1.25x at 32, 1.13x at 64 (bench/results/db.md \"Session 11: block compression\"). 32 MiB is RocksDB's default; a cluster has one per shard", lo=0)
    raise_open_file_limit: bool = _opt(True, "raise the process's soft open-file limit (RLIMIT_NOFILE) to the hard one when the open tables need more descriptors (3 per table; engine/open_files.py). False: leave it, and a table past the limit fails to open")
    mmap_reads: bool = _opt(True, "gets read data blocks from a read-only memory mapping of each table (LevelDB's default on 64-bit), each block's checksum verified on every read (see verify_every_read); raw blocks bypass the block cache, compressed ones are decompressed into it (see block_cache_bytes); costs one more file descriptor per open table; a table the OS will not map reads with pread; a disk error under a mapped page ends the process (SIGBUS) instead of failing the read. False: pread through the block cache")
    verify_every_read: bool = _opt(True, "with mmap_reads, check a data block's checksum on every get that reads it. False: only on the block's first get per open table, later gets reading the entry in place from the mapping (10-25% faster gets, bench/results/db.md \"Session 7\"), and then damage that appears on disk under an open table after a block's first read can be returned as a wrong value until the table is reopened (a block cache keeps the checked copy; a mapping shows what the disk now holds)")
    # -- filters ---------------------------------------------------------------------------------
    filter_policy: Any = _opt("blocked-bloom", "filter kind for new tables (None: no filters)")
    bits_per_key: float = _opt(10.0, "filter bits per key on every level unless overridden", lo=0.0)
    bits_per_key_per_level: Any = _opt(None, "list (index = level) or {level: bits} overriding bits_per_key")
    optimize_filters_for_hits: bool = _opt(False, "build no filter for tables written to the last level")
    filter_memory_budget: Any = _opt(None, "total filter bytes for the DB, allocated across levels by Monkey (None: off); a plan for new tables, not a hard bound (engine/filter_plan.py)")
    filter_memory_cap: Any = _opt(None, "resident filter bytes; past it the coldest partitions are released (None: off)")
    partition_bytes: int = _opt(4096, "target bytes per filter partition, rounded up to 4 KiB pages (64 B to 1 MiB: a partition is the unit a probe faults in and filter_memory_cap evicts, and even a table of one key gets a whole partition; RocksDB's metadata_block_size default is 4 KiB)", lo=64, hi=MAX_PARTITION_BYTES)

    # -------------------------------------------------------------------------------------------
    @classmethod
    def from_kwargs(cls, *, check_filters: bool = True, **kw) -> "Options":
        """Validate ``kw`` and build Options. Unknown names raise InvalidArgumentError.

        ``check_filters=False`` skips the filter policy and bits-per-key checks, which import
        engine.filters (and numpy): only for callers that never open a DB with the result
        (the CLI reading a config for its data_dir)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kw) - known)
        if unknown:
            raise InvalidArgumentError(f"unknown option(s): {', '.join(unknown)}")
        opts = cls(**kw)
        opts._validate()
        if check_filters:
            opts._validate_filters()
        return opts

    @classmethod
    def describe(cls) -> list[tuple[str, Any, str]]:
        """[(name, default, doc)] for every option, in declaration order."""
        return [(f.name, f.default, f.metadata["doc"]) for f in fields(cls)]

    def _validate(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            lo = f.metadata.get("lo")
            if lo is None:
                continue
            kind = type(f.default)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not isinstance(v, int)):
                raise InvalidArgumentError(f"option {f.name} must be a {kind.__name__}, got {v!r}")
            if v < lo or not math.isfinite(v):
                raise InvalidArgumentError(f"option {f.name} must be >= {lo} and finite, got {v!r}")
            hi = f.metadata.get("hi")
            if hi is not None and v > hi:
                raise InvalidArgumentError(f"option {f.name} must be <= {hi}, got {v!r}")
        if self.fs is not None:
            from .vfs import FileSystem  # lazy: only a custom fs needs the class

            if not isinstance(self.fs, FileSystem):
                raise InvalidArgumentError(
                    f"option fs must be None or an engine.vfs.FileSystem, got {type(self.fs).__name__}")
        for f in fields(self):  # every switch (a listed subset missed new ones: "false" is truthy)
            if type(f.default) is bool and not isinstance(getattr(self, f.name), bool):
                raise InvalidArgumentError(
                    f"option {f.name} must be a bool (true or false), got {getattr(self, f.name)!r}")
        if not self.l0_compaction_trigger <= self.l0_slowdown_trigger <= self.l0_stop_trigger:
            raise InvalidArgumentError(
                "options must satisfy l0_compaction_trigger <= l0_slowdown_trigger <= l0_stop_trigger")
        if self.filter_policy is not None and not isinstance(self.filter_policy, str):
            raise InvalidArgumentError("option filter_policy must be a name or None")
        r = self.tombstone_compaction_ratio
        if r is not None and (isinstance(r, bool) or not isinstance(r, (int, float))
                              or not 0 <= r <= 1):
            raise InvalidArgumentError(
                f"option tombstone_compaction_ratio must be None or a number from 0 to 1, got {r!r}")
        for name in ("filter_memory_budget", "filter_memory_cap"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise InvalidArgumentError(f"option {name} must be None or a byte count >= 0")
        per = self.bits_per_key_per_level
        if per is not None:
            items = per.items() if isinstance(per, dict) else enumerate(per) if isinstance(per, (list, tuple)) else None
            if items is None:
                raise InvalidArgumentError("option bits_per_key_per_level must be a list or a dict")
            for level, bits in items:
                if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level < NUM_LEVELS:
                    raise InvalidArgumentError(f"option bits_per_key_per_level: bad level {level!r}")
                if isinstance(bits, bool) or not isinstance(bits, (int, float)) or not 0 <= bits < math.inf:
                    raise InvalidArgumentError(f"option bits_per_key_per_level: bad bits {bits!r} for level {level}")
        if not isinstance(self.compression, str) or self.compression not in COMPRESSION_CODES:
            raise InvalidArgumentError(
                f"option compression must be one of {', '.join(map(repr, COMPRESSION_CODES))}, "
                f"got {self.compression!r}")

    def _validate_filters(self) -> None:
        """The filter policy must be a known name and every configured bits-per-key value
        buildable by it (below the policy's minimum means "no filter"): otherwise the DB would
        open, accept writes, and fail its first flush."""
        if self.filter_policy is None:
            return
        from .filters.base import MAX_BITS_PER_KEY, UnknownFilterPolicy  # lazy: numpy
        from .filters.registry import lookup_class

        try:
            lookup_class(self.filter_policy)
        except UnknownFilterPolicy as exc:
            raise UnknownFilterPolicy(f"option filter_policy: {exc}") from None
        per = self.bits_per_key_per_level
        values = list(per.values() if isinstance(per, dict) else per or ())
        for bits in [self.bits_per_key, *values]:
            if bits > MAX_BITS_PER_KEY:
                raise InvalidArgumentError(
                    f"option bits_per_key/bits_per_key_per_level: {bits!r} is over the filter "
                    f"maximum of {MAX_BITS_PER_KEY:g} bits per key")

    # -------------------------------------------------------------------------------------------
    def bits_for_level(self, level: int) -> float:
        """Configured bits per key for ``level`` (before any filter_memory_budget allocation)."""
        per = self.bits_per_key_per_level
        if isinstance(per, dict):
            return float(per.get(level, self.bits_per_key))
        if per is not None and level < len(per):
            return float(per[level])
        return float(self.bits_per_key)

    def max_bytes_for_level(self, level: int) -> float:
        """Target size of ``level`` >= 1: base * multiplier**(level-1)."""
        return self.max_bytes_for_level_base * self.level_size_multiplier ** (level - 1)
