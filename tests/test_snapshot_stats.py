"""``stats()["snapshots"]`` (engine/reports.py): what open snapshots and older reads hold.

A snapshot left open keeps the tables of its moment on disk and the records later writes
replace in memory; a scan holds the same while it is read. Operators need to see that
(RocksDB reports num-snapshots and oldest-snapshot-time): open snapshots and the oldest's age,
the memtable's holds and kept records, and the tables compacted away that are still held, with
their bytes. Also the cluster total (the oldest age is the largest, not a sum), the shard
metrics, and the CLI's line.
"""

import time

from engine import DB
from router.cli.report_cmds import held_by_reads
from shard.engine_metrics import EngineCollector
from shard.metrics import flatten_numbers, sum_totals

from .conftest import wait_until

NONE_HELD = {"open": 0, "oldest_age_seconds": None, "memtable_holds": 0, "kept_records": 0,
             "held_tables": 0, "held_table_bytes": 0}


def _snaps(db):
    return db.stats()["snapshots"]


def test_nothing_held_without_snapshots_or_scans(tmp_path):
    with DB.open(str(tmp_path / "db")) as db:
        db.put(b"a", b"1")
        db.get(b"a")
        db.multi_get([b"a", b"b"])  # one-moment reads that hold nothing afterwards
        assert list(db.scan()) == [(b"a", b"1")]
        assert _snaps(db) == NONE_HELD


def test_a_snapshot_counts_its_kept_records_and_its_age_until_closed(tmp_path):
    with DB.open(str(tmp_path / "db")) as db:
        for i in range(10):
            db.put(b"k%d" % i, b"old")
        snap = db.snapshot()
        for i in range(4):
            db.put(b"k%d" % i, b"new")  # replaced: kept for the snapshot
        db.put(b"fresh", b"x")  # a new key replaces nothing
        time.sleep(0.05)
        s = _snaps(db)
        assert (s["open"], s["memtable_holds"], s["kept_records"]) == (1, 1, 4)
        assert s["oldest_age_seconds"] >= 0.05
        second = db.snapshot()
        s2 = _snaps(db)
        assert s2["open"] == 2 and s2["oldest_age_seconds"] >= s["oldest_age_seconds"]
        snap.close()
        second.close()
        assert _snaps(db) == NONE_HELD


def test_a_dropped_snapshot_is_no_longer_counted(tmp_path):
    with DB.open(str(tmp_path / "db")) as db:
        db.put(b"a", b"1")
        snap = db.snapshot()
        assert _snaps(db)["open"] == 1
        del snap  # freed without close(): its finalizer closes it
        assert _snaps(db)["open"] == 0 and _snaps(db)["memtable_holds"] == 0


def test_an_unfinished_scan_holds_the_memtable(tmp_path):
    with DB.open(str(tmp_path / "db")) as db:
        for i in range(50):
            db.put(b"k%02d" % i, b"v")
        it = db.scan()
        next(it)
        db.put(b"k00", b"w")
        s = _snaps(db)
        assert (s["open"], s["memtable_holds"], s["kept_records"]) == (0, 1, 1)
        assert len(list(it)) == 49
        assert _snaps(db) == NONE_HELD


def test_tables_compacted_away_under_a_snapshot_are_counted_until_it_closes(tmp_path):
    with DB.open(str(tmp_path / "db")) as db:
        for i in range(200):
            db.put(b"k%04d" % i, b"v" * 100)
        db.flush()
        (first_table,) = db._rs.numbers
        snap = db.snapshot()
        for i in range(200):
            db.put(b"k%04d" % i, b"w" * 100)
        db.flush()
        db.compact()  # replaces both tables; the snapshot still reads the first
        # The second table is held only by read states that are being released (by the table
        # set's own thread): soon only the snapshot's table is left.
        wait_until(lambda: _snaps(db)["held_tables"] == 1, "only the snapshot's table held",
                   timeout=30)
        s = _snaps(db)
        held = db._tables.held_obsolete()
        assert held[0].file_number == first_table
        assert s["held_table_bytes"] == held[0].file_size > 0, s
        assert snap.get(b"k0001") == b"v" * 100
        assert "compacted away still held by older reads" in held_by_reads(db.stats())
        snap.close()
        # Released by the table set's own thread (engine/table_set.py), soon after.
        wait_until(lambda: _snaps(db)["held_tables"] == 0, "the held tables to be released",
                   timeout=30)
        assert _snaps(db) == NONE_HELD and held_by_reads(db.stats()) == ""


def test_cluster_totals_take_the_oldest_age_and_sum_the_rest():
    shard_a = {"snapshots": dict(NONE_HELD, open=1, oldest_age_seconds=30.0, held_tables=2,
                                 held_table_bytes=100)}
    shard_b = {"snapshots": dict(NONE_HELD, open=2, oldest_age_seconds=5.0, held_tables=1,
                                 held_table_bytes=50)}
    shard_c = {"snapshots": dict(NONE_HELD)}  # no snapshot: no age to report
    t = sum_totals([flatten_numbers(x) for x in (shard_a, shard_b, shard_c)])
    assert t["snapshots.oldest_age_seconds"] == 30.0
    assert t["snapshots.open"] == 3 and t["snapshots.held_tables"] == 3
    assert t["snapshots.held_table_bytes"] == 150


def test_shard_metrics_report_the_snapshots(tmp_path):
    with DB.open(str(tmp_path / "db")) as db:
        db.put(b"a", b"1")
        names = {f.name for f in EngineCollector(db).collect()}
        assert "sievekv_engine_oldest_snapshot_age_seconds" not in names  # none open
        with db.snapshot():
            got = {f.name: f.samples[0].value for f in EngineCollector(db).collect()
                   if f.samples}
        assert got["sievekv_engine_snapshots_open"] == 1
        assert got["sievekv_engine_oldest_snapshot_age_seconds"] >= 0
        assert got["sievekv_engine_memtable_holds"] == 1
        assert got["sievekv_engine_held_table_bytes"] == 0


def test_the_cli_line_names_tables_bytes_and_the_oldest_snapshot():
    s = {"snapshots": dict(NONE_HELD, open=1, oldest_age_seconds=3725.2, held_tables=2,
                           held_table_bytes=64 << 20)}
    line = held_by_reads(s)
    assert line.startswith("2 tables (64.0 MiB) compacted away still held by older reads")
    assert "the oldest snapshot open 1h" in line
    assert held_by_reads({"snapshots": dict(NONE_HELD, held_tables=1, held_table_bytes=10)}) \
        == "1 table (10 B) compacted away still held by older reads (scans, snapshots)"
    assert held_by_reads({}) == "" and held_by_reads({"snapshots": NONE_HELD}) == ""
