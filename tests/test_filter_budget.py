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
