"""Choosing what to compact: pure functions of the current levels (no files, no locks).

Leveled compaction, as in LevelDB/RocksDB:

- Score of L0 = (number of L0 tables) / l0_compaction_trigger; score of Ln (1 <= n < 6) =
  bytes(Ln) / max_bytes_for_level(n), with max_bytes_for_level(n) =
  max_bytes_for_level_base * level_size_multiplier**(n-1). The last level has no target.
- The level with the highest score >= 1 is compacted into the next one.
- L0 -> L1 takes every L0 table (they overlap each other) plus the L1 tables overlapping their
  combined key range.
- Ln -> Ln+1 takes one table of Ln, the one whose overlap with Ln+1 is the smallest relative
  to its own size (RocksDB's kMinOverlappingRatio: least write amplification), plus the
  overlapping tables of Ln+1. If nothing overlaps it the table is moved, not rewritten.
- The task is *bottommost* when no level below the output level holds a key in the task's
  range: only then may tombstones be dropped.
- Tombstones (``tombstone_compaction_ratio``; Cassandra's single-SSTable tombstone compaction,
  RocksDB's CompactOnDeletionCollector, Pebble's elision-only compactions): only when no
  level's score is >= 1, the table with the highest tombstone density (num_deletions /
  num_entries, from the manifest) at or above the ratio is compacted, reason "tombstones":
  an L0 table takes all of L0 into L1 (as l0-count does); a table of Ln (n >= 1) whose key
  range has nothing below it is rewritten in place at Ln with its tombstones dropped (an
  *elision*: ``output_level == level``, never a trivial move, which would keep them); any
  other Ln table goes to Ln+1 with its overlaps there (a trivial move if there are none).
  The task as a whole must be as dense: its inputs' tombstones >= ratio x their entries,
  overlaps included (else the next candidate is tried). That bounds the cost (at most
  1/ratio entries rewritten per tombstone moved or dropped) and keeps the steady churn of a
  workload with some deletes from turning every flush into an L0 -> L1 compaction (a flush
  with 30% tombstones over a much larger L1 is not dense as a task; bench/delete_space.py,
  "churn"); Cassandra checks a single SSTable's overlaps for the same reason
  (unchecked_tombstone_compaction). Only the 16 densest candidates are tried per pick
  (``TOMBSTONE_TRIES``): ``pick`` runs under the DB mutex, and trying every candidate of a
  20,000-table DB took seconds. Size-triggered work always comes first: a DB that goes idle
  after deletes gives the space back without DB.compact().

  It terminates: let P = sum over every entry of every table of (NUM_LEVELS - its level).
  Every compaction the picker returns lowers P: a level or tombstone task moves each entry
  of its level-n inputs to n+1 or drops it (an entry of the output level stays there or is
  dropped), and an elision drops at least one tombstone (density >= ratio > 0) and moves
  nothing. P is a non-negative integer, so without new writes ``pick`` returns None after
  finitely many steps (tests/test_picker_tombstones.py runs it on many shapes).

  Compensated sizes (RocksDB adds 2 x the average value size per tombstone in excess of
  the table's values to its size; Pebble estimates the bytes each tombstone shadows) are not
  used: they exist so that tombstones reach the data they delete *under load*, while this
  rule gives the space back once the tables are quiet (below), and the benchmark
  (bench/delete_space.py) shows it coming back without them; they would also change the
  shape of the tree for every workload with deletes, with an estimate (the average value
  size) we do not record. A dense table whose task is diluted below the ratio by what lies
  below it waits for the size-triggered compactions, as it did before this option.

  Idle time (``tombstone_compaction_delay``, seconds; Cassandra's
  tombstone_compaction_interval): a candidate counts only once its tables have not changed
  for that long. For L0 that is L0 as a whole: no flush into it for the delay (its youngest
  table is that old), so under a steady load L0 goes down by the l0-count trigger, not by
  this rule; for a table of L1+ its own age. A table's birth time (``born``: file number ->
  time on the caller's clock, time.monotonic() in the DB; engine/compaction/births.py says
  where it comes from) is when a flush or compaction wrote it, and a tombstone task's
  outputs keep their youngest input's time, so the tombstones of an idle DB go down the
  levels without a wait per level. Without the delay (``0``) the rule runs during a
  delete-heavy steady load of a small DB whose compactions keep up with its flushes: a queue
  of 5,000 live keys with 50% deletes (its flushes are dense with tombstones over a small
  L1, so an L0 -> L1 task is dense as a whole) wrote 1.00-1.17x the compaction bytes of the
  rule off in session 14 on the bench's options with a 768 KiB memtable (1.19-1.29x in
  session 12, 1.54x in session 11). With the default 60 s, no tombstone compaction runs
  during that load and the held-back work once idle adds nothing measurable: 0.93-1.00x in
  all. On the bench's scaled-down default of 256 KiB, whose flushes (at 240 bytes per
  memtable entry, the charge when this was measured; 176 since) come faster than L0 -> L1
  compactions finish, L0 stays over its target, size-triggered work comes first, and the
  rule hardly runs during any of its loads even without the delay: 0.97-1.08x without it,
  0.89-1.04x with it, the run-to-run noise
  (bench/tombstone_steady_wa.py, bench/results/db.md "Session 14: tombstone compaction write
  amplification, re-measured after the memtable charge"). The price: under a steady load the
  space comes back when the load stops, not during it (a queue's tables at 256 KiB:
  10.9-16.6 MiB at the end of the load, 6.6 MiB without the delay, 6.6-6.7 MiB once idle).
  :func:`tombstone_wake_at` says when the next held-back candidate becomes eligible, for
  the compaction thread's timed wait.

``pick(levels, options, now, born)`` takes anything with a ``levels`` attribute or a sequence of
levels, each a sequence of file metadata with ``number``, ``size``, ``smallest``, ``largest``
(L0 newest first, L1+ sorted by key and non-overlapping); ``now`` (default: infinitely late,
every delay passed: simulators without a clock) and ``born`` (default: no birth times, every
table born long ago) only matter to the tombstone rule. ``apply(levels, task, outputs)``
returns the levels after the task, for simulators and tests; the runner turns the same task
into a VersionEdit.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from heapq import nsmallest
from typing import Sequence

from ..format import NUM_LEVELS


@dataclass(frozen=True)
class CompactionTask:
    """What one compaction reads and where it writes.

    ``inputs`` come from ``level`` (for L0: newest first), ``next_inputs`` from ``output_level``
    (sorted). ``middle`` holds ``(level, files)`` for the levels strictly between them (only a
    manual full compaction spans more than two levels). ``trivial_move``: the single input is
    moved to output_level unchanged. ``output_level == level``, ``next_inputs`` empty, never a
    trivial move: an elision (reason "tombstones", always bottommost), one table rewritten in
    place without its tombstones; or a manual rewrite (:func:`rewrite_tasks`, reason
    "manual"), a run of adjacent tables of one level rewritten in place.
    """

    level: int
    output_level: int
    inputs: tuple
    next_inputs: tuple
    bottommost: bool
    trivial_move: bool
    reason: str
    score: float
    middle: tuple = ()

    @property
    def all_inputs(self) -> tuple:
        mid = tuple(f for _, files in self.middle for f in files)
        return self.inputs + mid + self.next_inputs

    def deletions(self) -> list[tuple[int, int]]:
        """(level, file number) of every input, for the VersionEdit."""
        out = [(self.level, f.number) for f in self.inputs]
        out += [(lv, f.number) for lv, files in self.middle for f in files]
        out += [(self.output_level, f.number) for f in self.next_inputs]
        return out

    @property
    def smallest(self) -> bytes:
        return min(f.smallest for f in self.all_inputs)

    @property
    def largest(self) -> bytes:
        return max(f.largest for f in self.all_inputs)

    def input_bytes(self) -> int:
        return sum(f.size for f in self.all_inputs)


def _levels_of(version) -> Sequence[Sequence]:
    return version.levels if hasattr(version, "levels") else version


def level_bytes(files) -> int:
    return sum(f.size for f in files)


def scores(version, options) -> list[float]:
    """Compaction score of each level 0..NUM_LEVELS-2 (the last level has none)."""
    levels = _levels_of(version)
    out = [len(levels[0]) / options.l0_compaction_trigger]
    for n in range(1, NUM_LEVELS - 1):
        out.append(level_bytes(levels[n]) / options.max_bytes_for_level(n))
    return out


def compaction_debt(version, options) -> int:
    """Bytes that compactions would write to bring every level within its target, estimated
    as Pebble's estimatedCompactionDebt does: all of L0 goes into L1 with the whole of L1
    (L0 tables span most keys); then each level over its target passes its excess down,
    rewriting with it the next level's bytes in proportion (excess x (1 + next / level)).
    Unlike Pebble, L0 into an empty L1 counts too: L0 tables are never moved (they overlap),
    so every L0 byte is rewritten. Below L1 an excess into an empty level costs nothing (a
    move). The write controller's signal (engine/write_controller.py): it grows while
    compactions fall behind and shrinks as they catch up. O(levels) on a Version (its sizes
    per level are kept), O(tables) on bare level tuples."""
    size_of = _level_size_fn(version)
    added = size_of(0)
    debt = added + size_of(1) if added else 0
    for n in range(1, NUM_LEVELS - 1):
        size = size_of(n) + added
        target = options.max_bytes_for_level(n)
        if size <= target:
            added = 0
            continue
        added = size - target
        nxt = size_of(n + 1)
        if nxt:
            debt += int(added * (1 + nxt / size))
    return debt


def _level_size_fn(version):
    """level -> bytes: a Version's kept sums, or sums over bare level tuples."""
    if hasattr(version, "level_bytes"):
        return version.level_bytes
    levels = _levels_of(version)
    return lambda n: level_bytes(levels[n])


