"""Tombstone compactions in the picker (engine/compaction/picker.py, "Tombstones"), without files.

Unit tests on FileMeta shapes, then a simulator that keeps the *contents* of every table (key ->
(seq, kind)) so that each compaction's outputs carry exact entry and tombstone counts, and
checks after every step: the logical contents equal a dict model (no tombstone dropped while
it shadows data below), the levels agree with what the runner records (a VersionEdit), and the
potential P = sum over entries of (NUM_LEVELS - level) strictly falls, so the loop stops.
"""

import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.compaction.births import Births, born_at_open
from engine.compaction.picker import (apply, check_levels, is_bottommost, pick, scores,
                                      tombstone_task, tombstone_wake_at)
from engine.format import KIND_DELETE, KIND_VALUE, NUM_LEVELS
from engine.options import Options
from engine.version import Version
from engine.version_edit import FileMeta, VersionEdit

BASE = dict(l0_compaction_trigger=4, max_bytes_for_level_base=1000, level_size_multiplier=10,
            target_file_size=1024, memtable_bytes=1024)
ON = Options.from_kwargs(tombstone_compaction_ratio=0.2, **BASE)
OFF = Options.from_kwargs(tombstone_compaction_ratio=0, **BASE)
NONE = Options.from_kwargs(tombstone_compaction_ratio=None, **BASE)


def k(i: int) -> bytes:
    return b"%08d" % i


def fm(number, lo, hi, size=100, entries=10, dels=0):
    return FileMeta(number, size, k(lo), k(hi), num_entries=entries, num_deletions=dels)


def levels(*lv):
    out = [tuple(x) for x in lv]
    return tuple(out + [()] * (NUM_LEVELS - len(out)))


def test_off_and_none_pick_nothing_for_tombstones():
    dense = levels([], [], [fm(1, 0, 10, dels=10)])
    assert pick(dense, OFF) is None and pick(dense, NONE) is None
    assert tombstone_task(dense, 0) is None and tombstone_task(dense, None) is None
    assert pick(dense, ON) is not None


def test_below_the_ratio_nothing_is_picked():
    lv = levels([fm(9, 0, 10, dels=1)], [], [fm(1, 0, 10, dels=1)])  # 10% < 20%
    assert pick(lv, ON) is None
    assert pick(levels([], [fm(1, 0, 10, dels=2)]), ON) is not None  # exactly 20%


def test_bottommost_table_is_rewritten_in_place_never_moved():
    for n in range(1, NUM_LEVELS):
        lv = [()] * NUM_LEVELS
        lv[n] = (fm(1, 0, 10, dels=8), fm(2, 20, 30, dels=3))
        t = pick(tuple(lv), ON)
        assert (t.level, t.output_level) == (n, n) and t.reason == "tombstones"
        assert [f.number for f in t.inputs] == [1] and t.next_inputs == ()
        assert t.bottommost and not t.trivial_move and t.score == 0.8
        assert t.deletions() == [(n, 1)]
        after = apply(lv, t, [fm(3, 0, 9, entries=2)])
        assert [f.number for f in after[n]] == [3, 2]
        check_levels(after)
        edit = VersionEdit(deleted_files=t.deletions(), new_files=[(n, fm(3, 0, 9, entries=2))])
        assert Version(tuple(lv)).apply(edit).levels == after
        gone = apply(lv, t, [])  # a table of tombstones only leaves nothing
        assert [f.number for f in gone[n]] == [2]


def test_table_with_data_below_goes_down_with_its_overlaps():
    l2 = [fm(1, 0, 10, dels=8), fm(2, 20, 30)]  # the task: 8 tombstones in 30 entries
    l3 = [fm(3, 5, 8), fm(4, 9, 15), fm(5, 40, 50)]
    t = pick(levels([], [], l2, l3), ON)
    assert (t.level, t.output_level, t.reason) == (2, 3, "tombstones")
    assert [f.number for f in t.inputs] == [1] and [f.number for f in t.next_inputs] == [3, 4]
    assert t.bottommost and not t.trivial_move
    # Data deeper than L3 in the range: not bottommost, the tombstones are kept.
    t = pick(levels([], [], l2, l3, [fm(6, 7, 7)]), ON)
    assert (t.level, t.output_level) == (2, 3) and not t.bottommost


