"""Adversarial review of the LSM engine (issue 3): compaction, write stalls, filter memory.

Tests marked ``xfail(strict=True)`` show a bug that is still open: each one fails today and
turns into an XPASS (a test failure) once the bug is fixed, so the marker must go with the fix.
The plain tests pin edge cases found correct that no other test covers.

Everything runs on real files in tmp_path. A few checks read engine internals (the current
version, a table's filter partition states) to build or observe a precise situation; nothing
of the engine is replaced.
"""

from __future__ import annotations

import functools
import random
import threading

import pytest

from engine import DB
from engine.compaction.picker import check_levels
from engine.errors import StorageIOError
from engine.filenames import FileKind, list_files
from engine.filter_budget import allocate, classic_fpr, expected_reads_per_miss
from engine.filter_plan import MIN_BITS_PER_KEY, bits_for_new_table, policy_fpr
from engine.options import Options
from engine.version_edit import FileMeta
from engine.vfs import FileSystem

PAGE = 4096
DEADLINE_S = 120.0  # liveness bound on a loaded 2-core machine, not a speed target
BLOCKED = functools.partial(policy_fpr, "blocked-bloom")


def _version(db):
    return db._version  # the current Version (immutable): read-only use


def _all_files(db):
    return [f for files in _version(db).levels for f in files]


# ---------------------------------------------------------------------------------------------
# stats(): data blocks read per get
# ---------------------------------------------------------------------------------------------
def test_data_blocks_read_per_get_counts_only_blocks_read_by_gets(tmp_path):
    opts = dict(table_workers=0, disable_auto_compactions=True, memtable_bytes=1 << 20,
                block_size=256)
    with DB.open(tmp_path / "db", **opts) as db:
        for i in range(3000):
            db.put(b"k%06d" % i, b"v" * 40)
        db.flush()
        assert db.get(b"k000123") == b"v" * 40  # one get in a one-table DB: one block at most
        assert sum(1 for _ in db.scan()) == 3000  # a scan is not a get
        st = db.stats()
        assert st["gets"] == 1
        assert st["data_blocks_read_per_get"] <= 1.0, st["data_blocks_read_per_get"]


