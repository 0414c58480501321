"""Lazy mapping of the filter region, checked from the OS side (/proc/self/smaps, /proc/self/maps).

Opening a table reads only its metadata and maps nothing; a probe makes (about) one partition
resident; release_partition and close give the memory back. Tables here are freshly written,
so their pages are in the page cache: the worst case for Linux fault-around.
"""

import random
from bisect import bisect_left

import pytest

from engine.filter_cap import FilterCap
from engine.format import FILTER_PAGE_SIZE, KIND_VALUE
from engine.sstable import Table, TableBuilder, TableOptions
from engine.sstable.residency import resident_bytes
from engine.vfs import FileSystem

PAGE = FILTER_PAGE_SIZE


def mapped_ranges(path):
    with open("/proc/self/maps") as f:
        return [line for line in f if line.rstrip().endswith(path)]


@pytest.fixture(scope="module")
def table_file(tmp_path_factory):
    """A table with one-page partitions, one per data block, and its keys."""
    path = str(tmp_path_factory.mktemp("lazy") / "t.sst")
    rng = random.Random(11)
    keys = sorted({rng.randbytes(16) for _ in range(4000)})
    fs = FileSystem()
    w = fs.open_writable(path)
    b = TableBuilder(w, TableOptions(block_size=1024, blocks_per_partition=1))
    for i, k in enumerate(keys):
        b.add(k, i, KIND_VALUE, rng.randbytes(60))
    props = b.finish()
    w.sync()
    w.close()
    assert props.num_filter_partitions > 100
    assert props.filter_bytes == props.num_filter_partitions * PAGE
    return path, keys, props


class Recorder:
    """A residency hook that records what tables report."""

    def __init__(self):
        self.faults = []

    def on_fault(self, table, p, nbytes):
        self.faults.append((table, p, nbytes))


def rss(t):
    return resident_bytes([t.residency_key])[t.residency_key] if t.residency_key else 0


def test_open_reads_only_metadata_and_maps_nothing(table_file):
    path, keys, props = table_file
    fs = FileSystem()
    t = Table.open(fs, path)
    try:
        meta = t.file_size - props.data_bytes - props.filter_bytes - \
            (-props.data_bytes % PAGE)
        assert fs.counters.read_calls == 2
        assert fs.counters.bytes_read == meta  # the tail + footer, nothing else
        assert meta < 0.1 * t.file_size
        assert fs.counters.maps == 0 and mapped_ranges(path) == []
        assert resident_bytes([path])[path] == 0
        s = t.filter_stats()
        assert (s["mapped_bytes"], s["resident_bytes"], s["partitions_touched"]) == (0, 0, 0)
    finally:
        t.close()


def test_each_probe_makes_one_partition_resident(table_file):
    path, keys, props = table_file
    fs = FileSystem()
    rec = Recorder()
    t = Table.open(fs, path, residency=rec)
    f = t._filter
    read_at_open = fs.counters.bytes_read
    try:
        rng = random.Random(3)
        touched = set()
        for n in range(1, 41):
            k = rng.randbytes(16)
            p = bisect_left(f.separators, k)
            t.may_match(k)
            touched.add(p)
            assert fs.counters.maps == 1
            # Exactly the touched partitions' pages are resident, despite fault-around.
            assert rss(t) == len(touched) * PAGE, n
            assert t.filter_stats()["resident_bytes"] == rss(t)  # pagemap == smaps
            assert t.filter_ref[p] == 1
        assert sorted(p for _, p, _ in rec.faults) == sorted(touched)
        assert all(tab is t and nbytes == PAGE for tab, _, nbytes in rec.faults)
        s = t.filter_stats()
        assert s["mapped_bytes"] == props.filter_bytes
        assert s["partitions_touched"] == s["partitions_resident"] == len(touched)
        assert s["resident_bytes"] == len(touched) * PAGE
        assert s["probes"] == 40
        assert fs.counters.bytes_read == read_at_open  # probes read through the mapping only
    finally:
        t.close()


