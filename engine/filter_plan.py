"""Which filter a new table gets: policy and bits per key, decided per output level.

Rules, in order:

1. ``filter_policy=None``: no filter.
2. ``optimize_filters_for_hits`` and the table goes to the *last level* (a compaction output
   with no data in any deeper level: RocksDB's rule, where lookups that reach the last level
   mostly find their key): no filter.
3. ``filter_memory_budget`` set (:func:`plan_new_table`): the budget bounds the filter bytes
   the tables hold, counted as written: whole 4 KiB pages (docs/format.md, "Filter
   partitions"). Monkey (engine/filter_budget.py) solves for the runs the DB will have once the
   tables are written: every L0 table is a run, every deeper level one run, sized by entries
   (current contents with the task's inputs removed and the new entries added), plus the L0
   tables still to come before L0 compacts (up to ``l0_compaction_trigger``, sized like the
   L0 tables the DB has or is flushing). The new tables get their run's bits if their
   page-rounded filters (predicted by ``predicted_region_bytes``, the builder's own rules) fit
   what is *available*: the budget less the filter bytes of the tables that stay, and for a
   compaction also less the pages reserved for the L0 tables to come (flushes go on while it
   runs and count its inputs, not its outputs). Otherwise they get the most bits that fit,
   and no filter when even the weakest filter's pages (one page per table) do not fit.
   Tables already written keep their filters; compactions rewrite them over time.
4. Otherwise ``bits_per_key_per_level`` / ``bits_per_key``.

A table whose bits come out below ``MIN_BITS_PER_KEY`` gets no filter (a filter that weak costs
a probe and saves almost nothing).

Pure functions of (options, levels): thread safe.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .filter_budget import MIN_BITS_PER_KEY, Allocation, allocate
from .format import FILTER_PAGE_SIZE
from .sstable import TableOptions
from .sstable.filter_builder import predicted_region_bytes


@functools.lru_cache(maxsize=4096)
def policy_fpr(policy: str, bits_per_key: float) -> float:
    """The policy's theoretical FPR at ``bits_per_key`` (engine.filters models); 1.0 at 0."""
    if bits_per_key < MIN_BITS_PER_KEY:
        return 1.0
    from .filters import get_policy
    from .filters.fpr import theoretical_fpr

    k = get_policy(policy, bits_per_key).num_probes
    return theoretical_fpr(policy, bits_per_key, k)


def fpr_function(options):
    """bits -> expected FPR for the configured policy (classic Bloom if there is none)."""
    if options.filter_policy is None:
        from .filter_budget import classic_fpr
        return classic_fpr
    return functools.partial(policy_fpr, options.filter_policy)


def runs_of(levels, out_level: int | None = None, new_entries: int = 0,
            removed: dict | None = None) -> tuple[list[int], list[tuple[int, int]], int]:
    """Entries per run (each L0 table, then each non-empty level), projected for a new table.

    ``removed``: {file number: entries} of compaction inputs that will be gone. Returns
    (entries per run, (level, L0 index or -1) per run, index of the new table's run or -1).
    """
    removed = removed or {}
    runs: list[int] = []
    ids: list[tuple[int, int]] = []
    target = -1
    for i, f in enumerate(levels[0]):
        if f.number not in removed:
            runs.append(f.num_entries)
            ids.append((0, i))
    if out_level == 0:
        target = len(runs)
        runs.append(new_entries)
        ids.append((0, -1))
    for n in range(1, len(levels)):
        total = sum(f.num_entries for f in levels[n] if f.number not in removed)
        if n == out_level:
            total += new_entries
            target = len(runs)
        if total or n == out_level:
            runs.append(total)
            ids.append((n, -1))
    return runs, ids, target


def is_last_level(levels, out_level: int) -> bool:
    return out_level > 0 and all(not levels[n] for n in range(out_level + 1, len(levels)))