# ---------------------------------------------------------------------------------------------
# filter_report(): the budget section
# ---------------------------------------------------------------------------------------------
def test_actual_expected_reads_per_miss_matches_measured_for_mixed_filters(tmp_path):
    """The actual figure averages the tables' FPRs (an unfiltered table counts 1), not the
    FPR of their average bits (it reported ~0.01 where ~0.5 was measured)."""
    path = tmp_path / "db"
    common = dict(table_workers=0, disable_auto_compactions=True, memtable_bytes=1 << 20)
    with DB.open(path, bits_per_key_per_level={1: 0}, **common) as db:
        for i in range(3000):
            db.put(b"a%06d" % i, b"v")
        db.compact()  # L1 table without a filter
    with DB.open(path, bits_per_key=20, **common) as db:
        for i in range(3000):
            db.put(b"b%06d" % i, b"v")
        db.compact()  # a disjoint key range: a second L1 table, with 20 bits/key
        rep = db.filter_report()
        (level,) = rep["levels"]
        assert sorted(t["bits_per_key"] for t in level["tables"]) == [0.0, 20.0]
        before = db.stats()["data_blocks_read"]
        n = 2000
        for i in range(n // 2):  # misses inside both tables' key ranges
            assert db.get(b"a%06dx" % i) is None
            assert db.get(b"b%06dx" % i) is None
        measured = (db.stats()["data_blocks_read"] - before) / n
        assert 0.45 < measured < 0.55  # every miss in the unfiltered half reads a block
        reported = rep["budget"]["expected_reads_per_miss_actual"]
        assert reported == pytest.approx(0.5 * 1.0 + 0.5 * BLOCKED(20.0), rel=0.05), reported


def test_report_uniform_baseline_of_a_uniform_10_bit_db_is_10_bits(tmp_path):
    """Without a budget, "same memory" is the bits the tables were built for, not their
    page-padded filter bytes (it compared a 10-bit DB with 10.9-bit uniform)."""
    with DB.open(tmp_path / "db", table_workers=0, memtable_bytes=1 << 20) as db:
        rnd = random.Random(3)
        for _ in range(30000):
            db.put(rnd.randbytes(16), b"v" * 100)
        db.compact()
        b = db.filter_report()["budget"]
        assert b["uniform_bits_per_key"] == pytest.approx(10.0, abs=0.05), b
        # The DB *is* uniform at 10 bits/key: its actual figure is the uniform one.
        assert b["expected_reads_per_miss_actual"] == pytest.approx(
            b["expected_reads_per_miss_uniform"], rel=0.01), b


def test_report_expected_reads_per_miss_counts_only_the_runs_a_miss_probes(tmp_path):
    """A get probes a level only where one of its tables holds the key. The report weighs each
    run's FPR by its estimated coverage, so with levels that cover part of the key range its
    expected figure is the sum over the tables that really cover each absent key (before: the
    sum over all runs, 1.25x that at the default bench shape)."""
    import time
    from bisect import bisect_left

    from engine.compaction import pick

    opts = dict(table_workers=0, memtable_bytes=256 << 10, target_file_size=64 << 10,
                max_bytes_for_level_base=256 << 10)
    with DB.open(tmp_path / "db", **opts) as db:
        rnd = random.Random(11)
        for _ in range(60_000):
            db.put(rnd.randbytes(16), b"v" * 40)
        db.flush()
        deadline = time.monotonic() + DEADLINE_S
        while (db.stats()["compaction_running"] is not None
               or pick(_version(db), db.options) is not None):
            assert time.monotonic() < deadline, "compactions did not settle"
            time.sleep(0.05)
        b = db.filter_report()["budget"]
        levels = _version(db).levels
        runs = [[f] for f in levels[0]] + [list(files) for files in levels[1:] if files]
        misses = [rnd.randbytes(17) for _ in range(20_000)]
        exact = 0.0
        for files in runs:
            largests = [f.largest for f in files]
            for k in misses:
                i = bisect_left(largests, k)
                if i < len(files) and files[i].smallest <= k:
                    exact += BLOCKED(files[i].filter_bits_per_key)
        exact /= len(misses)
        assert len(b["runs"]) >= 2
        assert b["expected_reads_per_miss_actual"] == pytest.approx(exact, rel=0.1), (b, exact)
        every_run = sum(r["actual_fpr"] for r in b["runs"])
        assert b["expected_reads_per_miss_actual"] <= every_run + 1e-12


# ---------------------------------------------------------------------------------------------
# Monkey allocation
# ---------------------------------------------------------------------------------------------
def _level_metas(entries_per_level):
    levels = [()]
    number = 10
    for n in entries_per_level:
        number += 1
        levels.append((FileMeta(number, n * 20, b"a", b"z", num_entries=n),))
    while len(levels) < 7:
        levels.append(())
    return tuple(levels)


def test_monkey_allocation_is_no_worse_than_a_feasible_alternative():
    """A run under MIN_BITS_PER_KEY gets no filter inside allocate() and the rest is solved
    again (its share used to be spent on a filter never built: 1.073 vs 1.002)."""
    budget = 20000
    opts = Options.from_kwargs(filter_memory_budget=budget)
    runs = [1000, 10000, 100000]
    levels = _level_metas(runs)
    # The bits the DB gives a table written now to each level (new_entries=0: same shape).
    built = [bits_for_new_table(opts, levels, n, 0) for n in (1, 2, 3)]
    assert built[2] == 0.0  # the big level gets no filter at all
    r_built = expected_reads_per_miss(runs, built, BLOCKED)
    # Feasible alternative: the same memory on the two small runs only.
    alt = allocate(runs[:2], budget).bits_per_key
    assert sum(b * n for b, n in zip(alt, runs)) <= budget * 8 + 1
    assert all(b >= MIN_BITS_PER_KEY for b in alt)
    r_alt = expected_reads_per_miss(runs, list(alt) + [0.0], BLOCKED)
    assert r_built <= r_alt + 1e-9, (built, r_built, alt, r_alt)


def test_monkey_allocation_uses_the_budget_and_beats_uniform_when_every_run_gets_a_filter():
    """The closed form is right where no run falls under MIN_BITS_PER_KEY: the bits add up to
    the budget, FPR is proportional to run size, and it beats uniform under the policy's FPR."""
    runs = [800, 1200, 9000, 90000]
    budget = 10 * sum(runs) // 8
    a = allocate(runs, budget)
    assert all(b >= MIN_BITS_PER_KEY for b in a.bits_per_key)
    assert sum(b * n for b, n in zip(a.bits_per_key, runs)) == pytest.approx(budget * 8, rel=1e-9)
    ratios = [classic_fpr(b) / n for b, n in zip(a.bits_per_key, runs)]
    assert max(ratios) == pytest.approx(min(ratios), rel=1e-6)
    r_opt = expected_reads_per_miss(runs, a.bits_per_key, BLOCKED)
    r_uni = expected_reads_per_miss(runs, [budget * 8 / sum(runs)] * len(runs), BLOCKED)
    assert r_opt < r_uni


# ---------------------------------------------------------------------------------------------
# filter_memory_budget: the memory the DB ends up with
# ---------------------------------------------------------------------------------------------
def test_filter_memory_budget_reports_page_padding_it_cannot_avoid(tmp_path):
    """The budget plans bits; filters are whole 4 KiB pages, so 19 tables of ~1,000 keys hold a
    page each (3.1x this 25,000-byte budget in bytes) though their bits are on budget. The
    report must say so rather than claim the budget holds."""
    n = 20000
    budget = n * 10 // 8
    # compression off: the table count this needs assumes the values' raw size (b"v" * 20
    # compresses, and LZ4 by default would make fewer, smaller tables).
    with DB.open(tmp_path / "db", filter_memory_budget=budget, disable_auto_compactions=True,
                 table_workers=0, memtable_bytes=4 << 20, target_file_size=64 << 10,
                 compression="none") as db:
        rnd = random.Random(3)
        for _ in range(n):
            db.put(b"%016d" % rnd.randrange(10 ** 15), b"v" * 20)
        db.compact()  # one level, one run: the whole budget is that run's
        rep = db.filter_report()
        tot = rep["totals"]
        assert tot["tables"] > 10
        bits = sum(t["bits_per_key"] * t["keys"] for lv in rep["levels"] for t in lv["tables"])
        assert bits / 8 == pytest.approx(budget, rel=0.01)
        assert tot["filter_bytes"] > budget
        assert rep["budget"]["filter_bytes"] == tot["filter_bytes"]
        assert rep["budget"]["within_budget"] is False


def test_filter_memory_budget_plans_early_tables_for_the_full_db(tmp_path):
    """8 flushes of 3,000 keys under a budget covering 24,000 keys at 10 bits: a table
    written while the DB is small is planned as one run of the full DB, so it does not take
    most of the budget (before: the first flush got 40 bits per key and the eight held 2.2x
    the budget in bits; now 1.14x, every table with a filter)."""
    n = 8 * 3000
    budget = n * 10 // 8
    with DB.open(tmp_path / "db", filter_memory_budget=budget, disable_auto_compactions=True,
                 table_workers=0, memtable_bytes=1 << 20) as db:
        rnd = random.Random(4)
        for _ in range(8):
            for _ in range(n // 8):
                db.put(b"%016d" % rnd.randrange(10 ** 15), b"v" * 20)
            db.flush()
        rep = db.filter_report()
        assert rep["totals"]["tables"] == 8
        per_table = [t["bits_per_key"] for lv in rep["levels"] for t in lv["tables"]]
        assert all(8 <= b <= 16 for b in per_table), per_table
        bits = sum(t["bits_per_key"] * t["keys"] for lv in rep["levels"] for t in lv["tables"])
        assert bits / 8 <= 1.2 * budget, (bits / 8, budget)


# ---------------------------------------------------------------------------------------------
# compaction output size
# ---------------------------------------------------------------------------------------------
def test_compaction_outputs_stay_near_target_file_size_with_large_values(tmp_path):
    target = 256 * 1024
    value = 32 * 1024
    # compression off: target_file_size counts stored bytes, and these values compress to
    # almost nothing under the default LZ4 (one output table); the test is about raw sizes.
    with DB.open(tmp_path / "db", table_workers=0, memtable_bytes=8 << 20,
                 target_file_size=target, disable_auto_compactions=True,
                 compression="none") as db:
        for i in range(120):
            db.put(b"k%06d" % i, b"v" * value)
        db.compact()
        sizes = [f.size for f in _version(db).levels[1]]
        assert len(sizes) > 1
        # One entry past the target is the most a size check per entry allows.
        assert max(sizes) <= target + 2 * value, sizes


# ---------------------------------------------------------------------------------------------
# correct today: pinned
# ---------------------------------------------------------------------------------------------
def test_compaction_failure_releases_a_writer_stopped_at_the_l0_stop_trigger(tmp_path):
    """A compaction that fails (a corrupt input block) while L0 is past the stop trigger must
    fail the stopped writer with a clear error, not leave it waiting for ever."""
    path = tmp_path / "db"
    with DB.open(path, disable_auto_compactions=True, memtable_bytes=64 << 10) as db:
        for r in range(8):
            for i in range(60):
                db.put(b"r%d-%04d" % (r, i), b"x" * 40)
            db.flush()
        assert len(_version(db).levels[0]) == 8
        victim = _version(db).levels[0][-1].number
    fs = FileSystem()
    (table,) = [name for kind, number, name in list_files(fs, str(path))
                if kind is FileKind.TABLE and number == victim]
    with open(path / table, "r+b") as f:  # the first data block starts at offset 0
        f.seek(20)
        b = f.read(1)
        f.seek(20)
        f.write(bytes([b[0] ^ 0xFF]))
    stall = dict(memtable_bytes=1024, max_frozen_memtables=1, l0_compaction_trigger=2,
                 l0_slowdown_trigger=3, l0_stop_trigger=4)
    with DB.open(path, **stall) as db:
        outcome: list = []
        done = threading.Event()

        def writer():
            try:
                for i in range(2000):  # many memtables' worth: it must stop or fail
                    db.put(b"w%05d" % i, b"y" * 40)
                outcome.append("finished")
            except BaseException as exc:  # noqa: BLE001 - asserted below
                outcome.append(exc)
            finally:
                done.set()

        t = threading.Thread(target=writer, daemon=True)
        t.start()
        assert done.wait(DEADLINE_S), f"writer hangs: {db.stats()['write_stall']}"
        (result,) = outcome
        assert isinstance(result, StorageIOError), result
        assert "refuses writes" in str(result)
        st = db.stats()
        assert st["failed"] is not None and st["background_errors"] == 1
        assert db.get(b"r3-0005") == b"x" * 40  # reads of intact tables go on


def test_filter_cap_with_concurrent_readers_and_compactions_has_no_false_negatives(tmp_path):
    """Past a two-page cap, partitions are released and faulted back in while compactions
    close and open tables under the readers: a present key is always found, and afterwards a
    key whose partition was released (state VERIFIED) is found and its partition is resident
    again."""
    from engine.sstable.filter_reader import RESIDENT, VERIFIED

    cap = 2 * PAGE
    opts = dict(memtable_bytes=64 << 10, target_file_size=64 << 10,
                max_bytes_for_level_base=256 << 10, l0_compaction_trigger=2,
                filter_memory_cap=cap)
    keys = [b"k%07d" % i for i in range(30000)]
    with DB.open(tmp_path / "db", **opts) as db:
        for k in keys[:15000]:
            db.put(k, k)
        db.flush()
        errors: list = []
        stop = threading.Event()

        def reader(seed):
            rnd = random.Random(seed)
            try:
                while not stop.is_set():
                    k = keys[rnd.randrange(15000)]
                    got = db.get(k)
                    if got != k:
                        errors.append((k, got))
                        return
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=reader, args=(s,)) for s in range(3)]
        for t in threads:
            t.start()
        try:
            for k in keys[15000:]:
                db.put(k, k)
            db.compact()
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert not errors, errors[:3]
        rep = db.filter_report()["cap"]
        assert rep["evictions"] > 0
        assert rep["tracked_resident_bytes"] <= cap
        assert rep["measured_resident_bytes"] <= cap
        # A present key whose partition was released: found, and resident again.
        for t in db._rs.tables_by_level()[-1][1]:
            f = t._filter
            released = [p for p in range(f.num_partitions) if f._state[p] == VERIFIED]
            if released:
                p = released[0]
                lo = f.separators[p - 1] if p else b""
                probe = next(k for k in keys if lo < k <= f.separators[p] and t.smallest <= k)
                assert db.get(probe) == probe
                assert f._state[p] == RESIDENT
                break
        else:
            pytest.fail("no released partition to probe")


