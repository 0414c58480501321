"""Writing sorted entries into new table files: the output side of flushes and compactions.

:func:`write_tables` consumes batches of entries (sorted, one entry per key) and writes one or
more tables, cutting a new one when the current table reaches ``target_file_size`` or when it
overlaps too much of the grandparent level (LevelDB's ``ShouldStopBefore``: a table that spans
many grandparent tables makes its own later compaction expensive). Each table is fsynced and
closed, then the directory is fsynced once, before the caller refers to the tables in the
manifest (docs/format.md, "Manifest": durability order).

On any error every file this call created is removed (best effort) and the error propagates:
no partial table is ever left for the manifest to reference.

Thread safety: a call uses only its own files; many calls may run at once.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import islice
from operator import itemgetter
from typing import Callable, Iterable, Iterator

from .errors import SieveError
from .filenames import table_file_name
from .format import KIND_DELETE
from .sstable import TableBuilder, TableOptions
from .version_edit import FileMeta

SIZE_CHECK_EVERY = 32
"""Entries between two checks of the builder's size estimate (the estimate is not free)..."""

SIZE_CHECK_FRACTION = 32
"""...or sooner, once the entries added since the last check hold 1/32 of the target file size
(large values: an output then overshoots its target by about one entry, not 31)."""


_entry_key = itemgetter(0)  # an entry's key: (key, seq, kind, value)

LIST_BATCH = 2048
"""Entries taken at a time from a batch given as an iterator (a flush job's, which slices each
value from the memtable's buffer only when its entry is reached): lists of this many."""


def _as_lists(batches: Iterable) -> Iterator[list]:
    """Each batch as a list; one given as another iterable is cut into lists of LIST_BATCH,
    so that it is never held whole."""
    for batch in batches:
        if type(batch) is list:
            yield batch
        else:
            it = iter(batch)
            while chunk := list(islice(it, LIST_BATCH)):
                yield chunk


class Cancelled(Exception):
    """Raised inside :func:`write_tables` when ``should_stop()`` turns true (DB closing)."""


class NumbersExhausted(SieveError):
    """A job used every file number reserved for it (the caller reruns it in a thread)."""


class NumberSupply:
    """``new_number`` for a job that runs in a worker process: hands out numbers the DB
    reserved in advance (only the DB's manifest may allocate numbers)."""

    def __init__(self, numbers):
        self._it = iter(numbers)

    def __call__(self) -> int:
        for n in self._it:
            return n
        raise NumbersExhausted("the file numbers reserved for this job ran out")


def meta_from_properties(number: int, file_size: int, props) -> FileMeta:
    """The manifest's record of a finished table."""
    return FileMeta(
        number=number,
        size=file_size,
        smallest=props.smallest_key,
        largest=props.largest_key,
        num_entries=props.num_entries,
        num_deletions=props.num_tombstones,
        smallest_seq=props.smallest_seq,
        largest_seq=props.largest_seq,
        filter_bits_per_key=float(props.bits_per_key),
        filter_bytes=props.filter_bytes,
    )