def overlapping(files, lo: bytes, hi: bytes, level: int = 0) -> list:
    """Files of ``level`` whose key range intersects [lo, hi]. For L1+ (``level`` >= 1:
    ``files`` sorted by key and non-overlapping) two bisections, O(log n); for L0 (the
    default; also any unordered list) a linear scan, O(n)."""
    if level == 0:
        return [f for f in files if not (f.largest < lo or f.smallest > hi)]
    i = bisect_left(files, lo, key=_largest)  # first whose largest >= lo
    j = bisect_right(files, hi, lo=i, key=_smallest)  # past the last whose smallest <= hi
    return list(files[i:j])


def _largest(f) -> bytes:
    return f.largest


def _smallest(f) -> bytes:
    return f.smallest


def is_bottommost(levels, output_level: int, lo: bytes, hi: bytes) -> bool:
    """True when no level deeper than output_level holds a key in [lo, hi].
    O(levels x log n) (the levels below are L1+, sorted)."""
    for n in range(output_level + 1, NUM_LEVELS):
        files = levels[n]
        i = bisect_left(files, lo, key=_largest)
        if i < len(files) and not files[i].smallest > hi:
            return False
    return True


def pick(version, options, now: float = math.inf, born=None) -> CompactionTask | None:
    """The most urgent compaction, or None when every level is within its target and no
    table's tombstone density reaches ``options.tombstone_compaction_ratio`` (counting only
    the tables unchanged for ``options.tombstone_compaction_delay`` at ``now``, given their
    birth times ``born``: see :func:`tombstone_task`)."""
    levels = _levels_of(version)
    sc = scores(levels, options)
    best = max(range(len(sc)), key=lambda n: (sc[n], -n))
    if sc[best] < 1.0:
        return tombstone_task(levels, getattr(options, "tombstone_compaction_ratio", None),
                              getattr(options, "tombstone_compaction_delay", 0.0), now, born)
    if best == 0:
        return level_task(levels, 0, reason="l0-count", score=sc[0])
    return _pick_one_file(levels, best, options, sc[best])