def test_filter_report_ratios_follow_the_issue_formulas_at_every_level(tmp_path):
    """observed FPR = (positives - TP) / (negatives + positives - TP), false ratio =
    FP / (FP + TP), per table; level and DB totals are the sums of their tables."""
    # Tables big enough that their filter partitions are full at 4 bits/key (a small table's
    # filter fills a whole page, far more bits per key, and never errs).
    with DB.open(tmp_path / "db", table_workers=0, memtable_bytes=4 << 20,
                 disable_auto_compactions=True, bits_per_key=4) as db:
        for i in range(30000):
            db.put(b"%06d" % i, b"v")
            if i % 10000 == 9999:
                db.flush()
        rnd = random.Random(2)
        for _ in range(3000):
            i = rnd.randrange(30000)
            db.get(b"%06d" % i)
            db.get(b"%06dx" % i)
        rep = db.filter_report()
        rows = [t for lv in rep["levels"] for t in lv["tables"]]
        assert sum(r["false_positives"] for r in rows) > 0  # 4 bits/key: some FPs to check
        for r in rows:
            pos, neg, tp = r["positives"], r["negatives"], r["true_positives"]
            fp = pos - tp
            assert r["false_positives"] == fp >= 0
            assert r["observed_fpr"] == pytest.approx(fp / (neg + pos - tp))
            assert r["false_ratio"] == pytest.approx(fp / (fp + tp))
        for lv in rep["levels"]:
            for k in ("positives", "negatives", "true_positives", "false_positives", "keys"):
                assert lv["totals"][k] == sum(t[k] for t in lv["tables"])
        tot = rep["totals"]
        for k in ("positives", "negatives", "true_positives", "false_positives", "keys"):
            assert tot[k] == sum(lv["totals"][k] for lv in rep["levels"])
        fp = tot["false_positives"]
        assert tot["observed_fpr"] == pytest.approx(fp / (tot["negatives"] + fp))
        assert tot["false_ratio"] == pytest.approx(fp / (fp + tot["true_positives"]))


