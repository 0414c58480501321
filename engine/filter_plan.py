"""Which filter a new table gets: policy and bits per key, decided per output level.

Rules, in order:

1. ``filter_policy=None``: no filter.
2. ``optimize_filters_for_hits`` and the table goes to the *last level* (a compaction output
   with no data in any deeper level: RocksDB's rule, where lookups that reach the last level
   mostly find their key): no filter.
3. ``filter_memory_budget`` set: Monkey (engine/filter_budget.py) over the runs the DB will
   have once the table is written: every L0 table is a run, every deeper level one run, sized
   by entries (current level contents with the task's inputs removed and the new entries
   added) and weighted by its *coverage*, the estimated share of missing-key gets that probe
   it (:func:`coverage_of`: a level whose tables span part of the key range is probed only
   there). The table gets the bits of its run. While the DB holds fewer keys than the budget
   covers at ``bits_per_key`` (its *capacity*), the levels are planned scaled up to the
   capacity (the keys still to come land in them), so an early table gets about the bits it
   will have in the full DB instead of most of the budget; with no level yet, the keys to come
   are one more run probed by every miss.
   L0 tables are transient and deeper filters live until rewritten, so the levels do not fund
   L0: a table for L1+ is planned with the L0 tables' entries counted as keys to come (as if
   already in the levels), and only a flush (a new L0 table) is planned against the L0 tables
   and the levels together, which gives it Monkey's extra bits for a small run that every miss
   probes. Funding L0 from the levels (before) won while L0 tables existed and lost once a
   compaction emptied L0, the levels keeping the bits they had given up; planned this way the
   filters hold more than the budget while L0 tables exist (their extra bits) and about the
   budget once L0 is empty (bench/results/filter_budget.md).
   Tables already written keep their filters; compactions rewrite them over time, so the
   allocation converges as data moves down. The budget is therefore a plan for new tables, not
   a hard bound: the filters held can exceed it while a DB grows or L0 piles up, and
   partitions are whole 4 KiB pages (a table of a few thousand keys holds a page whatever its
   bits). ``filter_report()["budget"]`` shows the bytes held against the budget;
   ``filter_memory_cap`` bounds resident filter memory.
4. Otherwise ``bits_per_key_per_level`` / ``bits_per_key``.

A table whose bits come out below ``MIN_BITS_PER_KEY`` gets no filter (a filter that weak costs
a probe and saves almost nothing).

Pure functions of (options, levels): thread safe.
"""

from __future__ import annotations

import functools
from bisect import bisect_left

from .filter_budget import MIN_BITS_PER_KEY, Allocation, allocate
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


def _key_scale(lo: bytes, hi: bytes):
    """key -> position in [0, 2^64): the 8 bytes after the common prefix of ``lo`` and ``hi``
    (the smallest and largest key of the DB), big-endian. Linear in the key bytes: exact for
    uniformly random keys, monotone (so ranges keep their order) for any."""
    p = 0
    for a, b in zip(lo, hi):
        if a != b:
            break
        p += 1

    def pos(key: bytes) -> int:
        return int.from_bytes(key[p:p + 8].ljust(8, b"\0"), "big")
    return pos


