"""Which filter a new table gets: policy and bits per key, decided per output level.

Rules, in order:

1. ``filter_policy=None``: no filter.
2. ``optimize_filters_for_hits`` and the table goes to the *last level* (a compaction output
   with no data in any deeper level: RocksDB's rule, where lookups that reach the last level
   mostly find their key): no filter.
3. ``filter_memory_budget`` set: Monkey (engine/filter_budget.py) over the runs the DB will
   have once the table is written: every L0 table is a run, every deeper level one run, sized
   by entries (current level contents with the task's inputs removed and the new entries
   added). The table gets the bits of its run. While the DB holds fewer keys than the budget
   covers at ``bits_per_key`` (its *capacity*), the keys still to come are planned as one more
   run below the others (where a growing tree puts them), so an early table gets about the bits
   it will have in the full DB instead of most of the budget. Tables already written keep
   their filters; compactions rewrite them over time, so the allocation converges as data
   moves down. The budget is therefore a plan for new tables, not a hard bound: the filters
   held can exceed it while a DB grows or L0 piles up, and partitions are whole 4 KiB pages
   (a table of a few thousand keys holds a page whatever its bits). ``filter_report()["budget"]``
   shows the bytes held against the budget; ``filter_memory_cap`` bounds resident filter
   memory.
4. Otherwise ``bits_per_key_per_level`` / ``bits_per_key``.

A table whose bits come out below ``MIN_BITS_PER_KEY`` gets no filter (a filter that weak costs
a probe and saves almost nothing).

Pure functions of (options, levels): thread safe.
"""

from __future__ import annotations

import functools

from .filter_budget import MIN_BITS_PER_KEY, Allocation, allocate
from .format import NUM_LEVELS
from .sstable import TableOptions


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


def keys_to_come(options, runs: list[int]) -> int:
    """Keys the budget covers at ``bits_per_key`` that the runs do not hold yet (0 once the DB
    is at or past that capacity): planned as one more run below the others."""
    if options.bits_per_key <= 0:
        return 0
    capacity = int(options.filter_memory_budget * 8 / options.bits_per_key)
    return max(0, capacity - sum(runs))


def is_last_level(levels, out_level: int) -> bool:
    return out_level > 0 and all(not levels[n] for n in range(out_level + 1, len(levels)))


def bits_for_new_table(options, levels, out_level: int, new_entries: int,
                       removed: dict | None = None, last_level: bool = False) -> float:
    """Bits per key for a table of ``new_entries`` entries written to ``out_level``."""
    if options.filter_policy is None:
        return 0.0
    if options.optimize_filters_for_hits and last_level:
        return 0.0
    if options.filter_memory_budget is not None:
        runs, _ids, target = runs_of(levels, out_level, new_entries, removed)
        runs = runs + [keys_to_come(options, runs)]
        alloc = allocate(runs, options.filter_memory_budget, fpr_function(options))
        bits = alloc.bits_per_key[target]
    else:
        bits = options.bits_for_level(out_level)
    return bits if bits >= MIN_BITS_PER_KEY else 0.0


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