def _check_db(db, model):
    """Every model key reads right (get, multi_get, full scan); L1+ never overlap; the
    sequence counter is past every table's sequence numbers."""
    version = _version(db)
    check_levels(version)
    files = [f for fs in version.levels for f in fs]
    if files:
        assert db.stats()["last_sequence"] >= max(f.largest_seq for f in files)
    ks = sorted(model)
    assert db.multi_get(ks) == [model[k] for k in ks]
    assert list(db.scan()) == sorted((k, v) for k, v in model.items() if v is not None)


def test_newest_wins_across_memtables_l0_and_levels_through_reopens(tmp_path):
    """Seeded random overwrites and deletes of a small key set spread over the memtable, L0
    and several levels, with flushes, manual compactions, background compactions and reopens
    in random orders; checked against a dict after every phase. After a manual compaction no
    tombstone is left and one level holds everything."""
    opts = dict(memtable_bytes=2048, target_file_size=1024, max_bytes_for_level_base=4096,
                level_size_multiplier=2.0, block_size=256, l0_compaction_trigger=2,
                l0_slowdown_trigger=3, l0_stop_trigger=5, slowdown_sleep_s=0.0,
                table_workers=0)
    rnd = random.Random(11)
    path = tmp_path / "db"
    model: dict = {}
    db = DB.open(path, **opts)
    try:
        for phase in range(40):
            for i in range(rnd.randrange(20, 120)):
                k = b"k%03d" % rnd.randrange(150)
                r = rnd.random()
                if r < 0.3:
                    db.delete(k)
                    model[k] = None
                elif r < 0.4:
                    k2 = b"k%03d" % rnd.randrange(150)
                    db.write([(k, b"b%d-%d" % (phase, i)), (k2, None), (k, b"c%d-%d" % (phase, i))])
                    model[k2] = None
                    model[k] = b"c%d-%d" % (phase, i)
                else:
                    model[k] = b"v%d-%d-" % (phase, i) + b"p" * rnd.randrange(30)
                    db.put(k, model[k])
            step = rnd.choice(["none", "flush", "compact", "reopen", "reopen"])
            if step == "flush":
                db.flush()
            elif step == "compact":
                db.compact()
                st = db.stats()
                levels = [lv for lv in st["levels"] if lv["tables"]]
                assert len(levels) <= 1 and all(lv["tombstones"] == 0 for lv in levels), levels
            elif step == "reopen":
                db.close()
                db = DB.open(path, **opts)
            _check_db(db, model)
            assert db.stats()["failed"] is None
        assert sum(1 for lv in db.stats()["levels"][1:] if lv["tables"]) >= 1
    finally:
        db.close()
    with DB.open(path, **opts) as db:
        _check_db(db, model)


