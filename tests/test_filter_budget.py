"""Monkey allocation: optimality, memory accounting, and the degenerate cases."""

import math
import random

import pytest

from engine.filter_budget import (LN2_SQ, allocate, classic_bits, classic_fpr,
                                  expected_reads_per_miss)


def test_classic_fpr_and_bits_are_inverse():
    for b in (1.0, 5.0, 10.0, 20.0):
        assert classic_bits(classic_fpr(b)) == pytest.approx(b)
    assert classic_fpr(10) == pytest.approx(0.0082, abs=2e-4)
    assert classic_fpr(0) == 1.0 and classic_bits(1.0) == 0.0


def test_equal_runs_get_uniform_bits():
    a = allocate([1000, 1000, 1000], budget_bytes=3000 * 10 // 8)
    for b in a.bits_per_key:
        assert b == pytest.approx(10.0, rel=1e-6)
    assert a.expected_reads_per_miss == pytest.approx(a.uniform_expected_reads_per_miss)


def test_fpr_proportional_to_run_size_and_memory_spent_exactly():
    runs = [10_000, 100_000, 1_000_000, 10_000_000]
    budget = sum(runs) * 8 // 8  # 8 bits per key on average
    a = allocate(runs, budget)
    ratios = [p / n for p, n in zip(a.fpr, runs)]
    for r in ratios:
        assert r == pytest.approx(ratios[0], rel=1e-6)
    assert a.used_bits == pytest.approx(budget * 8, rel=1e-9)
    assert a.bits_per_key[0] > a.bits_per_key[1] > a.bits_per_key[2] > a.bits_per_key[3]
    assert a.expected_reads_per_miss < a.uniform_expected_reads_per_miss


def test_optimum_beats_random_feasible_allocations():
    rnd = random.Random(3)
    runs = [5_000, 5_000, 50_000, 500_000, 5_000_000]
    budget = sum(runs) * 6 // 8
    best = allocate(runs, budget)
    for _ in range(300):
        w = [rnd.random() + 0.01 for _ in runs]
        scale = budget * 8 / sum(wi * n for wi, n in zip(w, runs))
        bits = [wi * scale for wi in w]  # spends the same memory
        assert expected_reads_per_miss(runs, bits) >= best.expected_reads_per_miss - 1e-12


def test_tiny_budget_gives_the_largest_run_no_filter():
    runs = [1_000, 10_000_000]
    a = allocate(runs, budget_bytes=2_000)  # 16k bits: enough only for the small run
    assert a.bits_per_key[1] == 0.0 and a.fpr[1] == 1.0
    assert a.bits_per_key[0] == pytest.approx(16.0)
    assert a.expected_reads_per_miss == pytest.approx(1.0 + classic_fpr(16.0))


def test_empty_and_zero_budget():
    a = allocate([], 1000)
    assert a.bits_per_key == () and a.expected_reads_per_miss == 0.0
    z = allocate([10, 0, 20], 0)
    assert z.bits_per_key == (0.0, 0.0, 0.0)
    assert z.expected_reads_per_miss == 2.0


def test_closed_form_matches_lagrange_condition():
    runs = [3_000, 40_000, 700_000]
    a = allocate(runs, budget_bytes=sum(runs))  # 8 bits/key average
    c = a.fpr[0] / runs[0]
    ln_c = -(a.budget_bits * LN2_SQ + sum(n * math.log(n) for n in runs)) / sum(runs)
    assert math.log(c) == pytest.approx(ln_c)


# ---------------------------------------------------------------------------------------------
# Bounds on bits per key (runs too big for a useful filter, tiny runs at the cap)
# ---------------------------------------------------------------------------------------------
def test_runs_under_the_minimum_get_no_filter_and_the_rest_is_solved_again():
    from engine.filter_budget import MIN_BITS_PER_KEY

    runs = [1000, 10000, 100000]
    a = allocate(runs, 20000)
    assert a.bits_per_key[2] == 0.0
    assert a.bits_per_key[:2] == pytest.approx(allocate(runs[:2], 20000).bits_per_key)
    assert a.used_bits == pytest.approx(20000 * 8)  # nothing spent on the unbuilt filter
    for b in a.bits_per_key:
        assert b == 0.0 or b >= MIN_BITS_PER_KEY


def test_bits_over_the_cap_go_to_the_other_runs():
    from engine.filter_budget import MAX_BITS_PER_KEY

    runs = [10, 1_000_000]
    budget = 1_000_000 * 20 // 8  # the small run would want ~44 bits
    a = allocate(runs, budget)
    assert a.bits_per_key[0] == MAX_BITS_PER_KEY
    assert a.used_bits == pytest.approx(budget * 8)  # the whole budget is spent
    assert a.bits_per_key[1] == pytest.approx((budget * 8 - 10 * MAX_BITS_PER_KEY) / 1_000_000)


def test_every_bound_holds_on_random_shapes():
    from engine.filter_budget import MAX_BITS_PER_KEY, MIN_BITS_PER_KEY

    rnd = random.Random(7)
    for _ in range(300):
        runs = [rnd.choice([0, 1, 10, 300, 5000, 80_000, 2_000_000]) for _ in range(rnd.randrange(1, 9))]
        budget = rnd.choice([10, 1000, 50_000, 5_000_000])
        a = allocate(runs, budget)
        assert a.used_bits <= budget * 8 * (1 + 1e-9)
        for b, n in zip(a.bits_per_key, runs):
            assert b == 0.0 or MIN_BITS_PER_KEY <= b <= MAX_BITS_PER_KEY + 1e-9
            if n == 0:
                assert b == 0.0


# ---------------------------------------------------------------------------------------------
# coverage: a miss probes only the runs whose key ranges hold the key
# ---------------------------------------------------------------------------------------------
def test_coverage_none_is_coverage_one():
    runs = [1000, 40_000, 900_000]
    a = allocate(runs, sum(runs) * 9 // 8)
    b = allocate(runs, sum(runs) * 9 // 8, coverage=[1.0, 1.0, 1.0])
    assert a == b


def test_runs_probed_in_proportion_to_their_size_get_equal_bits():
    """L1 holds 40% of the keys in its 40% of the key space, L2 the rest: a miss probes one of
    them, so equal bits are optimal (classic Monkey gave the smaller L1 more)."""
    runs = [40_000, 60_000]
    a = allocate(runs, sum(runs) * 10 // 8, coverage=[0.4, 0.6])
    assert a.bits_per_key[0] == pytest.approx(a.bits_per_key[1])
    assert a.bits_per_key[0] == pytest.approx(10.0)
    assert a.expected_reads_per_miss == pytest.approx(classic_fpr(10.0))
    classic = allocate(runs, sum(runs) * 10 // 8)
    assert classic.bits_per_key[0] > classic.bits_per_key[1]


def test_covered_fpr_proportional_to_entries_over_coverage_and_beats_feasible_alternatives():
    runs = [20_000, 80_000, 700_000, 50_000]
    cov = [1.0, 0.15, 0.9, 0.05]
    budget = sum(runs) * 8 // 8
    best = allocate(runs, budget, coverage=cov)
    ratios = [p / (n / c) for p, n, c in zip(best.fpr, runs, cov)]
    assert max(ratios) == pytest.approx(min(ratios), rel=1e-6)
    assert best.used_bits == pytest.approx(budget * 8, rel=1e-9)
    assert best.expected_reads_per_miss == pytest.approx(
        expected_reads_per_miss(runs, best.bits_per_key, coverage=cov))
    rnd = random.Random(5)
    for _ in range(200):
        w = [rnd.uniform(0.5, 2.0) for _ in runs]
        scale = budget * 8 / sum(wi * n for wi, n in zip(w, runs))
        bits = [wi * scale for wi in w]
        assert (expected_reads_per_miss(runs, bits, coverage=cov)
                >= best.expected_reads_per_miss - 1e-12)


def test_a_rarely_probed_big_run_gives_up_its_filter_first():
    """The run with the largest entries / coverage loses its filter first, not the largest."""
    a = allocate([100_000, 120_000], budget_bytes=120_000 * 3 // 8, coverage=[0.01, 1.0])
    assert a.bits_per_key[0] == 0.0 and a.bits_per_key[1] > 0.0


def _meta(number, lo, hi, n):
    from engine.version_edit import FileMeta
    return FileMeta(number, n * 20, lo, hi, num_entries=n)


def _levels(*per_level):
    lv = list(per_level)
    while len(lv) < 7:
        lv.append(())
    return tuple(tuple(x) for x in lv)


def _k(x: float) -> bytes:
    """A 16-byte key at position x in [0, 1) of a random key space."""
    return int(x * 2 ** 64).to_bytes(8, "big") + b"\0" * 8


def test_coverage_of_levels_that_split_the_key_range():
    from engine.filter_plan import coverage_of, runs_of

    l0 = [_meta(1, _k(0.001), _k(0.999), 10_000)]
    l1 = [_meta(2, _k(0.0), _k(0.2), 20_000), _meta(3, _k(0.2), _k(0.4), 20_000)]
    l2 = [_meta(4, _k(0.4), _k(0.7), 30_000), _meta(5, _k(0.7), _k(0.99999), 30_000)]
    levels = _levels(l0, l1, l2)
    runs, ids, _ = runs_of(levels)
    cov = coverage_of(levels, ids, runs)
    assert ids == [(0, 0), (1, -1), (2, -1)]
    assert cov[0] == pytest.approx(1.0, abs=0.01)
    # Random keys: the share of the key space each level spans (L0's sparse table, which
    # overlaps both, does not count its region twice).
    assert cov[1] == pytest.approx(0.4, rel=0.01)
    assert cov[2] == pytest.approx(0.6, rel=0.01)


def test_coverage_follows_the_key_density_not_the_key_bytes():
    """Keys bunched in [0, 0.1) of the byte space (100,000 of them) and spread thin over
    [0.1, 1) (10,000): a level over the dense tenth is probed by most misses."""
    from engine.filter_plan import coverage_of, runs_of

    l1 = [_meta(2, _k(0.0), _k(0.0999), 20_000)]
    l2 = [_meta(3, _k(0.0), _k(0.0999), 80_000), _meta(4, _k(0.1), _k(0.9999), 10_000)]
    levels = _levels((), l1, l2)
    runs, ids, _ = runs_of(levels)
    cov = coverage_of(levels, ids, runs)
    assert cov[0] == pytest.approx(80_000 / 90_000, rel=0.01)
    assert cov[1] == pytest.approx(1.0)


def test_coverage_of_a_partial_level_is_the_share_of_the_key_space_it_spans():
    from engine.filter_plan import coverage_of, runs_of

    l1 = [_meta(2, _k(0.0), _k(0.1), 5_000)]  # a small level over 10% of the key space
    l2 = [_meta(3 + i, _k(i / 10), _k(i / 10 + 0.0999), 100_000) for i in range(10)]
    levels = _levels((), l1, l2)
    runs, ids, _ = runs_of(levels)
    cov = coverage_of(levels, ids, runs)
    assert cov[0] == pytest.approx(0.1, rel=0.02)
    assert cov[1] == pytest.approx(1.0, rel=0.02)


def test_coverage_of_a_compaction_output_spans_its_inputs_and_a_flush_covers_all():
    from engine.filter_plan import coverage_of, runs_of

    l1 = [_meta(2, _k(0.0), _k(0.3), 30_000)]
    l2 = [_meta(3, _k(0.0), _k(0.3), 30_000), _meta(4, _k(0.3), _k(0.9), 60_000)]
    levels = _levels((), l1, l2)
    removed = {2: 30_000, 3: 30_000}  # L1 + the overlapping L2 table merged into L2
    runs, ids, target = runs_of(levels, 2, 60_000, removed)
    cov = coverage_of(levels, ids, runs, removed, 2)
    assert ids[target] == (2, -1) and runs == [120_000]
    assert cov == [1.0]
    runs, ids, target = runs_of(levels, 0, 10_000)  # a flush: its range is not known
    cov = coverage_of(levels, ids, runs, None, 0)
    assert ids[target] == (0, -1) and cov[target] == 1.0
    assert cov[ids.index((1, -1))] == pytest.approx(1 / 3, rel=0.01)


def test_new_tables_of_levels_probed_in_proportion_to_size_get_equal_bits():
    """A compaction output to L2 where L1 and L2 split the key range in proportion to their
    entries gets the bits L1 would get (classic Monkey gave it fewer)."""
    from engine.filter_plan import bits_for_new_table
    from engine.options import Options

    l1 = [_meta(2, _k(0.0), _k(0.4), 40_000)]
    l2 = [_meta(3, _k(0.4), _k(0.7), 30_000), _meta(4, _k(0.7), _k(0.99), 29_000)]
    levels = _levels((), l1, l2)
    opts = Options.from_kwargs(filter_memory_budget=100_000 * 10 // 8, bits_per_key=10)
    b2 = bits_for_new_table(opts, levels, 2, 1_000)
    b1 = bits_for_new_table(opts, levels, 1, 1_000)
    assert b1 == pytest.approx(b2, rel=0.03) and b1 == pytest.approx(10.0, rel=0.03)


def test_levels_do_not_fund_l0_tables_and_a_flush_gets_the_extra_bits():
    """L0 tables are gone after the next L0 compaction while level filters stay: a table for a
    level is planned as if L0's keys were already in the levels (before: L0's extra bits were
    taken from it, and lost once L0 emptied). A flush still gets Monkey's extra bits for a
    small run that every miss probes."""
    from engine.filter_plan import bits_for_new_table
    from engine.options import Options

    l0 = [_meta(10 + i, _k(0.0001), _k(0.9999), 40_000) for i in range(3)]
    l2 = [_meta(3 + i, _k(i / 6), _k(i / 6 + 0.16), 30_000) for i in range(6)]
    opts = Options.from_kwargs(filter_memory_budget=300_000 * 10 // 8, bits_per_key=10)
    with_l0 = bits_for_new_table(opts, _levels(l0, (), l2), 2, 1_000)
    without = bits_for_new_table(opts, _levels((), (), l2), 2, 1_000)
    assert with_l0 == pytest.approx(without, rel=0.01)
    assert with_l0 == pytest.approx(10.0, abs=0.1)
    flush = bits_for_new_table(opts, _levels(l0, (), l2), 0, 40_000)
    assert flush > with_l0 + 0.3
