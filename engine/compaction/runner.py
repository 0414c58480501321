"""Running a compaction task: the I/O half (picker.py decides, this reads and writes).

``plan(task, version, options, table_options)`` turns a task into a picklable
:class:`CompactionJob`; ``execute(job, ...)`` merges the job's input tables (newest entry per
key wins, by sequence number), drops tombstones when the task is bottommost, writes output
tables cut at ``target_file_size`` (and at the grandparent-overlap limit) and returns the
VersionEdit that replaces the inputs by the outputs. A trivial move writes nothing: the edit
moves the file one level down. ``execute`` runs in a DB thread or, through
:func:`compaction_job`, in a worker process (engine/table_workers.py). The caller applies the
edit through the manifest and only then deletes the inputs.

Thread safety: reads immutable tables and writes only new files; the caller serialises
compactions (one at a time; the key ranges of one split compaction, engine/compaction/
subcompaction.py, run at once, each writing its own files) and protects the output numbers.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from operator import itemgetter

from ..filenames import table_file_name
from ..format import FILTER_PAGE_SIZE
from ..iterators import merge_runs_batched
from ..sstable import Table, TableOptions
from ..table_writer import NumberSupply, write_tables
from ..version_edit import VersionEdit
from .picker import NUM_LEVELS, CompactionTask


@dataclass
class CompactionJob:
    """Everything needed to execute a task, without the DB (picklable)."""

    task: CompactionTask
    dirname: str
    grandparents: list
    target_file_size: int
    max_grandparent_overlap: int
    table_options: TableOptions
    numbers: list = field(default_factory=list)  # reserved output numbers (worker runs)
    input_raw_bytes: int = 0  # raw_input_bytes() of the task; 0: unknown (stored sizes)
    bounds: tuple = (None, None)  # (lo, hi): only the keys lo <= key < hi (subcompaction.py)


@dataclass
class CompactionResult:
    """The edit to apply and what the compaction did (for stats())."""

    edit: VersionEdit
    outputs: list = field(default_factory=list)
    bytes_read: int = 0
    bytes_written: int = 0
    entries_in: int = 0
    entries_out: int = 0


def plan(task: CompactionTask, version, options, table_options: TableOptions,
         dirname: str) -> CompactionJob:
    grandparents = []
    if task.output_level + 1 < NUM_LEVELS:
        grandparents = list(version.levels[task.output_level + 1])
    return CompactionJob(task, dirname, grandparents, options.target_file_size,
                         options.max_grandparent_overlap_factor * options.target_file_size,
                         table_options)


def raw_input_bytes(task: CompactionTask, open_table) -> int:
    """The inputs' file bytes with every data block counted raw (uncompressed), from the
    properties of their open tables (``open_table(number)``); equals ``task.input_bytes()``
    when nothing is stored compressed."""
    n = 0
    for f in task.all_inputs:
        p = open_table(f.number).properties
        n += f.size + max(0, p.uncompressed_data_bytes - p.data_bytes)
    return n


def max_outputs(job: CompactionJob) -> int:
    """An upper bound on the tables ``job`` can write (numbers to reserve for a worker run; a
    job that still runs out is rerun in the DB's thread: slower, never wrong).

    Why it is enough: a table is cut for size once its estimated file size reaches
    ``target_file_size``, so the size cuts are at most the bytes the outputs can take over
    the target. The outputs hold a subset of the inputs' entries in the same key order
    (merging only lengthens the key prefix an entry shares with the one before it), so
    their data blocks, written raw, take no more than the inputs' data blocks raw:
    ``job.input_raw_bytes``, not the stored sizes, which undercount inputs stored
    compressed (lz4 tables rewritten with compression "none" need about the compression
    ratio times as many tables: tests/test_review_compression.py). Output compression only
    makes tables smaller. The factor 2 and the 8 spare numbers cover what the outputs may
    add over the inputs: restart points at other entries, each table's fixed cost (a
    filter page and the metadata tail, counted in the estimate), a hash index or a filter
    with more bits per key than the inputs had. Grandparent cuts add at most one per
    ``max_grandparent_overlap`` bytes overlapped below.

    That holds while the fixed cost stays under half the target. With a smaller target (a
    test's few KiB: the estimate of an empty table is already a filter page and more) every
    size check cuts, a table may hold a single entry, and the only bound is that every table
    holds at least one: the inputs' entry count (capped at ``MAX_RESERVED_OUTPUTS``; a job
    past it falls back to the DB's thread). That case used to run out of numbers on every
    compaction and run it in the DB's thread, where, beside busy readers and writers, the
    first L0 compaction of tests/test_review_engine.py's scan test took seconds.
    """
    t = job.task
    lo, hi = t.smallest, t.largest
    gp_bytes = sum(f.size for f in job.grandparents if not (f.largest < lo or f.smallest > hi))
    gp_cuts = gp_bytes // max(1, job.max_grandparent_overlap)
    if job.target_file_size < 2 * TABLE_FIXED_COST:
        return min(sum(f.num_entries for f in t.all_inputs), MAX_RESERVED_OUTPUTS) + 8
    size_cuts = max(job.input_raw_bytes, t.input_bytes()) // max(1, job.target_file_size)
    return 2 * (size_cuts + gp_cuts) + 8


_entry_key = itemgetter(0)

TABLE_FIXED_COST = FILTER_PAGE_SIZE + 256
"""What an output table's size estimate counts besides its data, index and filter bits
(TableBuilder.estimated_file_size): the filter region's page and the metadata tail."""

MAX_RESERVED_OUTPUTS = 4096
"""The most file numbers one compaction reserves for its outputs (see max_outputs)."""


def _until(batches, hi):
    """``batches`` (sorted lists of entries) cut before the first key >= ``hi``."""
    for batch in batches:
        if batch[-1][0] >= hi:
            j = bisect_left(batch, hi, key=_entry_key)
            if j:
                yield batch[:j]
            return
        yield batch


def _overlapping(files, lo, hi):
    """The FileMeta of ``files`` holding keys in [lo, hi) (None: unbounded)."""
    return [f for f in files if (lo is None or f.largest >= lo) and (hi is None or f.smallest < hi)]


def execute(job: CompactionJob, *, fs, open_table, new_number, on_number=None,
            should_stop=None) -> CompactionResult:
    """Run ``job``; ``open_table(number)`` returns an open Table for an input file. A job
    with ``bounds`` (a subcompaction) merges and writes only the inputs' keys in that range;
    its edit still deletes every input (the caller combines the parts' outputs)."""
    task = job.task
    edit = VersionEdit()
    for level, number in task.deletions():
        edit.delete_file(level, number)
    if task.trivial_move:
        for f in task.inputs:
            edit.add_file(task.output_level, f)
        return CompactionResult(edit, list(task.inputs))
    lo, hi = job.bounds

    def entries(t):  # read once: not through the block cache
        return t.iterate(lo, fill_cache=False)

    def level(files):
        ts = [open_table(f.number) for f in _overlapping(files, lo, hi)]
        for t in ts:
            yield from entries(t)

    if task.level == 0:
        sources = [entries(open_table(f.number)) for f in _overlapping(task.inputs, lo, hi)]
    else:
        sources = [level(task.inputs)]
    for _level, files in task.middle:
        sources.append(level(files))
    if task.next_inputs:
        sources.append(level(task.next_inputs))
    merged = merge_runs_batched(sources)
    if hi is not None:
        merged = _until(merged, hi)
    outputs = write_tables(
        fs, job.dirname, merged, new_number=new_number,
        table_options=job.table_options, target_file_size=job.target_file_size,
        grandparents=job.grandparents, max_grandparent_overlap=job.max_grandparent_overlap,
        drop_tombstones=task.bottommost, on_number=on_number, should_stop=should_stop)
    for f in outputs:
        edit.add_file(task.output_level, f)
    return CompactionResult(
        edit, outputs, bytes_read=task.input_bytes(), bytes_written=sum(f.size for f in outputs),
        entries_in=sum(f.num_entries for f in task.all_inputs),
        entries_out=sum(f.num_entries for f in outputs))


def compaction_job(job: CompactionJob) -> CompactionResult:
    """Worker-process job: execute ``job`` on the real file system with its own table
    handles (metadata only is read at open; blocks are read once, not cached)."""
    from ..vfs import default_fs

    fs = default_fs()
    opened = {}

    def open_table(number: int):
        t = opened.get(number)
        if t is None:
            t = opened[number] = Table.open(fs, table_file_name(job.dirname, number),
                                            file_number=number)
        return t

    try:
        return execute(job, fs=fs, open_table=open_table, new_number=NumberSupply(job.numbers))
    finally:
        for t in opened.values():
            t.close()