def test_scans_during_background_compactions_see_each_key_once_with_a_value_it_held(tmp_path):
    """One writer overwrites a fixed key set with globally increasing versions while flushes
    and compactions (in worker processes) install new versions; every full scan returns every
    key exactly once, with a version no older than the one acknowledged before the scan began
    and no newer than the last one issued before it ended."""
    opts = dict(memtable_bytes=4096, target_file_size=2048, max_bytes_for_level_base=8192,
                block_size=256, l0_compaction_trigger=2)
    nkeys = 300
    keys = [b"s%04d" % i for i in range(nkeys)]
    with DB.open(tmp_path / "db", **opts) as db:
        acked = {}
        for k in keys:
            db.put(k, b"0")
            acked[k] = 0
        issued = [0]
        stop = threading.Event()
        errors: list = []

        def writer():
            rnd = random.Random(5)
            try:
                while not stop.is_set():
                    k = keys[rnd.randrange(nkeys)]
                    issued[0] += 1
                    v = issued[0]
                    db.put(k, b"%d" % v + b"." * rnd.randrange(40))
                    acked[k] = v
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        t = threading.Thread(target=writer)
        t.start()
        scans = 0
        try:
            while scans < 25 or db.stats()["compactions"] < 3:
                before = dict(acked)
                got = list(db.scan())
                after = issued[0]
                assert [k for k, _ in got] == keys
                for k, v in got:
                    ver = int(v.split(b".", 1)[0])
                    assert before[k] <= ver <= after, (k, before[k], ver, after)
                scans += 1
                assert scans < 5000, "no compaction ran"
        finally:
            stop.set()
            t.join()
        assert not errors, errors[:3]
        assert db.stats()["failed"] is None
