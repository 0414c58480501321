"""The filter budget planner (engine/filter_plan.py): page-rounded bytes, what other tables
hold, and the filter bytes a DB ends up with. The planner is pure; the DB tests use real files."""

import random

import pytest

from engine import DB
from engine.filter_plan import FilterPlan, plan_new_table
from engine.filters import get_policy
from engine.format import KIND_VALUE
from engine.options import Options
from engine.sstable import TableBuilder, TableOptions
from engine.sstable.filter_builder import predicted_region_bytes
from engine.version_edit import FileMeta
from engine.vfs import FileSystem

PAGE = 4096


def test_predicted_region_bytes_matches_the_builder(tmp_path):
    fs = FileSystem()
    rnd = random.Random(1)
    for trial in range(12):
        n = rnd.choice([5, 300, 3000, 9000])
        vlen = rnd.choice([1, 20, 200])
        bits = rnd.choice([1.0, 4.5, 10.0, 23.0, 40.0])
        keys = sorted({b"%016d" % rnd.randrange(10 ** 15) for _ in range(n)})
        path = str(tmp_path / f"{trial}.sst")
        w = fs.open_writable(path)
        b = TableBuilder(w, TableOptions(filter_policy="blocked-bloom", bits_per_key=bits))
        for i, k in enumerate(keys):
            b.add(k, i + 1, KIND_VALUE, b"v" * vlen)
        props = b.finish()
        w.close()
        per_block = int(4096 // (props.data_bytes / len(keys))) + 1
        policy = get_policy("blocked-bloom", bits)
        assert predicted_region_bytes(policy, len(keys), per_block, PAGE) == props.filter_bytes
        # The planner's slack only ever predicts more.
        assert predicted_region_bytes(policy, len(keys), per_block, PAGE, 1) >= props.filter_bytes
    assert predicted_region_bytes(get_policy("blocked-bloom", 10), 0, 10, PAGE) == 0


def _levels(*levels):
    out = [tuple(files) for files in levels]
    while len(out) < 7:
        out.append(())
    return tuple(out)


def _meta(number, entries, filter_bytes=0, bits=0.0, entry_bytes=40):
    return FileMeta(number, entries * entry_bytes + filter_bytes, b"a", b"z", num_entries=entries,
                    filter_bytes=filter_bytes, filter_bits_per_key=bits)


def test_a_flush_gets_only_what_the_other_tables_leave():
    opts = Options.from_kwargs(filter_memory_budget=10 * PAGE)
    empty = _levels(())
    p = plan_new_table(opts, empty, 0, 3000)
    assert p.bits_per_key == p.run_bits_per_key > 0 and p.limited is None
    assert p.predicted_bytes <= 10 * PAGE
    held = _levels((_meta(1, 3000, 8 * PAGE, 20.0),))
    q = plan_new_table(opts, held, 0, 3000)
    assert q.available_bytes == 2 * PAGE
    assert q.predicted_bytes <= 2 * PAGE and 0 < q.bits_per_key < q.run_bits_per_key
    assert q.limited == "fewer-bits"
    full = _levels((_meta(1, 3000, 10 * PAGE - 100, 20.0),))
    r = plan_new_table(opts, full, 0, 3000)
    assert r == FilterPlan(0.0, r.run_bits_per_key, 100, 0, "no-filter")


def test_a_compaction_does_not_count_its_inputs_but_keeps_pages_for_l0():
    opts = Options.from_kwargs(filter_memory_budget=40 * PAGE, target_file_size=1 << 20)
    l0 = [_meta(n, 3000, 4 * PAGE, 20.0) for n in (1, 2, 3, 4)]
    levels = _levels(l0, [_meta(5, 30000, 12 * PAGE, 10.0)])
    removed = {f.number: f.num_entries for f in l0 + [levels[1][0]]}
    p = plan_new_table(opts, levels, 1, 42000, removed)
    # The inputs' 28 pages are free, but four L0 tables' worth is kept for flushes to come.
    assert 28 * PAGE < p.available_bytes + 4 * PAGE * 4 and p.available_bytes < 40 * PAGE
    assert p.predicted_bytes <= p.available_bytes and p.bits_per_key > 0


def test_outputs_too_small_for_a_page_each_get_no_filter():
    opts = Options.from_kwargs(filter_memory_budget=6 * PAGE, target_file_size=64 << 10)
    inputs = [_meta(n, 1000, 0, 0.0) for n in range(1, 21)]
    levels = _levels(inputs)
    removed = {f.number: f.num_entries for f in inputs}
    p = plan_new_table(opts, levels, 1, 20000, removed)
    assert p.bits_per_key == 0.0 and p.limited == "no-filter"


def test_the_db_stays_within_its_budget_and_the_report_says_what_went_without(tmp_path):
    n = 24000
    budget = n * 10 // 8
    with DB.open(tmp_path / "db", filter_memory_budget=budget, disable_auto_compactions=True,
                 table_workers=0, memtable_bytes=1 << 20) as db:
        rnd = random.Random(4)
        for _ in range(8):
            for _ in range(n // 8):
                db.put(b"%016d" % rnd.randrange(10 ** 15), b"v" * 20)
            db.flush()
            b = db.filter_report()["budget"]
            assert b["filter_bytes"] <= budget and b["within_budget"]
        rep = db.filter_report()
        b = rep["budget"]
        assert rep["totals"]["filter_bytes"] == b["filter_bytes"] <= budget
        without = sum(r["tables_without_filter"] for r in b["runs"])
        assert without == sum(1 for lv in rep["levels"] for t in lv["tables"] if t["policy"] is None)
        assert without > 0  # 8 tables of one page or more do not fit 30,000 bytes
        # Each unfiltered run counts 1 wasted read per miss.
        assert b["expected_reads_per_miss_actual"] >= without
        for k in range(0, n, 97):
            assert db.get(b"%016dx" % k) is None
        db.compact()  # one run: the pages of the L0 tables are free again
        b = db.filter_report()["budget"]
        assert b["within_budget"] and b["filter_bytes"] > 0
        (run,) = b["runs"]
        assert run["tables_without_filter"] == 0
        # Pages stay kept for the L0 tables to come, so the run has fewer bits than if it
        # were the only run for ever, but a filter: far fewer wasted reads than 8 runs had.
        assert 0 < run["actual_bits_per_key"] < run["optimal_bits_per_key"]
        assert b["expected_reads_per_miss_actual"] < 0.25