@dataclass(frozen=True)
class FilterPlan:
    """What :func:`plan_new_table` decided for the tables of one flush or compaction.

    ``bits_per_key``: what the builder gets (0: no filter). ``run_bits_per_key``: Monkey's
    bits for the tables' run (or the configured bits without a budget). With a budget:
    ``available_bytes`` = budget minus the filter bytes of the tables that stay;
    ``predicted_bytes``: the outputs' page-rounded filter bytes at ``bits_per_key``;
    ``limited``: None, ``"fewer-bits"`` (fewer bits than the run's so the pages fit what is
    available) or ``"no-filter"`` (even the weakest filter's pages do not fit).
    """

    bits_per_key: float
    run_bits_per_key: float
    available_bytes: int | None = None
    predicted_bytes: int = 0
    limited: str | None = None


PLAN_SLACK_BLOCKS = 1
"""Planning assumes each filter partition is cut a data block early (block sizes vary)."""
DEFAULT_ENTRY_BYTES = 32
"""Bytes per entry assumed for a flush when the DB has no table to measure yet."""


def _entry_bytes(files) -> float:
    """Data bytes per entry of ``files`` (their size less their filter region), or None."""
    entries = sum(f.num_entries for f in files)
    size = sum(max(0, f.size - f.filter_bytes) for f in files)
    return size / entries if entries and size else None


