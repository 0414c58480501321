"""Memtable and iterator unit tests: newest-only map, chunked iteration, newest-wins merges."""

import random
import threading

from engine.format import KIND_DELETE, KIND_VALUE, MAX_SEQUENCE
from engine.iterators import concat_tables, live_items, merge_newest, merge_runs_batched
import pytest

from engine.memtable import ENTRY_OVERHEAD, Columns, MemTable, entries_from_columns


def test_add_get_overwrite_and_delete():
    m = MemTable(log_number=7)
    last = m.add(10, [(KIND_VALUE, b"b", b"1"), (KIND_VALUE, b"a", b"2"), (KIND_VALUE, b"b", b"3")])
    assert last == 12
    assert m.get(b"b") == (12, KIND_VALUE, b"3")
    assert m.get(b"a") == (11, KIND_VALUE, b"2")
    assert m.get(b"zz") is None
    m.add(13, [(KIND_DELETE, b"a", b"")])
    assert m.get(b"a") == (13, KIND_DELETE, b"")
    assert len(m) == 2
    assert m.approximate_bytes == 2 + 2 + 2 + 1 + 4 * ENTRY_OVERHEAD
    assert m.log_number == 7
    m.freeze()
    assert list(m.items()) == [(b"a", 13, KIND_DELETE, b""), (b"b", 12, KIND_VALUE, b"3")]


def test_columns_unpack_to_the_sorted_entries():
    """What a flush sends a table worker (unsorted flat buffers) unpacks to exactly what an
    in-thread flush writes: items() in key order, overwrites and tombstones included."""
    rng = random.Random(5)
    m = MemTable()
    seq = 1
    for _ in range(3000):
        k = rng.randbytes(rng.randrange(1, 40))
        if rng.random() < 0.2:
            m.add(seq, [(KIND_DELETE, k, b"")])
        else:
            m.add(seq, [(KIND_VALUE, k, rng.randbytes(rng.randrange(0, 300)))])
        seq += 1
        if rng.random() < 0.3:  # overwrite an earlier key: its first position in the dict
            m.add(seq, [(KIND_VALUE, k, b"again")])
            seq += 1
    m.add(seq, [(KIND_VALUE, b"big-seq", b"v")])
    m.add(MAX_SEQUENCE, [(KIND_VALUE, b"x" * 70000, b"")])  # u32 length, the largest seq
    m.freeze()
    cols = m.columns()
    assert list(entries_from_columns(cols)) == list(m.items())


