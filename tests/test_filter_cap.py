"""The resident-filter cap: CLOCK eviction over real tables' filter partitions."""

import random

from engine import DB
from engine.filter_cap import FilterCap
from engine.format import KIND_VALUE
from engine.sstable import Table, TableBuilder, TableOptions
from engine.sstable.filter_reader import RESIDENT
from engine.vfs import FileSystem

PAGE = 4096


def build_table(path, keys):
    fs = FileSystem()
    w = fs.open_writable(str(path))
    b = TableBuilder(w, TableOptions(filter_policy="blocked-bloom", bits_per_key=10.0,
                                     partition_bytes=PAGE))
    for i, k in enumerate(keys):
        b.add(k, i + 1, KIND_VALUE, b"v")
    b.finish()
    w.sync()
    w.close()
    return fs


def _tables(tmp_path, cap, n_tables=3, n_keys=12000):
    tables, all_keys = [], []
    for t in range(n_tables):
        keys = sorted(b"t%d-%08d" % (t, i) for i in range(n_keys))
        fs = build_table(tmp_path / f"{t}.sst", keys)
        tables.append(Table.open(fs, str(tmp_path / f"{t}.sst"), file_number=t + 1, residency=cap))
        all_keys.append(keys)
    return tables, all_keys


def _partition_of(table, key):
    from bisect import bisect_left
    return bisect_left(table._filter.separators, key)


def test_cap_bounds_resident_partitions_and_answers_stay_right(tmp_path):
    cap = FilterCap(3 * PAGE)
    tables, all_keys = _tables(tmp_path, cap)
    assert all(t.filter_stats()["partitions"] >= 3 for t in tables)
    rnd = random.Random(1)
    for _ in range(400):
        t = rnd.randrange(len(tables))
        k = rnd.choice(all_keys[t])
        assert tables[t].may_match(k)  # present keys always match, evicted or not
        assert cap.resident_bytes <= 3 * PAGE
        measured = sum(x.filter_stats()["resident_bytes"] for x in tables)
        assert measured <= 3 * PAGE  # the OS agrees: released pages are gone
    rep = cap.report()
    assert rep["evictions"] > 0 and rep["faults"] > rep["evictions"]
    assert rep["tracked_resident_bytes"] <= 3 * PAGE
    for t in tables:
        cap.forget_table(t)
        t.close()
    assert cap.report()["tracked_resident_bytes"] == 0


def test_clock_keeps_a_hot_partition_and_evicts_cold_ones(tmp_path):
    cap = FilterCap(2 * PAGE)
    tables, all_keys = _tables(tmp_path, cap, n_tables=2)
    hot_table, hot_key = tables[0], all_keys[0][0]
    hot_p = _partition_of(hot_table, hot_key)
    # One key per cold partition: each cold partition is probed once (when it faults in),
    # the hot one between every two faults.
    cold, seen = [], {(0, hot_p)}
    for t in range(2):
        for k in all_keys[t][::100]:
            if (t, _partition_of(tables[t], k)) not in seen:
                seen.add((t, _partition_of(tables[t], k)))
                cold.append((t, k))
    cold = cold * 3  # several sweeps: released partitions fault in again
    assert hot_table.may_match(hot_key)
    faults_hot = 0
    for t, k in cold:
        assert hot_table.may_match(hot_key)
        assert tables[t].may_match(k)
        if hot_table._filter._state[hot_p] != RESIDENT:  # evicted: the next probe faults
            faults_hot += 1
    assert faults_hot == 0  # a partition probed between every fault always gets its second chance
    assert len(cold) >= 15
    assert cap.report()["evictions"] >= len(cold) - 2
    assert cap.report()["second_chances"] > 0
    for t in tables:
        t.close()


def test_uncapped_tracks_everything_without_evicting(tmp_path):
    cap = FilterCap(None)
    tables, all_keys = _tables(tmp_path, cap, n_tables=1)
    for k in all_keys[0][::100]:
        assert tables[0].may_match(k)
    n = tables[0].filter_stats()["partitions"]
    assert cap.report()["evictions"] == 0
    assert cap.resident_bytes == n * PAGE == tables[0].filter_stats()["resident_bytes"]
    tables[0].close()


def test_db_filter_memory_cap_in_report(tmp_path):
    cap = 2 * PAGE
    with DB.open(tmp_path / "db", filter_memory_cap=cap, memtable_bytes=64 * 1024) as db:
        for i in range(20000):
            db.put(b"%08d" % ((i * 7919) % 20000), b"v" * 8)
        db.compact()
        for i in range(0, 20000, 7):
            assert db.get(b"%08dx" % i) is None
            assert db.get(b"%08d" % i) == b"v" * 8
        rep = db.filter_report()
        c = rep["cap"]
        assert c["cap_bytes"] == cap
        assert c["evictions"] > 0
        assert c["tracked_resident_bytes"] <= cap
        assert c["measured_resident_bytes"] <= cap
        assert rep["totals"]["partitions"] > 2
