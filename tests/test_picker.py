"""The compaction picker is pure: unit tests on FileMeta, and a simulator running many
flushes and compactions without a single file, checking the level invariants after each step."""

import random

from engine.compaction.picker import (CompactionTask, apply, check_levels, is_bottommost,
                                      level_task, pick, scores)
from engine.options import Options
from engine.version import Version
from engine.version_edit import FileMeta, VersionEdit

OPTS = Options.from_kwargs(l0_compaction_trigger=4, max_bytes_for_level_base=1000,
                           level_size_multiplier=10, target_file_size=1024,
                           memtable_bytes=1024)


def k(i: int) -> bytes:
    return b"%08d" % i


def fm(number, lo, hi, size=100, entries=10):
    return FileMeta(number, size, k(lo), k(hi), num_entries=entries)


def levels(*lv):
    out = [tuple(x) for x in lv]
    return tuple(out + [()] * (7 - len(out)))


def test_nothing_to_do_on_an_empty_or_small_tree():
    assert pick(Version.empty(), OPTS) is None
    assert pick(levels([fm(1, 0, 10)], [fm(2, 0, 5, size=500)]), OPTS) is None


def test_l0_count_triggers_l0_to_l1_with_all_overlaps():
    l0 = [fm(9, 50, 60), fm(8, 0, 10), fm(7, 20, 30), fm(6, 5, 25)]
    l1 = [fm(1, 0, 3), fm(2, 22, 40), fm(3, 70, 80)]
    t = pick(levels(l0, l1), OPTS)
    assert t.level == 0 and t.output_level == 1 and t.reason == "l0-count"
    assert [f.number for f in t.inputs] == [9, 8, 7, 6]
    assert [f.number for f in t.next_inputs] == [1, 2]  # 3 is outside [0, 60]
    assert t.bottommost and not t.trivial_move
    assert t.score == 1.0


def test_biggest_score_wins_and_min_overlap_file_is_chosen():
    l1 = [fm(1, 0, 10, size=600), fm(2, 20, 30, size=600)]  # 1200 > 1000: score 1.2
    l2 = [fm(3, 0, 5, size=5000), fm(4, 25, 26, size=100)]
    t = pick(levels([], l1, l2), OPTS)
    assert t.level == 1 and t.output_level == 2
    assert [f.number for f in t.inputs] == [2]  # overlaps 100 bytes, file 1 overlaps 5000
    assert [f.number for f in t.next_inputs] == [4]
    assert scores(levels([], l1, l2), OPTS)[1] == 1.2


def test_trivial_move_when_nothing_overlaps_below():
    l1 = [fm(1, 0, 10, size=1500)]
    t = pick(levels([], l1, [fm(2, 50, 60)]), OPTS)
    assert t.trivial_move and t.next_inputs == ()
    after = apply(levels([], l1, [fm(2, 50, 60)]), t, t.inputs)
    assert [f.number for f in after[2]] == [1, 2] and after[1] == ()


def test_bottommost_only_when_no_deeper_level_overlaps():
    lv = levels([], [fm(1, 0, 10)], [], [fm(2, 5, 6)])
    assert not is_bottommost(lv, 1, k(0), k(10))
    assert is_bottommost(lv, 1, k(7), k(10))
    assert is_bottommost(lv, 3, k(0), k(10))
    t = level_task(lv, 1, reason="manual")
    assert not t.bottommost  # L3 holds 5..6, inside the task's range


def test_apply_replaces_inputs_and_keeps_levels_sorted():
    lv = levels([fm(5, 0, 100), fm(4, 0, 100)], [fm(1, 0, 40), fm(2, 60, 90)])
    t = level_task(lv, 0, reason="test")
    outs = [fm(10, 0, 50), fm(11, 51, 100)]
    after = apply(lv, t, outs)
    assert after[0] == () and [f.number for f in after[1]] == [10, 11]
    check_levels(after)


