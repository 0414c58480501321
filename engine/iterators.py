"""Iterators that combine sources of entries: one rule for equal keys, newest wins.

An *entry* is ``(key, seq, kind, value)``. A *source* is an iterator of entries in strictly
increasing key order (a memtable range, a table, a level's tables one after another). Across
sources the same key may appear several times; the entry with the largest sequence number wins
and the others are dropped. Tombstones are passed through (the caller hides them: scans drop
them, compaction keeps them unless it writes the bottom level).

- :func:`merge_newest` is a lazy k-way heap merge (scans: cheap to start, cost per entry
  O(log k); a single source is passed through as it is).
- :func:`merge_runs_batched` merges in batches with ``list.sort`` (compaction: throughput; the
  sort runs in C and detects the already-sorted runs, so a batch costs O(m log k)).
- :func:`concat_tables` walks the tables of one sorted level from a start key.
- :func:`live_items` hides tombstones and applies an exclusive end bound and a limit.
"""

from __future__ import annotations

from bisect import bisect_right
from heapq import heapify, heappop, heapreplace
from itertools import chain, islice
from operator import itemgetter
from typing import Iterable, Iterator

from .format import KIND_DELETE

Entry = tuple  # (key: bytes, seq: int, kind: int, value: bytes)
_KEY = itemgetter(0)


def merge_newest(sources: Iterable[Iterator[Entry]]) -> Iterator[Entry]:
    """Merge sorted sources into one sorted stream with one entry per key (largest seq wins).

    Reads the first entry of every source when called (so call it where the scan starts). When
    at most one source has entries (a settled DB, a scan inside one level's range) the result
    is that source itself, behind its first entry (``itertools.chain``: no Python frame per
    entry); otherwise a lazy heap merge, O(log k) per entry for k sources.
    """
    heap = []
    for i, src in enumerate(sources):
        it = iter(src)
        for e in it:
            heap.append((e[0], -e[1], i, e, it))
            break
    if len(heap) <= 1:
        return chain((heap[0][3],), heap[0][4]) if heap else iter(())
    return _heap_merge(heap)


def _heap_merge(heap: list) -> Iterator[Entry]:
    """:func:`merge_newest` of the primed sources in ``heap`` (at least two)."""
    heapify(heap)
    last_key = None
    while len(heap) > 1:
        key, _nseq, i, e, it = heap[0]
        if key != last_key:
            last_key = key
            yield e
        nxt = next(it, None)
        if nxt is None:
            heappop(heap)
        else:
            heapreplace(heap, (nxt[0], -nxt[1], i, nxt, it))
    if heap:  # one source left: no heap work per entry
        key, _nseq, _i, e, it = heap[0]
        if key != last_key:
            yield e
        yield from it


MERGE_BATCH = 2048  # entries merge_runs_batched reads from a source at a time


def merge_runs_batched(sources: list[Iterator[Entry]],
                       batch: int = MERGE_BATCH) -> Iterator[list[Entry]]:
    """Merge sorted sources; yield sorted lists of entries with one entry per key, newest wins.

    Each round reads up to ``batch`` entries from the sources at the frontier (every source on
    the first round, then those whose last key read is the smallest among the sources that
    still have entries), and emits everything up to that smallest last key: all entries at or
    below it have been read from every source. A source that runs ahead (an L0 table whose
    ``batch`` entries span the whole key range, a level whose range starts after another's
    ends) is not read again until the frontier reaches its last key, so at most about
    ``batch`` entries per source wait to be emitted, whatever the sources' sizes. Each source
    keeps its own waiting entries (sorted, as read); a round cuts each at the bound and sorts
    only what it emits, runs of the sources that the sort merges: O(log k) comparisons per
    entry for k sources. (Until session 14 every live source was read each round into one
    pending list, and the entries of one running ahead piled up: a whole level's worth when
    two levels covered separate ranges.)
    """
    iters = [iter(s) for s in sources]
    lasts: dict[int, bytes] = {}  # source -> its last key read; the sources not yet exhausted
    waiting: dict[int, list[Entry]] = {}  # source -> its entries read and not yet emitted
    todo = range(len(iters))  # the sources to read this round
    while True:
        for i in todo:
            chunk = list(islice(iters[i], batch))
            if chunk:
                w = waiting.get(i)
                if w:
                    w.extend(chunk)
                else:
                    waiting[i] = chunk
            if len(chunk) == batch:
                lasts[i] = chunk[-1][0]
            else:
                lasts.pop(i, None)  # exhausted
        bound = min(lasts.values()) if lasts else None
        out: list[Entry] = []
        for i, w in list(waiting.items()):
            cut = len(w) if bound is None else bisect_right(w, bound, key=_KEY)
            if cut == len(w):
                out.extend(w)
                del waiting[i]
            elif cut:
                out.extend(w[:cut])
                waiting[i] = w[cut:]
        if out:
            # Tuples sort by key, then seq (unique per key): the newest version of a key comes
            # last. ``out`` is the sources' sorted runs one after another: the sort merges them.
            out.sort()
            yield _dedup_sorted(out)
        if bound is None:
            return
        todo = [i for i, last in lasts.items() if last == bound]


def _dedup_sorted(entries: list[Entry]) -> list[Entry]:
    """Keep the last (newest) entry of each run of equal keys. ``entries`` sorted by (key, seq)."""
    out = []
    append = out.append
    prev = None
    for e in entries:
        if prev is not None and prev[0] != e[0]:
            append(prev)
        prev = e
    if prev is not None:
        append(prev)
    return out


def concat_tables(tables, start: bytes | None = None) -> Iterator[Entry]:
    """Entries of non-overlapping ``tables`` (sorted by key range) from ``start`` on: each
    table's blocks' entry lists (``Table.blocks``) chained, a table opened for reading only
    when the one before it is used up."""
    return chain.from_iterable(_level_blocks(tables, start))


def _level_blocks(tables, start):
    for t in tables:
        yield from t.blocks(start)
        start = None


def live_items(entries: Iterator[Entry], end: bytes | None = None,
               limit: int | None = None) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) of non-tombstone entries with key < end (exclusive), at most ``limit``."""
    if limit is not None and limit <= 0:
        return
    n = 0
    for key, _seq, kind, value in entries:
        if end is not None and key >= end:
            return
        if kind == KIND_DELETE:
            continue
        yield key, value
        n += 1
        if limit is not None and n >= limit:
            return