def write_tables(fs, dirname: str, batches: Iterable[list], *,
                 new_number: Callable[[], int],
                 table_options: TableOptions,
                 target_file_size: int | None = None,
                 grandparents: list | None = None,
                 max_grandparent_overlap: int | None = None,
                 drop_tombstones: bool = False,
                 on_number: Callable[[int], None] | None = None,
                 should_stop: Callable[[], bool] | None = None) -> list[FileMeta]:
    """Write ``batches`` (lists, or other iterables, of (key, seq, kind, value), keys increasing
    across batches) into synced tables; return their FileMeta in key order (empty list if
    nothing was left).

    ``new_number()`` reserves a file number per table (``on_number(n)`` is told each one so
    the caller can protect it from obsolete-file sweeps). ``drop_tombstones``: tombstones are
    not written (only when no older data can exist below). ``grandparents``: FileMeta of the
    level below the output level, sorted, for the overlap cut.
    """
    outputs: list[FileMeta] = []
    created: list[str] = []
    state = {"builder": None, "wfile": None, "number": 0}
    gp = grandparents or []
    gp_limit = max_grandparent_overlap
    gi = 0
    overlapped = 0
    seen_key = False

    def open_next():
        number = new_number()
        if on_number is not None:
            on_number(number)
        path = table_file_name(dirname, number)
        created.append(path)
        wfile = fs.open_writable(path)
        state["wfile"] = wfile
        state["number"] = number
        state["builder"] = TableBuilder(wfile, table_options)

    def finish_current():
        b = state["builder"]
        wfile = state["wfile"]
        state["builder"] = None
        if b.num_entries == 0:
            b.abandon()
            wfile.close()
            fs.remove(created.pop())
            return
        props = b.finish()
        wfile.sync()
        wfile.close()
        outputs.append(meta_from_properties(state["number"], b.file_size, props))

    try:
        since_check = since_bytes = 0
        check_bytes = (target_file_size // SIZE_CHECK_FRACTION) if target_file_size else 0
        ngp = len(gp)
        for batch in _as_lists(batches):
            if should_stop is not None and should_stop():
                raise Cancelled()
            if drop_tombstones:
                batch = [e for e in batch if e[2] != KIND_DELETE]
            b = state["builder"]  # this loop keeps b in step with state["builder"]
            # Each round adds a run of entries with one add_many call: the entries up to the
            # next grandparent boundary, the next size check, or the batch's end. What the
            # rules decide per entry (a grandparent cut, a new table, a size check) happens at
            # a run's first entry or after its last, as if each entry were added alone.
            i, n = 0, len(batch)
            while i < n:
                run_end = n
                if gp:
                    key = batch[i][0]
                    while gi < ngp and key > gp[gi].largest:
                        if seen_key:
                            overlapped += gp[gi].size
                        gi += 1
                    seen_key = True
                    if b is not None and gp_limit is not None and overlapped > gp_limit:
                        finish_current()
                        overlapped = 0
                        b = None
                    if gi < ngp:  # the run stops before the first key past this grandparent
                        run_end = bisect_right(batch, gp[gi].largest, i + 1, n, key=_entry_key)
                    if b is None and gp_limit is not None and overlapped > gp_limit:
                        run_end = i + 1  # the next entry cuts the table this one opens
                if b is None:
                    open_next()
                    b = state["builder"]
                if target_file_size is None:
                    i = b.add_many(batch, i, run_end)[0]
                    continue
                j, added = b.add_many(batch, i, min(run_end, i + SIZE_CHECK_EVERY - since_check),
                                      check_bytes - since_bytes)
                since_check += j - i
                since_bytes += added
                i = j
                if since_check >= SIZE_CHECK_EVERY or since_bytes >= check_bytes:
                    since_check = since_bytes = 0
                    if b.estimated_file_size() >= target_file_size:
                        finish_current()
                        b = None
        if state["builder"] is not None:
            finish_current()
        if outputs:
            fs.sync_dir(dirname)
        return outputs
    except BaseException:
        b = state["builder"]
        if b is not None:
            b.abandon()
            try:
                state["wfile"].close()
            except Exception:
                pass
        for path in created:
            try:
                fs.remove(path)
            except Exception:
                pass
        raise


def flush_job(dirname: str, columns, numbers: list, table_options: TableOptions) -> list[FileMeta]:
    """Worker-process job (engine/table_workers.py): write a frozen memtable's entries, sent
    as :meth:`~engine.memtable.MemTable.columns` (unsorted; sorted here, in the worker's own
    process), as one table numbered from ``numbers``, on the real file system. Same result as
    a flush in a thread."""
    from .memtable import entries_from_columns
    from .vfs import default_fs

    return write_tables(default_fs(), dirname, [entries_from_columns(columns)],
                        new_number=NumberSupply(numbers), table_options=table_options)
