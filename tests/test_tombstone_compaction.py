"""Tombstone compactions on a real DB (engine/compaction/picker.py, "Tombstones";
``tombstone_compaction_ratio``): deleted data gives its disk space back without DB.compact(),
after the flush that wrote the tombstones and after a reopen, tombstones left at the bottom
by trivial moves are rewritten away in place (an L6 -> L6 compaction that recovery replays),
deletes of absent keys settle, and no data is lost (a stateful model test with heavy deletes).

Background work is awaited with DB.wait_for_compactions (a condition with a deadline, not a
sleep). These tests are about the rule itself and open with ``tombstone_compaction_delay=0``
(no idle time: the behaviour before the delay existed); tests/test_tombstone_delay.py covers
the delay.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

from engine import DB
from engine.compaction.picker import is_bottommost
from engine.filenames import table_file_name

from .test_compaction_progress import PausingFS
from .test_model import DBModel

WAIT_S = 120.0  # liveness bound on a loaded 2-core machine


def _table_bytes(db) -> int:
    return sum(os.path.getsize(table_file_name(db.path, f.number))
               for _, f in db._version.all_files())


def _tombstones(db) -> int:
    return sum(lv["tombstones"] for lv in db.stats()["levels"])


def _fill(db, n: int, model: dict) -> None:
    rnd = random.Random(n)
    for lo in range(0, n, 5000):
        batch = [(b"key%08d" % i, rnd.randbytes(100)) for i in range(lo, min(n, lo + 5000))]
        db.write(batch)
        model.update(batch)


def _delete(db, keys, model: dict) -> None:
    keys = list(keys)
    for lo in range(0, len(keys), 5000):
        db.write([(k, None) for k in keys[lo:lo + 5000]])
    for k in keys:
        model.pop(k, None)


def _check(db, model: dict) -> None:
    assert list(db.scan()) == sorted(model.items())


@pytest.mark.parametrize("ratio", [0.2, 0])
def test_deleting_most_keys_gives_the_space_back_only_with_the_option(tmp_path, ratio):
    n = 20_000
    model: dict = {}
    with DB.open(tmp_path / "db", tombstone_compaction_ratio=ratio,
                 tombstone_compaction_delay=0) as db:
        _fill(db, n, model)
        db.compact()
        assert db.wait_for_compactions(WAIT_S)
        full = _table_bytes(db)
        doomed = random.Random(1).sample(sorted(model), n * 9 // 10)
        _delete(db, doomed, model)
        db.flush()
        assert db.wait_for_compactions(WAIT_S)
        st_ = db.stats()
        _check(db, model)
        if ratio:
            assert _table_bytes(db) < 0.15 * full
            assert st_["tombstone_compactions"] >= 1
            assert st_["compactions_by_reason"].get("tombstones", 0) >= 1
            assert st_["tombstones_dropped"] >= len(doomed)
            assert _tombstones(db) == 0
        else:  # the old behaviour: one L0 table below the trigger, kept for ever
            assert _table_bytes(db) > full
            assert st_["tombstone_compactions"] == 0 and "tombstones" not in st_["compactions_by_reason"]
            assert _tombstones(db) == len(doomed)


def test_a_reopened_db_compacts_its_tombstones_without_a_write(tmp_path):
    model: dict = {}
    path = tmp_path / "db"
    with DB.open(path, tombstone_compaction_ratio=0) as db:
        _fill(db, 10_000, model)
        db.compact()
        _delete(db, sorted(model)[:8000], model)  # a contiguous range
        db.flush()
        assert db.wait_for_compactions(WAIT_S)
        before = _table_bytes(db)
        assert _tombstones(db) == 8000
    with DB.open(path, tombstone_compaction_delay=0) as db:  # the default ratio
        assert db.wait_for_compactions(WAIT_S)
        assert db.stats()["tombstone_compactions"] >= 1 and _tombstones(db) == 0
        assert _table_bytes(db) < 0.3 * before
        _check(db, model)


def test_tombstones_trivially_moved_to_l6_are_elided_in_place_and_recovered(tmp_path):
    """Tombstones of keys past the data reach L6 by trivial moves (nothing below them to
    merge with), where the size picker never touches them again. With the option, each such
    table is rewritten at L6 without them (level == output_level), and a reopen replays that
    edit."""
    opts = dict(max_bytes_for_level_base=1024, level_size_multiplier=1.0,
                target_file_size=4096, filter_policy=None, l0_compaction_trigger=1,
                table_workers=0)
    path = tmp_path / "db"
    model = {b"a%05d" % i: b"x" * 50 for i in range(1000)}
    with DB.open(path, tombstone_compaction_ratio=0, **opts) as db:
        db.write(list(model.items()))
        db.compact()
        db.write([(b"a00500", b"y")] + [(b"m%05d" % i, None) for i in range(1000)])
        model[b"a00500"] = b"y"
        db.flush()
        assert db.wait_for_compactions(WAIT_S)
        levels = db.stats()["levels"]
        assert [lv["level"] for lv in levels if lv["tables"]] == [6]
        left = levels[6]["tombstones"]
        assert left > 0  # the old behaviour: kept at the bottom for ever
        files = [f.number for f in db._version.levels[6] if f.num_deletions]
    with DB.open(path, tombstone_compaction_ratio=0.2, tombstone_compaction_delay=0,
                 **opts) as db:
        assert db.wait_for_compactions(WAIT_S)
        st_ = db.stats()
        assert st_["compactions_by_reason"] == {"tombstones": len(files)}
        assert st_["tombstones_dropped"] == left and _tombstones(db) == 0
        assert [lv["level"] for lv in st_["levels"] if lv["tables"]] == [6]
        assert not {f.number for f in db._version.levels[6]} & set(files)
        version = db._version.levels
        _check(db, model)
    with DB.open(path, tombstone_compaction_ratio=0.2, tombstone_compaction_delay=0,
                 **opts) as db:  # recovery
        assert db._version.levels == version
        assert db.wait_for_compactions(WAIT_S) and db.stats()["compactions"] == 0
        _check(db, model)


def test_deletes_of_absent_keys_settle_and_leave_no_tombstone(tmp_path):
    model: dict = {}
    with DB.open(tmp_path / "db", max_bytes_for_level_base=256 << 10,
                 target_file_size=64 << 10, tombstone_compaction_delay=0) as db:
        _fill(db, 10_000, model)
        db.compact()
        assert db.wait_for_compactions(WAIT_S)
        data = _table_bytes(db)
        # Absent keys, between and after the present ones.
        _delete(db, [b"key%08d-" % i for i in range(0, 10_000, 2)] +
                [b"zz%06d" % i for i in range(5000)], model)
        db.flush()
        assert db.wait_for_compactions(WAIT_S)
        done = db.stats()["compactions"]
        assert _tombstones(db) == 0
        assert _table_bytes(db) <= data * 1.05
        # Settled: nothing is due, and nothing more runs.
        assert db.wait_for_compactions(1.0) and db.stats()["compactions"] == done
        _check(db, model)


def test_running_tombstone_compaction_reports_its_reason(tmp_path):
    path = str(tmp_path / "db")
    model: dict = {}
    with DB.open(path, tombstone_compaction_ratio=0, target_file_size=64 << 10) as db:
        _fill(db, 10_000, model)
        db.compact()
        _delete(db, sorted(model)[:5000], model)
        db.flush()
    fs = PausingFS()
    fs.armed = True  # the compaction thread's first output pauses (open writes no table)
    db = DB.open(path, fs=fs, target_file_size=64 << 10, tombstone_compaction_delay=0)
    try:
        assert fs.reached.wait(WAIT_S), "no tombstone compaction started at open"
        now = db.stats()["compaction_running"]
        assert now["reason"] == "tombstones" and now["manual"] is False
        assert (now["level"], now["output_level"]) == (0, 1)
    finally:
        fs.armed = False
        fs.resume.set()
    try:
        assert db.wait_for_compactions(WAIT_S)
        assert db.stats()["compactions_by_reason"] == {"tombstones": 1}
        _check(db, model)
    finally:
        db.close()


def test_wait_for_compactions_on_read_only_and_closed_dbs(tmp_path):
    path = tmp_path / "db"
    with DB.open(path) as db:
        db.put(b"k", b"v")
    with DB.open(path, read_only=True) as ro:
        assert ro.wait_for_compactions(0)
    db = DB.open(path)
    db.close()
    from engine.errors import ClosedError
    with pytest.raises(ClosedError):
        db.wait_for_compactions(1)


# ---------------------------------------------------------------------------------------------
# Stateful model test with heavy deletes and tombstone compactions on
# ---------------------------------------------------------------------------------------------
# No filters: a table holds at least one 4 KiB filter page, so with filters these small
# targets would cut one-entry tables and thousands of compactions per round.
HEAVY = dict(memtable_bytes=4096, target_file_size=4096, max_bytes_for_level_base=8192,
             level_size_multiplier=2.0, block_size=256, l0_compaction_trigger=2,
             l0_slowdown_trigger=4, l0_stop_trigger=6, slowdown_sleep_s=0.0,
             block_cache_bytes=4096, filter_policy=None, table_workers=0,
             tombstone_compaction_ratio=0.2, tombstone_compaction_delay=0)


class HeavyDeletes(DBModel):
    """DBModel's operations plus deleting many keys at once and waiting for the background
    work, on small levels (several levels deep) with tombstone compactions on."""

    @initialize()
    def start(self):
        self.dir = tempfile.mkdtemp(prefix="sievekv-heavy-")
        self.db = DB.open(self.dir, **HEAVY)
        self.model: dict[bytes, bytes] = {}

    @rule(step=st.integers(1, 4), bulk=st.booleans())
    def delete_many(self, step, bulk):
        keys = sorted(self.model)[::step] if not bulk else [b"bulk%03d" % i for i in range(60)]
        self.db.write([(k, None) for k in keys])
        for k in keys:
            self.model.pop(k, None)

    @rule()
    def settle(self):
        self.db.flush()
        assert self.db.wait_for_compactions(WAIT_S)
        assert list(self.db.scan()) == sorted(self.model.items())
        levels = self.db._version.levels
        for n, f in self.db._version.all_files():  # a table with nothing below: its own task
            if n > 0 and is_bottommost(levels, n, f.smallest, f.largest):
                assert f.num_deletions < 0.2 * f.num_entries

    @rule()
    def reopen(self):
        self.db.close()
        self.db = DB.open(self.dir, **HEAVY)


HeavyDeletes.TestCase.settings = settings(max_examples=20, stateful_step_count=40, deadline=None)
TestHeavyDeletes = HeavyDeletes.TestCase


def test_heavy_delete_cycles_keep_every_key_right(tmp_path):
    """A longer deterministic run: fill, delete most, refill part, many times, waiting for the
    background work (tombstone compactions included) between rounds."""
    rnd = random.Random(11)
    model: dict = {}
    with DB.open(tmp_path / "db", **HEAVY) as db:
        for r in range(8):
            batch = [(b"k%05d" % rnd.randrange(3000), b"v%d" % r * rnd.randrange(1, 20))
                     for _ in range(1500)]
            db.write(batch)
            model.update(batch)
            _delete(db, rnd.sample(sorted(model), len(model) * 8 // 10), model)
            if r % 2:
                db.flush()
                assert db.wait_for_compactions(WAIT_S)
                _check(db, model)
        db.flush()
        assert db.wait_for_compactions(WAIT_S)
        _check(db, model)
        assert db.stats()["tombstone_compactions"] > 0
    shutil.rmtree(tmp_path / "db")