def test_frozen_memtable_sorts_lazily_once_for_concurrent_readers():
    m = MemTable()
    keys = [random.Random(2).randbytes(8) for _ in range(20000)]
    m.add(1, [(KIND_VALUE, k, b"") for k in keys])
    m.freeze()  # O(1): nothing sorted yet
    out = []
    ts = [threading.Thread(target=lambda: out.append([e[0] for e in m.items()]))
          for _ in range(4)]
    ts += [threading.Thread(target=lambda: out.append([e[0] for e in m.iterate()]))
           for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(out) == 8 and all(o == sorted(set(keys)) for o in out)


def test_columns_that_disagree_are_refused():
    m = MemTable()
    m.add(1, [(KIND_VALUE, b"a", b"1"), (KIND_VALUE, b"b", b"2")])
    m.freeze()
    c = m.columns()
    short = c.record_lens[:4] + (7).to_bytes(4, "little")  # a record shorter than its tag
    for bad in (c._replace(keys=c.keys[:-1]), c._replace(records=c.records + b"x"),
                c._replace(record_lens=c.record_lens[:4]),
                c._replace(records=c.records[:-2], record_lens=short)):
        with pytest.raises(ValueError, match="disagree"):
            entries_from_columns(bad)
    assert isinstance(c, Columns)


def test_iterate_bounds_and_chunks():
    m = MemTable()
    keys = [b"%05d" % i for i in range(1000)]
    m.add(1, [(KIND_VALUE, k, k) for k in keys])
    got = [e[0] for e in m.iterate(b"00100", b"00900", chunk=7)]
    assert got == keys[100:900]
    assert [e[0] for e in m.iterate()] == keys
    assert list(m.iterate(b"a")) == []
    assert [e[0] for e in m.iterate(None, b"00003", chunk=1)] == keys[:3]


def test_iterate_while_writing_never_repeats_or_misorders():
    m = MemTable()
    m.add(1, [(KIND_VALUE, b"%06d" % i, b"v") for i in range(0, 20000, 2)])
    stop = threading.Event()

    def writer():
        seq = 100000
        rnd = random.Random(1)
        while not stop.is_set():
            seq = m.add(seq + 1, [(KIND_VALUE, b"%06d" % rnd.randrange(20000), b"w")])

    t = threading.Thread(target=writer)
    t.start()
    try:
        for _ in range(5):
            keys = [e[0] for e in m.iterate(chunk=16)]
            assert keys == sorted(set(keys))
            assert set(b"%06d" % i for i in range(0, 20000, 2)) <= set(keys)
    finally:
        stop.set()
        t.join()


def _src(pairs):
    return iter([(k, s, KIND_VALUE if v is not None else KIND_DELETE, v or b"") for k, s, v in pairs])


def test_merge_newest_picks_largest_seq():
    a = _src([(b"a", 5, b"a5"), (b"c", 1, b"c1"), (b"d", 9, None)])
    b = _src([(b"a", 7, b"a7"), (b"b", 2, b"b2"), (b"d", 3, b"d3")])
    c = _src([(b"c", 4, b"c4")])
    out = list(merge_newest([a, b, c]))
    assert [(e[0], e[1]) for e in out] == [(b"a", 7), (b"b", 2), (b"c", 4), (b"d", 9)]
    assert list(live_items(iter(out))) == [(b"a", b"a7"), (b"b", b"b2"), (b"c", b"c4")]
    assert list(live_items(iter(out), end=b"c")) == [(b"a", b"a7"), (b"b", b"b2")]
    assert list(live_items(iter(out), limit=1)) == [(b"a", b"a7")]
    assert list(live_items(iter(out), limit=0)) == []


def test_batched_merge_equals_heap_merge_on_random_runs():
    rnd = random.Random(42)
    for trial in range(30):
        seq = 0
        runs = []
        for _ in range(rnd.randrange(1, 6)):
            keys = sorted(set(rnd.randrange(300) for _ in range(rnd.randrange(0, 200))))
            run = []
            for k in keys:
                seq += 1
                run.append((b"%04d" % k, seq, rnd.choice([KIND_VALUE, KIND_DELETE]), b"v%d" % seq))
            runs.append(run)
        rnd.shuffle(runs)
        want = list(merge_newest([iter(r) for r in runs]))
        got = [e for batch in merge_runs_batched([iter(r) for r in runs], batch=rnd.randrange(1, 40))
               for e in batch]
        assert got == want, trial
        # Brute force: newest per key.
        best = {}
        for r in runs:
            for e in r:
                if e[0] not in best or best[e[0]][1] < e[1]:
                    best[e[0]] = e
        assert want == [best[k] for k in sorted(best)]


class _FakeTable:
    """A sorted list standing in for a table's blocks(start) (the iterator is what is tested):
    one list per entry, so concat_tables chains several lists per table."""

    def __init__(self, entries):
        self.entries = entries

    def blocks(self, start=None):
        return iter([[e] for e in self.entries if start is None or e[0] >= start])


def test_concat_tables_starts_in_the_right_table():
    t1 = _FakeTable([(b"a", 1, 1, b""), (b"c", 1, 1, b"")])
    t2 = _FakeTable([(b"e", 1, 1, b""), (b"g", 1, 1, b"")])
    assert [e[0] for e in concat_tables([t1, t2], b"b")] == [b"c", b"e", b"g"]
    assert [e[0] for e in concat_tables([t2], b"f")] == [b"g"]


def test_batches_written_while_scanning_all_reach_the_sorted_index():
    """Regression: a batch writer must not append new keys to a pending list that a
    concurrent scan has just merged and replaced (the keys vanished from scans and flushes)."""
    m = MemTable()
    stop = threading.Event()
    written = []

    def writer():
        seq = 1
        i = 0
        while not stop.is_set() and i < 30000:
            ops = [(KIND_VALUE, b"%06d" % (i + j), b"v") for j in range(3)]
            seq = m.add(seq, ops) + 1
            written.extend(k for _, k, _ in ops)
            i += 3

    t = threading.Thread(target=writer)
    t.start()
    try:
        while t.is_alive():
            for _ in m.iterate(chunk=8):
                pass
    finally:
        stop.set()
        t.join()
    m.freeze()
    assert [e[0] for e in m.items()] == sorted(set(written))


def test_batched_merge_reads_a_source_running_ahead_only_when_the_others_catch_up():
    """merge_runs_batched holds at most about ``batch`` unemitted entries per source: a source
    whose range starts after another's ends (two levels after trivial moves), or whose batch
    spans the whole range (an L0 table beside a level), is not read again until the merge
    reaches its last key. Until session 14 every source was read each round, and a compaction
    of two such levels held one of them whole in memory."""
    batch = 64
    read = [0, 0, 0]
    emitted = []

    def counted(i, entries):
        for e in entries:
            read[i] += 1
            yield e

    low = [(b"a%06d" % n, 1, KIND_VALUE, b"") for n in range(5000)]
    high = [(b"b%06d" % n, 2, KIND_VALUE, b"") for n in range(5000)]
    sparse = [(b"%s%06d" % (p, n), 3, KIND_VALUE, b"") for p in (b"a", b"b") for n in range(0, 5000, 97)]
    for out in merge_runs_batched([counted(0, low), counted(1, high), counted(2, sparse)], batch):
        emitted.extend(out)
        frontier = out[-1][0]
        for i, src in enumerate((low, high, sparse)):
            ahead = read[i] - sum(1 for e in src if e[0] <= frontier)
            assert ahead <= batch, (i, frontier, read)
    assert emitted == sorted({e[0]: e for e in low + high + sparse}.values())
    assert read == [len(low), len(high), len(sparse)]