def test_a_task_diluted_by_its_overlaps_is_skipped_for_the_next_candidate():
    """A dense table over much more data below is not worth rewriting that data for: the task
    must be as dense as a whole (here 10 tombstones in 10 + 100 entries)."""
    dense = fm(1, 0, 10, dels=10)
    big = [fm(3, 0, 5, entries=50), fm(4, 6, 10, entries=50)]
    assert pick(levels([], [dense], big), ON) is None
    lighter = fm(2, 20, 30, dels=3)  # 30%, nothing below: rewritten in place
    t = pick(levels([], [dense, lighter], big), ON)
    assert [f.number for f in t.inputs] == [2] and (t.level, t.output_level) == (1, 1)
    # L0: all of L0 with the L1 overlaps, as one task.
    l0 = [fm(9, 0, 10, entries=10, dels=10)]
    assert pick(levels(l0, big), ON) is None
    assert pick(levels(l0, [fm(3, 0, 5, entries=30)]), ON).level == 0  # 10 in 40: 25%


def test_nothing_in_the_next_level_but_data_deeper_is_a_trivial_move_down():
    lv = levels([], [], [fm(1, 0, 10, dels=5)], [], [], [fm(2, 5, 6)])
    t = pick(lv, ON)
    assert (t.level, t.output_level) == (2, 3) and t.trivial_move and not t.bottommost


def test_l0_takes_all_of_l0_into_l1():
    l0 = [fm(9, 50, 60), fm(8, 0, 10, dels=9)]
    l1 = [fm(1, 0, 3), fm(2, 70, 80)]
    t = pick(levels(l0, l1), ON)
    assert (t.level, t.output_level, t.reason) == (0, 1, "tombstones")
    assert [f.number for f in t.inputs] == [9, 8] and [f.number for f in t.next_inputs] == [1]
    assert not t.trivial_move and t.bottommost


def test_size_triggered_work_comes_first():
    dense = fm(1, 0, 10, dels=10)
    l0 = [fm(9 - i, 100, 200) for i in range(4)]  # at the trigger
    t = pick(levels(l0, [], [], [], [], [], [dense]), ON)
    assert t.reason == "l0-count"
    l1 = [fm(2, 100, 110, size=1500)]  # L1 over its 1000-byte target
    t = pick(levels([], l1, [], [], [], [], [dense]), ON)
    assert t.reason == "l1-size"


def test_densest_table_wins_ties_to_the_shallower_level():
    lv = levels([], [fm(1, 0, 10, dels=3)], [fm(2, 20, 30, dels=9)], [fm(3, 40, 50, dels=5)])
    assert [f.number for f in pick(lv, ON).inputs] == [2]
    lv = levels([], [fm(1, 0, 10, dels=5)], [fm(2, 20, 30, dels=5)])
    assert [f.number for f in pick(lv, ON).inputs] == [1]


def test_same_as_before_whenever_a_level_is_over_its_target():
    rnd = random.Random(7)
    for _ in range(300):
        lv = [[] for _ in range(NUM_LEVELS)]
        number = 1
        for n in range(NUM_LEVELS):
            lo = 0
            for _ in range(rnd.randrange(0 if n else 0, 6)):
                lo += rnd.randrange(1, 50)
                hi = lo + rnd.randrange(0, 40)
                entries = rnd.randrange(1, 20)
                f = fm(number, lo, hi, size=rnd.randrange(50, 900), entries=entries,
                       dels=rnd.randrange(0, entries + 1))
                number += 1
                if n == 0:
                    lv[0].insert(0, f)
                else:
                    lv[n].append(f)
                lo = hi
        shape = tuple(tuple(x) for x in lv)
        off = pick(shape, OFF)
        assert off == pick(shape, NONE)
        on = pick(shape, ON)
        if max(scores(shape, ON)) >= 1:
            assert on == off
        else:
            assert off is None
            if on is not None:
                assert on.reason == "tombstones"