def output_tables(options, levels, out_level: int, new_entries: int,
                  removed: dict | None = None) -> list[int]:
    """Entries of each table a flush (``out_level`` 0, no ``removed``: one table) or a
    compaction (cut at ``target_file_size``) will write: an estimate from the inputs' bytes per
    entry, erring towards more, smaller tables (more page rounding)."""
    if new_entries <= 0:
        return []
    if not removed:
        return [new_entries]
    inputs = [f for files in levels for f in files if f.number in removed]
    per_entry = _entry_bytes(inputs) or DEFAULT_ENTRY_BYTES
    page = FILTER_PAGE_SIZE
    target = options.target_file_size
    # The writer counts the filter region (and a page of padding) in a table's size.
    data = target - 2 * page if target > 4 * page else target
    per_table = max(1, int(data // per_entry))
    full, rest = divmod(new_entries, per_table)
    return [per_table] * full + ([rest] if rest else [])


def _keys_per_block(options, levels, removed) -> int:
    files = [f for fs in levels for f in fs if removed and f.number in removed]
    if not files:
        files = [f for fs in levels for f in fs]
    per_entry = _entry_bytes(files) or DEFAULT_ENTRY_BYTES
    return int(options.block_size // max(1.0, per_entry)) + 1


def predicted_filter_bytes(options, bits: float, tables: list[int], keys_per_block: int) -> int:
    """Page-rounded filter bytes of tables of ``tables`` entries built at ``bits`` per key."""
    if bits < MIN_BITS_PER_KEY or not tables:
        return 0
    from .filters import get_policy

    policy = get_policy(options.filter_policy, bits)
    page = -(-options.partition_bytes // FILTER_PAGE_SIZE) * FILTER_PAGE_SIZE
    return sum(predicted_region_bytes(policy, n, keys_per_block, page, PLAN_SLACK_BLOCKS)
               for n in tables)


def _l0_reserve(options, levels, runs, ids, out_level: int, new_entries: int) -> list[int]:
    """Entries of the L0 tables still to come before L0 compacts (``l0_compaction_trigger``
    tables in all), sized like the L0 tables the DB has, is removing or is flushing now; none
    without such a table to size them by."""
    in_l0 = sum(1 for level, _ in ids if level == 0)
    if out_level == 0 and new_entries > 0:
        size = new_entries
    elif levels[0]:
        size = sum(f.num_entries for f in levels[0]) // len(levels[0])
    else:
        return []
    return [size] * max(0, options.l0_compaction_trigger - in_l0) if size > 0 else []


def plan_new_table(options, levels, out_level: int, new_entries: int,
                   removed: dict | None = None, last_level: bool = False) -> FilterPlan:
    """The filter of the tables holding ``new_entries`` entries written to ``out_level``
    (``removed``: {file number: entries} of a compaction's inputs). See the module docstring."""
    if options.filter_policy is None:
        return FilterPlan(0.0, 0.0)
    if options.optimize_filters_for_hits and last_level:
        return FilterPlan(0.0, 0.0)
    budget = options.filter_memory_budget
    if budget is None:
        bits = options.bits_for_level(out_level)
        bits = bits if bits >= MIN_BITS_PER_KEY else 0.0
        return FilterPlan(bits, bits)
    runs, ids, target = runs_of(levels, out_level, new_entries, removed)
    reserve = _l0_reserve(options, levels, runs, ids, out_level, new_entries)
    alloc = allocate(runs + reserve, budget)
    run_bits = alloc.bits_per_key[target]
    kpb = _keys_per_block(options, levels, removed)
    held = sum(f.filter_bytes for files in levels for f in files
               if not removed or f.number not in removed)
    if removed:
        # Flushes go on while a compaction runs, and they see its inputs as held, not its
        # outputs: the outputs leave the reserved L0 tables their pages.
        held += sum(predicted_filter_bytes(options, b, [n], kpb)
                    for b, n in zip(alloc.bits_per_key[len(runs):], reserve))
    available = max(0, int(budget) - held)
    if run_bits < MIN_BITS_PER_KEY:
        return FilterPlan(0.0, 0.0, available)
    tables = output_tables(options, levels, out_level, new_entries, removed)

    def cost(b: float) -> int:
        return predicted_filter_bytes(options, b, tables, kpb)

    need = cost(run_bits)
    if need <= available:
        return FilterPlan(run_bits, run_bits, available, need)
    if cost(MIN_BITS_PER_KEY) > available:
        return FilterPlan(0.0, run_bits, available, 0, "no-filter")
    lo, hi = MIN_BITS_PER_KEY, run_bits  # cost(lo) fits, cost(hi) does not; cost rises with b
    for _ in range(40):
        mid = (lo + hi) / 2
        if cost(mid) <= available:
            lo = mid
        else:
            hi = mid
        if hi - lo < 0.01:
            break
    return FilterPlan(lo, run_bits, available, cost(lo), "fewer-bits")


def bits_for_new_table(options, levels, out_level: int, new_entries: int,
                       removed: dict | None = None, last_level: bool = False) -> float:
    """Bits per key for the tables of ``new_entries`` entries written to ``out_level`` (0: no
    filter): :func:`plan_new_table`'s ``bits_per_key``."""
    return plan_new_table(options, levels, out_level, new_entries, removed,
                          last_level).bits_per_key


def table_options(options, bits_per_key: float) -> TableOptions:
    """TableOptions for a new table with ``bits_per_key`` (0: no filter)."""
    policy = options.filter_policy if bits_per_key >= MIN_BITS_PER_KEY else None
    return TableOptions(block_size=options.block_size, restart_interval=options.restart_interval,
                        data_block_hash_index=options.data_block_hash_index,
                        filter_policy=policy, bits_per_key=bits_per_key if policy else 10.0,
                        partition_bytes=options.partition_bytes)


def current_allocation(options, levels) -> tuple[Allocation, list[tuple[int, int]], list[int]]:
    """Monkey's allocation for the DB's current shape (for filter_report)."""
    runs, ids, _ = runs_of(levels)
    budget = options.filter_memory_budget
    if budget is None:
        # The memory the tables were built for (bits per key x keys), not their page-rounded
        # filter bytes: a DB of uniform 10 bits/key compares with uniform 10 bits/key.
        budget = sum(f.filter_bits_per_key * f.num_entries for files in levels
                     for f in files) / 8
    return allocate(runs, budget, fpr_function(options)), ids, runs