def test_filter_negative_reads_no_data_block(table_file):
    path, keys, props = table_file
    fs = FileSystem()
    t = Table.open(fs, path)
    try:
        before = fs.counters.snapshot()
        rng = random.Random(5)
        negatives = 0
        for _ in range(300):
            k = rng.randbytes(16)
            if not t.may_match(k):
                negatives += 1
                assert t.get(k) is None
        assert negatives > 250
        after = fs.counters.snapshot()
        assert (after["read_calls"], after["bytes_read"]) == (before["read_calls"],
                                                              before["bytes_read"])
        assert t.data_blocks_read == 0
        assert t.get(keys[7]) is not None and t.data_blocks_read == 1
    finally:
        t.close()


def test_release_partition_drops_exactly_its_pages_and_faults_again(table_file):
    path, keys, props = table_file
    rec = Recorder()
    t = Table.open(FileSystem(), path, residency=rec)
    f = t._filter
    try:
        a, b = keys[100], keys[2000]
        pa, pb = bisect_left(f.separators, a), bisect_left(f.separators, b)
        assert t.get(a) and t.get(b)
        assert rss(t) == 2 * PAGE
        assert t.release_partition(pa) == PAGE
        assert t.release_partition(pa) == 0  # not resident any more
        assert rss(t) == PAGE
        assert t.filter_stats()["partitions_resident"] == 1
        assert t.get(a)  # faults back in, tells the hook again
        assert rss(t) == 2 * PAGE
        assert [p for _, p, _ in rec.faults] == [pa, pb, pa]
    finally:
        t.close()


def test_filter_cap_keeps_resident_memory_under_its_cap(table_file):
    path, keys, props = table_file
    cap = FilterCap(3 * PAGE)
    t = Table.open(FileSystem(), path, residency=cap)
    try:
        for k in keys[::37]:
            assert t.get(k) is not None
            assert rss(t) <= 3 * PAGE
        assert cap.report()["evictions"] > 10
        assert rss(t) == cap.report()["tracked_resident_bytes"]
    finally:
        cap.forget_table(t)
        t.close()


def test_close_unmaps_and_one_smaps_pass_reports_many_tables(table_file):
    path, keys, props = table_file
    t1 = Table.open(FileSystem(), path)
    t2 = Table.open(FileSystem(), path)
    t1.get(keys[0])
    t2.get(keys[0])
    t2.get(keys[-1])
    assert len(mapped_ranges(path)) == 2
    both = resident_bytes([t1.residency_key, t2.residency_key, path])
    assert (both[t1.residency_key], both[t2.residency_key], both[path]) == (PAGE, 2 * PAGE,
                                                                           3 * PAGE)
    assert t1.filter_stats()["resident_bytes"] == PAGE  # pagemap agrees with smaps
    assert t2.filter_stats()["resident_bytes"] == 2 * PAGE
    t1.close()
    t2.close()
    assert mapped_ranges(path) == [] and resident_bytes([path])[path] == 0


def test_concurrent_probes_and_releases_never_give_wrong_answers(table_file):
    import threading

    path, keys, props = table_file
    cap = FilterCap(2 * PAGE)  # forces constant releases under the readers' feet
    t = Table.open(FileSystem(), path, residency=cap)
    present = set(keys)
    failures = []

    def reader(seed):
        rng = random.Random(seed)
        try:
            for _ in range(1500):
                if rng.random() < 0.5:
                    k = rng.choice(keys)
                    if t.get(k) is None:
                        failures.append(("missing", k))
                else:
                    k = rng.randbytes(16)
                    if k not in present and t.get(k) is not None:
                        failures.append(("phantom", k))
        except Exception as exc:  # pragma: no cover - reported below
            failures.append(("exception", repr(exc)))

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    try:
        assert failures == []
        assert cap.report()["evictions"] > 100
    finally:
        cap.forget_table(t)
        t.close()