def tombstone_density(f) -> float:
    """num_deletions / num_entries of one table (0 for an empty one)."""
    return f.num_deletions / f.num_entries if f.num_entries > 0 else 0.0


TOMBSTONE_TRIES = 16
"""At most this many candidates' tasks are built and tested per :func:`tombstone_task` call
(the densest; all of L0 counts as one), so that ``pick`` stays cheap under the DB mutex."""


def _birth(born, f) -> float:
    """``f``'s birth time in ``born`` (number -> time); -inf (long ago) when not there."""
    if born is None:
        return -math.inf
    t = born.get(f.number)
    return -math.inf if t is None else t


def _eligible_from(levels, delay: float, born):
    """A function (level, file) -> the time from which the delay lets the tombstone rule pick
    that table: its birth + ``delay`` for L1+, the youngest L0 table's birth + ``delay`` for
    every L0 table (L0 has been quiet: no flush into it for the delay)."""
    if not delay:
        return lambda n, f: -math.inf
    l0 = max((_birth(born, f) for f in levels[0]), default=-math.inf) + delay

    def eligible_from(n, f):
        return l0 if n == 0 else _birth(born, f) + delay
    return eligible_from


def tombstone_task(version, ratio: float | None, delay: float = 0.0, now: float = math.inf,
                   born=None) -> CompactionTask | None:
    """The "tombstones" compaction (module docstring), or None (also when ``ratio`` is 0 or
    None: disabled). Candidates are the tables with density >= ``ratio`` that are old enough
    at ``now`` (``delay`` seconds, 0: any age; ``born``: file number -> birth time on the
    clock of ``now``, a table missing from it counts as born long ago; the module docstring,
    "Idle time"), densest first (ties: the shallower level, then the older table); the first
    whose task is also that dense as a whole (tombstones / entries over every input, the
    overlaps below included) is returned. A table exactly ``delay`` old is eligible.
    Only the :data:`TOMBSTONE_TRIES` (16) densest candidates are tried (all of L0 counting
    as one): a less dense one waits until the size-triggered compactions have taken those
    away. O(tables) to find the candidates (one pass over the manifest's counts) plus
    O(16 x levels x log tables) for the tries (bisections in the sorted levels)."""
    if not ratio:
        return None
    levels = _levels_of(version)
    eligible_from = _eligible_from(levels, delay, born)
    candidates = []
    for n, files in enumerate(levels):
        for f in files:
            d = f.num_deletions
            if d > 0:
                density = d / f.num_entries
                if density >= ratio and eligible_from(n, f) <= now:
                    candidates.append((-density, n, f.number, f))
    # Enough that TOMBSTONE_TRIES distinct tasks are tried even if every L0 table is a candidate.
    candidates = nsmallest(TOMBSTONE_TRIES + len(levels[0]), candidates, key=lambda c: c[:3])
    l0_done = False
    tries = 0
    for neg_d, n, _, f in candidates:
        if tries == TOMBSTONE_TRIES:
            break
        if n == 0:
            if l0_done:
                continue  # every L0 table makes the same task
            l0_done = True
            task = level_task(levels, 0, reason="tombstones", score=-neg_d)
        elif is_bottommost(levels, n, f.smallest, f.largest):
            task = CompactionTask(n, n, (f,), (), True, False, "tombstones", -neg_d)
        else:
            task = level_task(levels, n, reason="tombstones", score=-neg_d, files=(f,))
        tries += 1
        files = task.all_inputs
        entries = sum(x.num_entries for x in files)
        # The same comparison as a candidate's (tombstone_density): deletions / entries >=
        # ratio. deletions >= ratio * entries rounds differently (7 >= 0.07 * 100 is False).
        if entries and sum(x.num_deletions for x in files) / entries >= ratio:
            return task
    return None


