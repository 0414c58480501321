"""Running a compaction task: the I/O half (picker.py decides, this reads and writes).

``run(task, ...)`` merges the task's input tables (newest entry per key wins, by sequence
number), drops tombstones when the task is bottommost, writes output tables cut at
``target_file_size`` (and at the grandparent-overlap limit), and returns the VersionEdit that
replaces the inputs by the outputs. A trivial move writes nothing: the edit moves the file one
level down. The caller applies the edit through the manifest and only then deletes the inputs.

Thread safety: reads immutable tables and writes only new files; the caller serialises
compactions (one at a time) and protects the reserved output numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..iterators import merge_runs_batched
from ..table_writer import write_tables
from ..version_edit import VersionEdit
from .picker import NUM_LEVELS, CompactionTask


@dataclass
class CompactionResult:
    """The edit to apply and what the compaction did (for stats())."""

    edit: VersionEdit
    outputs: list = field(default_factory=list)
    bytes_read: int = 0
    bytes_written: int = 0
    entries_in: int = 0
    entries_out: int = 0


def _table_entries(table):
    """All entries of ``table`` without filling the block cache (compaction reads once)."""
    return table.iterate(None, fill_cache=False)


def _level_entries(tables):
    for t in tables:
        yield from _table_entries(t)


def run(task: CompactionTask, *, version, tables, fs, dirname: str, options, table_options,
        new_number, on_number=None, should_stop=None) -> CompactionResult:
    """Execute ``task`` against ``version`` (the version it was picked from or a later one in
    which its inputs are still live). ``tables`` is the DB's TableSet; ``table_options`` the
    TableOptions for the outputs (filters sized for the output level)."""
    edit = VersionEdit()
    for level, number in task.deletions():
        edit.delete_file(level, number)
    if task.trivial_move:
        for f in task.inputs:
            edit.add_file(task.output_level, f)
        return CompactionResult(edit, list(task.inputs))
    if task.level == 0:
        sources = [_table_entries(tables.get(f.number)) for f in task.inputs]
    else:
        sources = [_level_entries([tables.get(f.number) for f in task.inputs])]
    for _level, files in task.middle:
        sources.append(_level_entries([tables.get(f.number) for f in files]))
    if task.next_inputs:
        sources.append(_level_entries([tables.get(f.number) for f in task.next_inputs]))
    merged = merge_runs_batched(sources)
    grandparents = []
    if task.output_level + 1 < NUM_LEVELS:
        grandparents = list(version.levels[task.output_level + 1])
    outputs = write_tables(
        fs, dirname, merged, new_number=new_number, table_options=table_options,
        target_file_size=options.target_file_size, grandparents=grandparents,
        max_grandparent_overlap=options.max_grandparent_overlap_factor * options.target_file_size,
        drop_tombstones=task.bottommost, on_number=on_number, should_stop=should_stop)
    for f in outputs:
        edit.add_file(task.output_level, f)
    return CompactionResult(
        edit, outputs, bytes_read=task.input_bytes(), bytes_written=sum(f.size for f in outputs),
        entries_in=sum(f.num_entries for f in task.all_inputs),
        entries_out=sum(f.num_entries for f in outputs))

