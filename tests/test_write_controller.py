"""The write controller (engine/write_controller.py) and the compaction debt it follows
(engine/compaction/picker.py compaction_debt): pure parts on a fake clock, then a real DB
held to a rate past its slowdown trigger."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine import DB
from engine.compaction.picker import compaction_debt
from engine.format import NUM_LEVELS
from engine.options import Options
from engine.write_controller import (MIN_RATE, NEAR_STOP_SLOWER, RECOVER, SLOWER,
                                     WriteController)

MiB = 1 << 20


def _t(size):
    return SimpleNamespace(size=size)


def _levels(*sizes_per_level):
    levels = [[_t(s) for s in sizes] for sizes in sizes_per_level]
    return levels + [[] for _ in range(NUM_LEVELS - len(levels))]


OPTS = Options.from_kwargs(max_bytes_for_level_base=64 * MiB, level_size_multiplier=10.0)


# -- compaction debt ------------------------------------------------------------------------

def test_debt_is_zero_for_a_tree_within_its_targets():
    assert compaction_debt(_levels([], [32 * MiB], [300 * MiB]), OPTS) == 0
    assert compaction_debt(_levels(), OPTS) == 0


def test_debt_counts_l0_with_all_of_l1():
    # 4 L0 tables of 8 MiB over a 32 MiB L1: all of L0 and L1 rewritten; L1 then holds 64
    # MiB, its target: nothing passes down.
    assert compaction_debt(_levels([8 * MiB] * 4, [32 * MiB]), OPTS) == 64 * MiB


def test_debt_passes_a_level_excess_down_with_the_next_level_in_proportion():
    # L1 at 128 MiB (target 64): 64 MiB excess into a 320 MiB L2: 64 x (1 + 320/128).
    assert compaction_debt(_levels([], [128 * MiB], [320 * MiB]), OPTS) == int(
        64 * MiB * (1 + 320 / 128))


def test_debt_grows_with_l0_and_shrinks_as_l1_drains():
    base = compaction_debt(_levels([8 * MiB] * 20, [200 * MiB], [600 * MiB]), OPTS)
    more_l0 = compaction_debt(_levels([8 * MiB] * 21, [200 * MiB], [600 * MiB]), OPTS)
    l1_drained = compaction_debt(_levels([8 * MiB] * 20, [196 * MiB], [604 * MiB]), OPTS)
    assert more_l0 > base > l1_drained > 0


def test_debt_of_an_excess_into_an_empty_level_is_a_move():
    assert compaction_debt(_levels([], [128 * MiB]), OPTS) == 0


# -- the token bucket -----------------------------------------------------------------------

def _delayed(rate=1000.0, interval=0.001):
    wc = WriteController(rate, interval)
    wc.observe("v1", lambda v: 100, 20, 36)
    return wc


def test_writes_are_held_to_the_rate_on_average():
    wc = _delayed(rate=10_000.0)
    now = 0.0
    for _ in range(1000):  # 1,000 writes of 100 bytes at 10,000 B/s: ~10 s
        now += wc.delay(100, now)
    assert 9.8 <= now <= 10.2


def test_a_write_over_budget_sleeps_at_least_the_interval():
    wc = _delayed(rate=1e9, interval=0.002)
    now = 0.0
    pauses = [wc.delay(10 ** 9, now) for _ in range(2)]
    assert all(p >= 0.002 for p in pauses)


def test_concurrent_writers_queue_behind_each_other():
    wc = _delayed(rate=1000.0)
    # Three writers of 1,000 bytes at the same instant: 1 s, 2 s and 3 s of debt.
    pauses = [wc.delay(1000, 5.0) for _ in range(3)]
    assert pauses == pytest.approx([0.999, 1.999, 2.999], abs=0.002)


def test_a_pause_does_not_buy_a_burst():
    wc = _delayed(rate=1000.0)
    wc.delay(1, 0.0)
    # After 100 s idle, at most BURST_S (0.1 s) of the rate is free: the 200th byte waits.
    free = 0
    while wc.delay(1, 100.0) == 0:
        free += 1
    assert free <= 101


def test_interval_zero_never_delays():
    wc = WriteController(1000.0, 0.0)
    assert not wc.enabled
    assert wc.delay(10 ** 9, 0.0) == 0.0


# -- adapting the rate ------------------------------------------------------------------------

def test_rate_falls_while_debt_grows_and_rises_as_it_shrinks():
    wc = WriteController(1e6, 0.001)
    debts = {"a": 100, "b": 200, "c": 300, "d": 250}
    wc.observe("a", debts.get, 20, 36)
    assert wc.delayed and wc.rate == 1e6
    wc.observe("b", debts.get, 21, 36)
    assert wc.rate == pytest.approx(1e6 * SLOWER)
    wc.observe("b", debts.get, 21, 36)  # the same version: no change
    assert wc.rate == pytest.approx(1e6 * SLOWER)
    wc.observe("c", debts.get, 34, 36)  # near the stop trigger
    assert wc.rate == pytest.approx(1e6 * SLOWER * NEAR_STOP_SLOWER)
    wc.observe("d", debts.get, 33, 36)
    assert wc.rate == pytest.approx(1e6 * NEAR_STOP_SLOWER)


def test_rate_never_exceeds_the_maximum_nor_falls_under_the_floor():
    wc = WriteController(10 * MIN_RATE, 0.001)
    for i in range(100):
        wc.observe(i, lambda v: v, 25, 36)
    assert wc.rate == MIN_RATE
    for i in range(100, 0, -1):
        wc.observe(-i, lambda v: -v, 25, 36)
    assert wc.rate == 10 * MIN_RATE


def test_the_rate_learned_is_kept_and_raised_when_a_delay_ends():
    wc = WriteController(1e6, 0.001)
    wc.observe("a", {"a": 1, "b": 2, "c": 3}.get, 20, 36)
    wc.observe("b", {"a": 1, "b": 2, "c": 3}.get, 20, 36)
    wc.observe("c", {"a": 1, "b": 2, "c": 3}.get, 20, 36)
    learned = wc.rate
    wc.end()
    assert not wc.delayed
    assert wc.rate == pytest.approx(learned * RECOVER)
    wc.observe("e", lambda v: 10 ** 9, 20, 36)  # a new delay starts from there
    assert wc.rate == pytest.approx(learned * RECOVER)


# -- a real DB --------------------------------------------------------------------------------

def test_a_db_past_its_slowdown_trigger_holds_writes_to_the_rate(tmp_path):
    """No compaction runs (its thread is held), so L0 stays past the trigger: 40 writes of
    ~1 KiB at 8 KiB/s take about 5 s of sleeps, however fast the machine."""
    with DB.open(tmp_path / "db", l0_compaction_trigger=2, l0_slowdown_trigger=2,
                 l0_stop_trigger=100, delayed_write_rate=8 * 1024, table_workers=0,
                 memtable_bytes=64 * 1024) as db:
        with db._compaction_lock:  # no compaction can run: L0 stays at 2
            for i in range(2):  # two L0 tables, then writes are delayed
                db.put(b"k%d" % i, b"v")
                db.flush()
            assert db.stats()["levels"][0]["tables"] == 2
            for i in range(40):
                db.put(b"x%04d" % i, b"v" * 1020)
            st = db.stats()["write_stall"]
        assert st["delayed"] is True
        assert st["slowdowns"] >= 1
        assert st["slowdown_seconds"] >= 4.0  # 40 KiB at <= 8 KiB/s, less the first credit
        assert st["delayed_write_rate"] <= 8 * 1024


def test_slowdown_sleep_zero_never_slows_writes(tmp_path):
    with DB.open(tmp_path / "db", l0_compaction_trigger=2, l0_slowdown_trigger=2,
                 l0_stop_trigger=100, delayed_write_rate=1, slowdown_sleep_s=0.0,
                 table_workers=0) as db:
        with db._compaction_lock:
            for i in range(2):
                db.put(b"k%d" % i, b"v")
                db.flush()
            assert db.stats()["levels"][0]["tables"] == 2
            for i in range(20):
                db.put(b"x%04d" % i, b"v" * 1000)
            assert db.stats()["write_stall"]["slowdowns"] == 0