def coverage_of(levels, ids: list[tuple[int, int]], runs: list[int],
                removed: dict | None = None, out_level: int | None = None) -> list[float]:
    """Per run of :func:`runs_of`: the estimated probability that a missing-key get probes it
    (a get probes a run only where one of its tables' key ranges holds the key).

    Misses are assumed to fall where the DB's keys are. The key density is estimated from the
    tables alone: a table's entries lie uniformly over its key range (positions by
    :func:`_key_scale`), and at each point the density is that of the run with the most
    entries per unit of key space there (each run's keys are a sample of the DB's keys; the
    densest is the best one, and adding runs up would count a region twice where a small run
    overlaps a big one). A run's coverage is the density mass inside its tables' ranges over
    the whole mass. For uniformly random keys this is the share of the key space it spans. The
    new table of a flush (range unknown) and runs without tables cover 1; a compaction output
    covers its inputs' ranges (``removed`` names them, ``out_level`` is its level).
    Pure function of the version: O(R T log T) for R runs and T tables.
    """
    removed = removed or {}
    run_of = {rid: i for i, rid in enumerate(ids)}
    pieces: list[tuple[int, bytes, bytes, int]] = []  # (run index, smallest, largest, entries)
    for level, files in enumerate(levels):
        for j, f in enumerate(files):
            if f.number in removed:
                rid = (out_level, -1) if out_level else None
            else:
                rid = (0, j) if level == 0 else (level, -1)
            if rid in run_of:
                pieces.append((run_of[rid], f.smallest, f.largest, f.num_entries))
    cov = [1.0] * len(runs)
    if not pieces:
        return cov
    pos = _key_scale(min(p[1] for p in pieces), max(p[2] for p in pieces))
    spans = []
    for r, a, b, n in pieces:
        x, y = pos(a), pos(b)
        spans.append((r, x, max(y, x + 1), n))  # a one-key table spans one position
    xs = sorted({x for _r, x, _y, _n in spans} | {y for _r, _x, y, _n in spans})
    segs = len(xs) - 1
    if segs <= 0:
        return cov
    dens = [[0.0] * segs for _ in runs]  # per run, per segment: entries per position
    for r, x, y, n in spans:
        d = dens[r]
        per = n / (y - x)
        for k in range(bisect_left(xs, x), bisect_left(xs, y)):
            d[k] += per
    width = [xs[k + 1] - xs[k] for k in range(segs)]
    mass = [max(d[k] for d in dens) * width[k] for k in range(segs)]
    total = sum(mass)
    if total <= 0:
        return cov
    has = {r for r, _x, _y, _n in spans}
    for i in has:
        d = dens[i]
        cov[i] = min(1.0, sum(m for m, v in zip(mass, d) if v > 0) / total)
    return cov


def keys_to_come(options, runs: list[int]) -> int:
    """Keys the budget covers at ``bits_per_key`` that the runs do not hold yet (0 once the DB
    is at or past that capacity): :func:`bits_for_new_table` scales the levels up to hold
    them (one more run while there is no level)."""
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
        runs, ids, target = runs_of(levels, out_level, new_entries, removed)
        cov = coverage_of(levels, ids, runs, removed, out_level)
        to_come = keys_to_come(options, runs)
        lvs = [lv for lv, _j in ids]
        if out_level > 0:  # the levels do not fund L0: its keys count as keys to come
            keep = [i for i in range(len(runs)) if lvs[i] > 0]
            to_come += sum(runs[i] for i in range(len(runs)) if lvs[i] == 0)
            target = keep.index(target)
            runs = [runs[i] for i in keep]
            lvs = [lvs[i] for i in keep]
            cov = [cov[i] for i in keep]
        deep = sum(n for n, lv in zip(runs, lvs) if lv > 0)
        if to_come and deep:
            # The keys to come land in the levels: plan every level scaled up to hold them
            # (same coverage), rather than as one more run that every miss probes.
            f = (deep + to_come) / deep
            runs = [n * f if lv > 0 else n for n, lv in zip(runs, lvs)]
            to_come = 0
        runs = runs + [to_come]
        cov = cov + [1.0]
        alloc = allocate(runs, options.filter_memory_budget, fpr_function(options),
                         coverage=cov)
        bits = alloc.bits_per_key[target]
    else:
        bits = options.bits_for_level(out_level)
    return bits if bits >= MIN_BITS_PER_KEY else 0.0


def table_options(options, bits_per_key: float) -> TableOptions:
    """TableOptions for a new table with ``bits_per_key`` (0: no filter)."""
    policy = options.filter_policy if bits_per_key >= MIN_BITS_PER_KEY else None
    return TableOptions(block_size=options.block_size, restart_interval=options.restart_interval,
                        data_block_hash_index=options.data_block_hash_index,
                        compression=options.compression,
                        filter_policy=policy, bits_per_key=bits_per_key if policy else 10.0,
                        partition_bytes=options.partition_bytes)


def current_allocation(options, levels) -> tuple[Allocation, list[tuple[int, int]], list[int],
                                                 list[float]]:
    """Monkey's allocation for the DB's current shape (for filter_report): (allocation, run ids,
    entries per run, coverage per run)."""
    runs, ids, _ = runs_of(levels)
    cov = coverage_of(levels, ids, runs)
    budget = options.filter_memory_budget
    if budget is None:
        # The memory the tables were built for (bits per key x keys), not their page-rounded
        # filter bytes: a DB of uniform 10 bits/key compares with uniform 10 bits/key.
        budget = sum(f.filter_bits_per_key * f.num_entries for files in levels
                     for f in files) / 8
    return allocate(runs, budget, fpr_function(options), coverage=cov), ids, runs, cov