# ---------------------------------------------------------------------------------------------
# Simulator
# ---------------------------------------------------------------------------------------------
class Sim:
    """An LSM of FileMeta only: flushes add L0 tables; compactions merge key ranges."""

    def __init__(self, seed: int, opts: Options, key_space: int):
        self.rnd = random.Random(seed)
        self.opts = opts
        self.key_space = key_space
        self.next_number = 1
        self.version = Version.empty()
        self.compactions = 0
        self.bytes_written = 0

    def number(self) -> int:
        self.next_number += 1
        return self.next_number

    def flush(self):
        lo = self.rnd.randrange(self.key_space - 100)
        hi = lo + self.rnd.randrange(1, self.key_space - lo)
        f = fm(self.number(), lo, hi, size=self.opts.memtable_bytes, entries=100)
        self.version = self.version.apply(VersionEdit(new_files=[(0, f)]))
        self.bytes_written += f.size

    def outputs(self, task: CompactionTask):
        lo = int(task.smallest)
        hi = int(task.largest)
        total = sum(f.size for f in task.all_inputs)
        if task.bottommost:
            total = int(total * 0.9)  # tombstones and overwrites dropped
        n = max(1, -(-total // self.opts.target_file_size))
        n = min(n, hi - lo + 1)
        bounds = [lo + (hi - lo + 1) * i // n for i in range(n + 1)]
        return [fm(self.number(), bounds[i], bounds[i + 1] - 1, size=total // n, entries=10)
                for i in range(n)]

    def compact_until_done(self, limit: int = 1000):
        for _ in range(limit):
            task = pick(self.version, self.opts)
            if task is None:
                return
            assert task.inputs and task.output_level == task.level + 1
            # The task is consistent with the version it came from.
            live = {f.number for files in self.version.levels for f in files}
            assert {f.number for f in task.all_inputs} <= live
            assert set(task.next_inputs) == set(
                self.version.files_overlapping(task.output_level, task.smallest, task.largest)) or task.level == 0
            outs = list(task.inputs) if task.trivial_move else self.outputs(task)
            new_levels = apply(self.version, task, outs)
            check_levels(new_levels)
            # The same change through VersionEdit (what the runner records) agrees.
            edit = VersionEdit(deleted_files=[(task.level, f.number) for f in task.inputs]
                               + [(task.output_level, f.number) for f in task.next_inputs],
                               new_files=[(task.output_level, f) for f in outs])
            v2 = self.version.apply(edit)
            assert v2.levels == new_levels
            self.version = v2
            self.compactions += 1
            if not task.trivial_move:
                self.bytes_written += sum(f.size for f in outs)
        raise AssertionError("compaction did not converge")


def test_simulator_many_flushes_keep_invariants_and_level_targets():
    for seed in range(5):
        sim = Sim(seed, OPTS, key_space=100_000)
        for step in range(400):
            sim.flush()
            if step % 3 == 0:
                sim.compact_until_done()
                sim.version.check()
        sim.compact_until_done()
        v = sim.version
        assert len(v.levels[0]) < OPTS.l0_compaction_trigger
        for n in range(1, 6):
            assert v.level_bytes(n) <= OPTS.max_bytes_for_level(n)
        assert sim.compactions > 50
        # Leveled compaction's write amplification stays bounded (levels x multiplier).
        flushed = 400 * OPTS.memtable_bytes
        assert sim.bytes_written / flushed < 6 * OPTS.level_size_multiplier


def test_simulator_level_task_compacts_everything_down():
    sim = Sim(11, OPTS, key_space=10_000)
    for _ in range(50):
        sim.flush()
    sim.compact_until_done()
    deepest = max(n for n in range(7) if sim.version.levels[n])
    for level in range(deepest):
        t = level_task(sim.version, level, reason="manual")
        if t is None:
            continue
        outs = list(t.inputs) if t.trivial_move else sim.outputs(t)
        sim.version = sim.version.apply(VersionEdit(
            deleted_files=[(t.level, f.number) for f in t.inputs]
            + [(t.output_level, f.number) for f in t.next_inputs],
            new_files=[(t.output_level, f) for f in outs]))
    assert [n for n in range(7) if sim.version.levels[n]] == [deepest]


def test_full_task_merges_every_level_into_one_that_fits():
    from engine.compaction.picker import full_compaction_level, full_task

    lv = levels([fm(9, 0, 50)], [fm(5, 0, 20, size=600), fm(6, 30, 60, size=600)],
                [fm(1, 10, 40, size=500)], [], [fm(2, 45, 99, size=100)])
    assert full_compaction_level(lv, OPTS) == 4
    t = full_task(lv, OPTS)
    assert (t.level, t.output_level) == (0, 4)
    assert [f.number for f in t.inputs] == [9]
    assert [(n, [f.number for f in fs]) for n, fs in t.middle] == [(1, [5, 6]), (2, [1])]
    assert [f.number for f in t.next_inputs] == [2] and t.bottommost
    assert sorted(t.deletions()) == [(0, 9), (1, 5), (1, 6), (2, 1), (4, 2)]
    after = apply(lv, t, [fm(20, 0, 99, size=1800)])
    assert [n for n in range(7) if after[n]] == [4]
    # Too big for L1 (target 1000): everything goes to L2 even though L1 is the deepest level.
    big = levels([], [fm(5, 0, 20, size=900), fm(6, 30, 60, size=900)])
    assert full_compaction_level(big, OPTS) == 2
    assert full_task(levels([], [fm(5, 0, 20)]), OPTS) is None  # already one level


def test_full_task_rewrites_a_lone_table_with_tombstones_it_moves_to_the_bottom():
    """compact() drops tombstones at the bottom: a lone L1+ table is moved unchanged only when
    it has no tombstones (full_task's output level is the deepest holding data or deeper, so
    its task is always bottommost)."""
    from engine.compaction.picker import full_task

    def tm(number, lo, hi, size, dels):
        return FileMeta(number, size, k(lo), k(hi), num_entries=10, num_deletions=dels)

    # L1 (target 1000) cannot hold 1500 bytes: the lone table goes to L2, bottommost.
    t = full_task(levels([], [tm(5, 0, 20, 1500, 3)]), OPTS)
    assert (t.level, t.output_level, t.trivial_move, t.bottommost) == (1, 2, False, True)
    t = full_task(levels([], [tm(5, 0, 20, 1500, 0)]), OPTS)  # nothing to drop: moved
    assert (t.level, t.output_level, t.trivial_move) == (1, 2, True)
    # An L3 table elsewhere in the key space makes L3 the output level; L1's lone table moves
    # there without overlap (bottommost, since nothing lies below L3): rewritten.
    t = full_task(levels([], [tm(5, 0, 20, 100, 3)], [], [tm(7, 50, 60, 100, 0)]), OPTS)
    assert (t.level, t.output_level, t.trivial_move, t.bottommost) == (1, 3, False, True)


def test_rewrite_tasks_take_runs_of_adjacent_stale_tables_in_place():
    """DB.compact's in-place rewrites (tables written with another compression): one task per
    maximal run of stale tables adjacent in their level, so no output can overlap a table
    that stays; L0 is left alone; bottommost only with nothing below the run."""
    from engine.compaction.picker import rewrite_tasks

    stale = {2, 3, 5, 7, 9}
    lv = levels([fm(9, 0, 99)],
                [fm(1, 0, 9), fm(2, 10, 19), fm(3, 20, 29), fm(4, 30, 39), fm(5, 40, 49)],
                [], [fm(6, 0, 9), fm(7, 45, 60)])
    tasks = rewrite_tasks(lv, lambda f: f.number in stale)
    got = [(t.level, t.output_level, [f.number for f in t.inputs], t.bottommost) for t in tasks]
    assert got == [(1, 1, [2, 3], True), (1, 1, [5], False), (3, 3, [7], True)]
    for t in tasks:
        assert not t.trivial_move and t.next_inputs == () and t.reason == "manual"
        after = apply(lv, t, [fm(20 + t.inputs[0].number, int(t.smallest), int(t.largest))])
        check_levels(after)
        assert [f.number for f in after[0]] == [9]
    assert rewrite_tasks(lv, lambda f: False) == []  # nothing stale: nothing to do