def tombstone_wake_at(version, options, now: float, born=None) -> float | None:
    """When the tombstone rule should look again: the earliest time after ``now`` at which a
    table with tombstone density >= ``options.tombstone_compaction_ratio`` that the delay
    holds back now becomes old enough (see :func:`tombstone_task`), or None when no such
    table is held back (the rule off, no delay, or every candidate already eligible). The
    compaction thread waits until then when :func:`pick` returns None, so that an idle DB
    gives its space back without a write to wake it. O(tables)."""
    ratio = getattr(options, "tombstone_compaction_ratio", None)
    delay = getattr(options, "tombstone_compaction_delay", 0.0)
    if not ratio or not delay:
        return None
    levels = _levels_of(version)
    eligible_from = _eligible_from(levels, delay, born)
    wake = None
    for n, files in enumerate(levels):
        for f in files:
            d = f.num_deletions
            if d > 0 and d / f.num_entries >= ratio:
                t = eligible_from(n, f)
                if t > now and (wake is None or t < wake):
                    wake = t
    return wake


def level_task(levels, level: int, *, reason: str, score: float = 0.0,
               files=None) -> CompactionTask | None:
    """Compact ``files`` (default: all of ``level``) into level+1 with their overlaps there."""
    levels = _levels_of(levels)
    inputs = tuple(levels[level] if files is None else files)
    if not inputs or level >= NUM_LEVELS - 1:
        return None
    lo = min(f.smallest for f in inputs)
    hi = max(f.largest for f in inputs)
    nxt = tuple(overlapping(levels[level + 1], lo, hi, level + 1))
    if nxt:
        lo = min(lo, nxt[0].smallest)
        hi = max(hi, nxt[-1].largest)
    trivial = level > 0 and len(inputs) == 1 and not nxt
    return CompactionTask(level, level + 1, inputs, nxt, is_bottommost(levels, level + 1, lo, hi),
                          trivial, reason, score)


def full_compaction_level(version, options) -> int:
    """Where a manual full compaction puts everything: the deepest level holding data, or
    deeper if needed so that the data fits that level's target (so that the result needs no
    further automatic compaction); at least L1."""
    levels = _levels_of(version)
    deepest = max([n for n in range(NUM_LEVELS) if levels[n]] or [1])
    total = sum(level_bytes(files) for files in levels)
    out = max(deepest, 1)
    while out < NUM_LEVELS - 1 and total > options.max_bytes_for_level(out):
        out += 1
    return out