# ---------------------------------------------------------------------------------------------
# Simulator with contents
# ---------------------------------------------------------------------------------------------
class ContentSim:
    """Tables as dicts key -> (seq, kind); FileMeta counts derived from them."""

    ENTRY_BYTES = 24  # a FileMeta's size: entries x this

    def __init__(self, opts: Options, seed: int = 0):
        self.opts = opts
        self.rnd = random.Random(seed)
        self.version = Version.empty()
        self.tables: dict[int, dict] = {}
        self.number = 1
        self.seq = 0
        self.mem: dict = {}
        self.model: dict = {}
        self.compactions = 0
        self.reasons: dict = {}
        self.tasks: list = []  # (now, reason, level, output_level) of every compaction
        # A clock for tombstone_compaction_delay: pick at ``now`` with the tables' birth
        # times in ``born`` (engine/compaction/births.py). Without one, no delay applies.
        self.now = math.inf
        self.born: Births | None = None

    def _new(self, contents: dict) -> FileMeta:
        self.number += 1
        self.tables[self.number] = contents
        keys = sorted(contents)
        dels = sum(1 for v in contents.values() if v[1] == KIND_DELETE)
        return FileMeta(self.number, self.ENTRY_BYTES * len(keys), keys[0], keys[-1],
                        num_entries=len(keys), num_deletions=dels)

    def write(self, key: bytes, delete: bool) -> None:
        self.seq += 1
        self.mem[key] = (self.seq, KIND_DELETE if delete else KIND_VALUE)
        if delete:
            self.model.pop(key, None)
        else:
            self.model[key] = self.seq

    def flush(self) -> None:
        if not self.mem:
            return
        f = self._new(dict(self.mem))
        self.mem = {}
        self.version = self.version.apply(VersionEdit(new_files=[(0, f)]))
        if self.born is not None:
            self.born.flushed([f], self.now)

    def read_all(self) -> dict:
        """What a reader sees: newest entry per key over memtable and every table."""
        best: dict = {}
        for files in self.version.levels:
            for f in files:
                for key, (seq, kind) in self.tables[f.number].items():
                    if key not in best or best[key][0] < seq:
                        best[key] = (seq, kind)
        for key, v in self.mem.items():
            best[key] = v
        return {key: seq for key, (seq, kind) in best.items() if kind == KIND_VALUE}

    def potential(self) -> int:
        return sum((NUM_LEVELS - n) * f.num_entries
                   for n, files in enumerate(self.version.levels) for f in files)

    def run(self, task):
        if task.trivial_move:
            return list(task.inputs)
        merged: dict = {}
        for f in task.all_inputs:
            for key, v in self.tables[f.number].items():
                if key not in merged or merged[key][0] < v[0]:
                    merged[key] = v
        if task.bottommost:
            merged = {key: v for key, v in merged.items() if v[1] != KIND_DELETE}
        keys = sorted(merged)
        per = max(1, self.opts.target_file_size // self.ENTRY_BYTES)
        return [self._new({key: merged[key] for key in keys[i:i + per]})
                for i in range(0, len(keys), per)]

    def compact_until_done(self, limit: int = 10_000) -> None:
        for _ in range(limit):
            task = pick(self.version, self.opts, self.now, self.born)
            if task is None:
                return
            before = self.potential()
            live = self.version.live_numbers()
            assert {f.number for f in task.all_inputs} <= live
            if task.output_level == task.level:
                assert task.reason == "tombstones" and task.level > 0
                assert task.bottommost and not task.trivial_move and not task.next_inputs
                assert is_bottommost(self.version.levels, task.level, task.smallest,
                                     task.largest)
            else:
                assert task.output_level == task.level + 1
            outs = self.run(task)
            new_levels = apply(self.version, task, outs)
            check_levels(new_levels)
            edit = VersionEdit(deleted_files=task.deletions(),
                               new_files=[(task.output_level, f) for f in outs])
            v2 = self.version.apply(edit)
            assert v2.levels == new_levels
            self.version = v2
            if self.born is not None:
                self.born.compacted(task, outs, self.now)
                assert set(self.born) == self.version.live_numbers()
            self.compactions += 1
            self.reasons[task.reason] = self.reasons.get(task.reason, 0) + 1
            self.tasks.append((self.now, task.reason, task.level, task.output_level))
            assert self.potential() < before, f"{task.reason} L{task.level}->L{task.output_level}"
            assert self.read_all() == self.model, "a compaction changed what a reader sees"
        raise AssertionError("compaction did not converge")

    def tombstones(self) -> int:
        return sum(f.num_deletions for files in self.version.levels for f in files)

    def check_settled(self) -> None:
        """After compact_until_done: nothing is due, and no table with nothing below it (whose
        task would be the table alone) is as dense as the ratio. A denser table may remain
        above data that dilutes its task below the ratio."""
        ratio = self.opts.tombstone_compaction_ratio
        assert pick(self.version, self.opts, self.now, self.born) is None
        for n, f in self.version.all_files():
            if ratio and n > 0 and is_bottommost(self.version.levels, n, f.smallest, f.largest):
                assert f.num_deletions < ratio * f.num_entries


def _workload(sim: ContentSim, ops, keys: int, flush_every: int, compact_every: int) -> None:
    for i, (key, delete) in enumerate(ops):
        sim.write(k(key % keys), delete)
        if (i + 1) % flush_every == 0:
            sim.flush()
        if (i + 1) % compact_every == 0:
            sim.compact_until_done()
    sim.flush()
    sim.compact_until_done()


@pytest.mark.parametrize("seed", range(6))
def test_fill_then_delete_most_gives_the_space_back(seed):
    rnd = random.Random(seed)
    sim = ContentSim(ON, seed)
    n = 2000
    _workload(sim, [(i, False) for i in rnd.sample(range(n), n)], n, 100, 300)
    full = sum(f.size for _, f in sim.version.all_files())
    doomed = rnd.sample(range(n), n * 9 // 10) if seed % 2 else list(range(n * 9 // 10))
    _workload(sim, [(i, True) for i in doomed], n, 10_000, 10_000)  # one flush, L0 < trigger
    assert sim.read_all() == sim.model and len(sim.model) == n - len(doomed)
    after = sum(f.size for _, f in sim.version.all_files())
    assert after <= full * 0.15  # the live 10% (each live key once), few tombstones
    sim.check_settled()
    # The same without the option keeps the tombstones and the data they shadow.
    off = ContentSim(OFF, seed)
    _workload(off, [(i, False) for i in random.Random(seed).sample(range(n), n)], n, 100, 300)
    _workload(off, [(i, True) for i in doomed], n, 10_000, 10_000)
    assert sum(f.size for _, f in off.version.all_files()) > full * 0.9


def test_deletes_of_absent_keys_stop_and_leave_nothing():
    sim = ContentSim(ON)
    _workload(sim, [(i, False) for i in range(0, 3000, 3)], 3000, 100, 200)
    data = sum(f.size for _, f in sim.version.all_files())
    # Absent keys, inside and outside the range of the data.
    _workload(sim, [(i, True) for i in range(1, 6000, 3)], 6000, 100, 10_000)
    assert sim.tombstones() == 0
    assert sum(f.size for _, f in sim.version.all_files()) == data
    assert sim.read_all() == sim.model
    assert pick(sim.version, ON) is None


def test_trivially_moved_tombstones_at_the_bottom_are_elided():
    """The case the size picker alone never fixes: tombstone tables that reached L6 (or any
    level with nothing below) by trivial moves keep their tombstones for ever."""
    opts = dict(BASE, max_bytes_for_level_base=24, level_size_multiplier=1.0,
                target_file_size=240, l0_compaction_trigger=1)
    off = ContentSim(Options.from_kwargs(tombstone_compaction_ratio=0, **opts))
    on = ContentSim(Options.from_kwargs(tombstone_compaction_ratio=0.2, **opts))
    for sim in (off, on):
        ops = [(i, False) for i in range(0, 200)] + [(i, False) for i in range(800, 1000)]
        _workload(sim, ops, 1000, 100, 100)
        _workload(sim, [(100, False), (900, False)] + [(i, True) for i in range(300, 700)],
                  1000, 10_000, 10_000)
        assert sim.read_all() == sim.model
    assert off.tombstones() > 0 and off.version.levels[6]
    assert any(f.num_deletions == f.num_entries for f in off.version.levels[6])
    assert on.tombstones() == 0 and on.reasons.get("tombstones", 0) >= 1


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(st.tuples(st.integers(0, 399), st.booleans()), min_size=1, max_size=600),
       flush_every=st.integers(5, 80), compact_every=st.integers(1, 300),
       ratio=st.sampled_from([0.05, 0.2, 0.5, 1.0]),
       base=st.sampled_from([48, 240, 1000]), multiplier=st.sampled_from([1.0, 2.0, 10.0]),
       target=st.sampled_from([48, 240, 1024]), trigger=st.integers(1, 4))
def test_property_any_workload_converges_without_losing_data(ops, flush_every, compact_every,
                                                             ratio, base, multiplier, target,
                                                             trigger):
    opts = Options.from_kwargs(tombstone_compaction_ratio=ratio, l0_compaction_trigger=trigger,
                               max_bytes_for_level_base=base, level_size_multiplier=multiplier,
                               target_file_size=target)
    sim = ContentSim(opts)
    _workload(sim, ops, 400, flush_every, compact_every)
    assert sim.read_all() == sim.model
    assert pick(sim.version, opts) is None
    sim.check_settled()


@settings(max_examples=200, deadline=None)
@given(bounds=st.lists(st.integers(0, 200), max_size=40), lo=st.integers(-5, 205),
       width=st.integers(0, 60))
def test_bisected_overlap_of_a_sorted_level_equals_the_linear_scan(bounds, lo, width):
    """overlapping(..., level >= 1) bisects a sorted, non-overlapping level; is_bottommost too.
    Both must agree with the linear scan (the form L0 keeps)."""
    from engine.compaction.picker import overlapping

    pts = sorted(set(bounds))
    files = tuple(fm(i + 1, a, b) for i, (a, b) in enumerate(zip(pts[0::2], pts[1::2])))
    a, b = k(max(lo, 0)), k(max(lo, 0) + width)
    linear = overlapping(files, a, b)  # level 0: the linear form
    assert overlapping(files, a, b, 3) == linear
    assert is_bottommost(levels([], [], files), 1, a, b) == (not linear)


def test_only_the_sixteen_densest_candidates_are_tried():
    """pick() runs under the DB mutex: tombstone_task builds at most TOMBSTONE_TRIES tasks.
    Sixteen dense L1 tables each diluted by a big L2 table below, and a less dense L1 table with
    nothing below: the latter is not reached (it waits for size-triggered compactions); with
    one diluted table fewer it is."""
    from engine.compaction.picker import TOMBSTONE_TRIES

    assert TOMBSTONE_TRIES == 16
    l1 = [fm(i + 1, 10 * i, 10 * i + 5, size=10, dels=9) for i in range(16)]  # L1 in target
    l2 = [fm(100 + i, 10 * i, 10 * i + 5, entries=1000) for i in range(16)]
    lone = fm(50, 500, 505, size=10, dels=5)
    assert pick(levels([], l1 + [lone], l2), ON) is None
    t = pick(levels([], l1[1:] + [lone], l2), ON)
    assert (t.level, t.output_level, [f.number for f in t.inputs]) == (1, 1, [50])


# ---------------------------------------------------------------------------------------------
# Idle time (tombstone_compaction_delay): a pure function of the levels, now and birth times
# ---------------------------------------------------------------------------------------------
DELAYED = Options.from_kwargs(tombstone_compaction_ratio=0.2, tombstone_compaction_delay=10.0,
                              **BASE)
NO_DELAY = Options.from_kwargs(tombstone_compaction_ratio=0.2, tombstone_compaction_delay=0,
                               **BASE)


def test_a_table_of_l1_plus_is_eligible_once_it_is_delay_old():
    lv = levels([], [], [fm(1, 0, 10, dels=5)])  # nothing below: an elision once eligible
    born = {1: 100.0}
    assert pick(lv, DELAYED, 109.5, born) is None
    assert tombstone_wake_at(lv, DELAYED, 109.5, born) == 110.0
    t = pick(lv, DELAYED, 110.0, born)  # exactly the delay old: eligible
    assert (t.level, t.output_level, t.reason) == (2, 2, "tombstones")
    assert pick(lv, DELAYED, 1e6, born) == t
    assert tombstone_wake_at(lv, DELAYED, 110.0, born) is None  # nothing held back now
    # Delay 0, no clock (now defaults to infinitely late) or no birth time: eligible at once.
    assert pick(lv, NO_DELAY, 100.0, born) == t
    assert pick(lv, DELAYED) == t
    assert pick(lv, DELAYED, 100.0, {}) == t and pick(lv, DELAYED, 100.0) == t
    assert tombstone_wake_at(lv, NO_DELAY, 100.0, born) is None
    assert tombstone_wake_at(lv, OFF, 100.0, born) is None


def test_l0_is_eligible_only_once_no_flush_came_into_it_for_the_delay():
    """L0 counts as a whole: an old dense L0 table waits while newer flushes keep coming (a
    steady load compacts L0 by its table count), and goes with all of L0 once L0 is quiet."""
    old_dense = fm(8, 0, 10, dels=9)
    new_plain = fm(9, 50, 60)  # flushed later, no tombstones
    lv = levels([new_plain, old_dense], [fm(1, 0, 3)])
    born = {8: 0.0, 9: 95.0, 1: 0.0}
    assert pick(lv, DELAYED, 100.0, born) is None  # 8 is 100 s old, but L0 changed at 95
    assert tombstone_wake_at(lv, DELAYED, 100.0, born) == 105.0
    t = pick(lv, DELAYED, 105.0, born)
    assert (t.level, t.output_level, t.reason) == (0, 1, "tombstones")
    assert [f.number for f in t.inputs] == [9, 8] and [f.number for f in t.next_inputs] == [1]
    assert pick(lv, NO_DELAY, 100.0, born) == t  # the behaviour before the delay
    # One more flush at 104 moves L0's time on, whatever the new table holds.
    lv2 = levels([fm(10, 70, 80), new_plain, old_dense], [fm(1, 0, 3)])
    born2 = born | {10: 104.0}
    assert pick(lv2, DELAYED, 105.0, born2) is None
    assert tombstone_wake_at(lv2, DELAYED, 105.0, born2) == 114.0
    assert pick(lv2, DELAYED, 114.0, born2).level == 0


def test_a_quiet_table_of_l1_plus_is_taken_while_l0_keeps_changing():
    lv = levels([fm(9, 50, 60)], [], [fm(1, 0, 10, dels=5)])
    born = {9: 99.0, 1: 0.0}
    t = pick(lv, DELAYED, 100.0, born)
    assert (t.level, [f.number for f in t.inputs]) == (2, [1])


def test_held_back_candidates_do_not_hide_an_eligible_one():
    """Young dense tables are not candidates at all: they neither win over an older, less dense
    table nor use up the TOMBSTONE_TRIES (16) tries."""
    young = [fm(i + 1, 10 * i, 10 * i + 5, size=10, dels=10) for i in range(20)]
    old = fm(50, 500, 505, size=10, dels=3)
    lv = levels([], young + [old])
    born = {f.number: 95.0 for f in young} | {50: 0.0}
    t = pick(lv, DELAYED, 100.0, born)
    assert [f.number for f in t.inputs] == [50]
    assert tombstone_wake_at(lv, DELAYED, 100.0, born) == 105.0
    assert [f.number for f in pick(lv, DELAYED, 105.0, born).inputs] == [1]  # densest, oldest


def test_wake_at_ignores_eligible_candidates_so_an_idle_thread_sleeps():
    """A candidate that is old enough but diluted by what lies below is not a reason to wake
    up again: once every candidate is eligible, tombstone_wake_at is None (the compaction
    thread then waits for a write, not for a deadline in the past)."""
    dense = fm(1, 0, 10, dels=10)
    lv = levels([], [dense], [fm(3, 0, 5, entries=50), fm(4, 6, 10, entries=50)])
    born = {1: 0.0, 3: 0.0, 4: 0.0}
    assert tombstone_wake_at(lv, DELAYED, 5.0, born) == 10.0
    assert pick(lv, DELAYED, 10.0, born) is None  # eligible, but its task is 10 in 110
    assert tombstone_wake_at(lv, DELAYED, 10.0, born) is None
    # Below the ratio: never a candidate, never a deadline.
    assert tombstone_wake_at(levels([], [fm(5, 0, 10, dels=1)]), DELAYED, 0.0, {5: 0.0}) is None


def test_born_at_open_uses_the_stored_creation_time():
    assert born_at_open(1_000, 1_060.5, 500.0) == 439.5  # 60.5 s old at open
    assert born_at_open(0, 1_060.5, 500.0) == 500.0  # unknown: born at open
    assert born_at_open(2_000, 1_060.5, 500.0) == 500.0  # in the future (clock went back)
    assert born_at_open(1_060, 1_060.5, 500.0) == 499.5
    b = Births()
    v = Version.empty().apply(VersionEdit(new_files=[(0, fm(7, 0, 1)), (3, fm(4, 0, 1))]))
    b.at_open(v, {7: 1_050, 4: 0}.__getitem__, 1_060.0, 500.0)
    assert b == {7: 490.0, 4: 500.0}


def test_births_follow_flushes_moves_and_compactions():
    from engine.compaction.picker import CompactionTask

    b = Births()
    a, c, d = fm(1, 0, 10), fm(2, 20, 30, dels=9), fm(3, 0, 30)
    b.flushed([a], 5.0)
    b[2], b[3] = 1.0, 3.0
    moved = CompactionTask(1, 2, (c,), (), True, True, "tombstones", 0.9)
    b.compacted(moved, [c], 50.0)  # a trivial move keeps the number and the time
    assert b == {1: 5.0, 2: 1.0, 3: 3.0}
    tomb = CompactionTask(2, 3, (c,), (d,), True, False, "tombstones", 0.9)
    b.compacted(tomb, [fm(8, 0, 30)], 50.0)  # the youngest input's time, not now
    assert b == {1: 5.0, 8: 3.0}
    size = CompactionTask(0, 1, (a,), (fm(8, 0, 30),), True, False, "l0-count", 1.0)
    b.compacted(size, [fm(9, 0, 15), fm(10, 16, 30)], 60.0)
    assert b == {9: 60.0, 10: 60.0}


def _clocked_queue(delay: float, n_ops: int = 6000, live: int = 150, per_flush: int = 40):
    """A small queue (insert a new key, delete the oldest once ``live`` exist: ~50% deletes)
    with a flush every ``per_flush`` writes, one second apart, and compactions after each
    (they keep up with the flushes): the load on which the rule without a delay cost 1.54x in
    session 11, 1.19-1.29x in session 12 and 1.00-1.17x in session 14 with a 768 KiB memtable
    (bench/tombstone_steady_wa.py, queue-small). Then the load stops: the clock runs on by
    the delay, nothing is written."""
    opts = Options.from_kwargs(tombstone_compaction_ratio=0.2, tombstone_compaction_delay=delay,
                               **BASE)
    sim = ContentSim(opts)
    sim.now, sim.born = 0.0, Births()
    lo = hi = 0
    for i in range(n_ops // 2):
        sim.write(k(hi), False)
        hi += 1
        if hi - lo > live:
            sim.write(k(lo), True)
            lo += 1
        if (i + 1) % (per_flush // 2) == 0:
            sim.now += 1.0
            sim.flush()
            sim.compact_until_done()
    sim.now += 1.0
    sim.flush()
    sim.compact_until_done()
    load = list(sim.tasks)
    sim.now += delay
    sim.compact_until_done()  # what the compaction thread's timed wait runs
    return sim, load


def test_a_steady_load_flushing_faster_than_the_delay_gets_no_l0_tombstone_compaction():
    eager, eager_load = _clocked_queue(0.0)
    assert any(r == "tombstones" and lv == 0 for _, r, lv, _ in eager_load)  # the old cost
    sim, load = _clocked_queue(5.0)  # a flush every second, a 5 s delay
    assert not any(r == "tombstones" and lv == 0 for _, r, lv, _ in load)
    assert any(r == "l0-count" for _, r, _, _ in load)
    # Once the load stops, the held-back work runs after the delay and settles the DB as
    # far as the rule goes, with what a reader sees unchanged.
    assert any(r == "tombstones" for _, r, _, _ in sim.tasks[len(load):])
    assert sim.read_all() == sim.model == eager.model
    sim.check_settled()
    eager.check_settled()
