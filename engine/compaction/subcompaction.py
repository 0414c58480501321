"""Splitting one compaction into key ranges run at once (RocksDB's subcompactions).

An L0 -> L1 compaction merges every L0 table with the L1 tables they overlap: hundreds of
MiB written by one table worker while the other workers idle and writers slow down behind a
growing L0 (bench/results/db.md, "Session 15: sustained ingest"). With ``max_subcompactions``
> 1 the DB cuts such a job at keys chosen here into ranges of about equal input bytes; each
range is an ordinary :class:`~engine.compaction.runner.CompactionJob` with ``bounds`` set,
run in its own table worker, and the DB installs all their outputs in one version edit. The
ranges do not overlap and cover every key, so the outputs are what one job would have
written, cut at a few more places.
"""

from __future__ import annotations

from dataclasses import replace

from .picker import CompactionTask
from .runner import CompactionJob

MIN_SPLIT_TARGETS = 4
"""A compaction is split only if its inputs hold at least this many ``target_file_size``: a
smaller one ends soon anyway, and each range writes at least one table of its own."""


def split_points(task: CompactionTask, open_table, parts: int) -> list[bytes]:
    """Up to ``parts - 1`` increasing keys cutting ``task``'s inputs into ranges of about
    equal bytes: quantiles of the inputs' data block separators (one per ~4 KiB block, read
    from the open tables' indexes; ``open_table(number)`` returns an open Table)."""
    seps: list[bytes] = []
    for f in task.all_inputs:
        seps.extend(open_table(f.number).block_separators())
    seps.sort()
    out: list[bytes] = []
    for i in range(1, parts):
        if not seps:
            break
        k = seps[len(seps) * i // parts]
        if not out or k > out[-1]:
            out.append(k)
    return out


def split(job: CompactionJob, points: list[bytes]) -> list[CompactionJob]:
    """``job`` as one job per range: [None, p0), [p0, p1), ..., [p_last, None)."""
    edges = [None, *points, None]
    return [replace(job, bounds=(edges[i], edges[i + 1]), numbers=[])
            for i in range(len(edges) - 1)]