def full_task(version, options) -> CompactionTask | None:
    """A manual full compaction: every table above the output level (see
    :func:`full_compaction_level`) merged with the output level's tables into that level, in
    one pass (each entry is rewritten once). None when there is nothing above it. A lone
    table of L1+ with nothing to merge with is moved (a trivial move), unless the move is
    bottommost and the table holds tombstones (num_deletions > 0): then it is rewritten, so
    that they are dropped."""
    levels = _levels_of(version)
    out = full_compaction_level(levels, options)
    above = [n for n in range(out) if levels[n]]
    if not above:
        return None
    first = above[0]
    inputs = tuple(levels[first])
    middle = tuple((n, tuple(levels[n])) for n in above[1:])
    files = inputs + tuple(f for _, fs in middle for f in fs)
    lo = min(f.smallest for f in files)
    hi = max(f.largest for f in files)
    nxt = tuple(overlapping(levels[out], lo, hi, out))
    trivial = first > 0 and len(files) == 1 and not nxt
    if trivial:
        bottom = is_bottommost(levels, out, lo, hi)
        # A lone table moved to a bottommost level is rewritten instead when it holds
        # tombstones: compact() promises that they are dropped there.
        if not (bottom and getattr(files[0], "num_deletions", 0) > 0):
            return CompactionTask(first, out, inputs, (), bottom, True, "manual", 0.0)
    if nxt:
        lo = min(lo, nxt[0].smallest)
        hi = max(hi, nxt[-1].largest)
    return CompactionTask(first, out, inputs, nxt, is_bottommost(levels, out, lo, hi), False,
                          "manual", 0.0, middle)


def rewrite_tasks(version, stale) -> list[CompactionTask]:
    """Tasks that rewrite in place, at their own level, the tables of L1+ for which
    ``stale(f)`` is true (DB.compact: tables written with another ``compression`` than the
    DB's now, which no full compaction rewrites once everything is in one level). Each task
    takes one maximal run of stale tables adjacent in their level: no other table of the level
    lies between its first and last, so its outputs overlap nothing else there. Reason
    "manual", never a trivial move; bottommost when nothing below overlaps the run. L0 is
    left alone (a full compaction empties it). Empty when nothing is stale."""
    levels = _levels_of(version)
    tasks = []
    for n in range(1, len(levels)):
        run: list = []
        for f in list(levels[n]) + [None]:
            if f is not None and stale(f):
                run.append(f)
                continue
            if run:
                lo, hi = run[0].smallest, run[-1].largest
                tasks.append(CompactionTask(n, n, tuple(run), (),
                                            is_bottommost(levels, n, lo, hi), False, "manual",
                                            0.0))
                run = []
    return tasks


def _pick_one_file(levels, level: int, options, score: float) -> CompactionTask:
    nxt_files = levels[level + 1]
    best = None
    best_ratio = None
    for f in levels[level]:
        over = level_bytes(overlapping(nxt_files, f.smallest, f.largest, level + 1))
        ratio = over / max(f.size, 1)
        if best_ratio is None or ratio < best_ratio:
            best, best_ratio = f, ratio
    return level_task(levels, level, reason=f"l{level}-size", score=score, files=(best,))


def apply(version, task: CompactionTask, outputs: Sequence) -> tuple[tuple, ...]:
    """Levels after ``task`` ran and produced ``outputs`` (file metadata, in key order).

    For a trivial move pass ``outputs=task.inputs``.
    """
    levels = [list(lv) for lv in _levels_of(version)]
    gone = {f.number for f in task.all_inputs}
    for n in range(task.level, task.output_level):
        levels[n] = [f for f in levels[n] if f.number not in gone]
    out_level = [f for f in levels[task.output_level] if f.number not in gone]
    out_level.extend(outputs)
    if task.output_level > 0:
        out_level.sort(key=lambda f: f.smallest)
    levels[task.output_level] = out_level
    return tuple(tuple(lv) for lv in levels)


def check_levels(version) -> None:
    """Raise AssertionError unless L1+ are sorted and non-overlapping."""
    levels = _levels_of(version)
    for n in range(1, len(levels)):
        files = levels[n]
        for a, b in zip(files, files[1:]):
            if not a.largest < b.smallest:
                raise AssertionError(f"L{n} tables {a.number} and {b.number} overlap or are unsorted")
        for f in files:
            if f.smallest > f.largest:
                raise AssertionError(f"L{n} table {f.number} has smallest > largest")
