"""Compactions split into key ranges run at once (option max_subcompactions;
engine/compaction/subcompaction.py): the split itself, then whole DBs against a dict."""

from __future__ import annotations

import random
import threading
from types import SimpleNamespace

from engine import DB
from engine.compaction.runner import CompactionJob
from engine.compaction.subcompaction import split, split_points

# table_workers 1 + max_subcompactions 2: a pool of 2 workers, the process's usual size
OPTS = dict(memtable_bytes=64 * 1024, target_file_size=16 * 1024, max_bytes_for_level_base=256 * 1024,
            l0_compaction_trigger=2, l0_slowdown_trigger=8, l0_stop_trigger=12,
            slowdown_sleep_s=0.0, table_workers=1, max_subcompactions=2)


class _Table:
    def __init__(self, seps):
        self._seps = seps

    def block_separators(self):
        return list(self._seps)


def _task(tables):
    files = [SimpleNamespace(number=n) for n in tables]
    return SimpleNamespace(all_inputs=files), lambda n: _Table(tables[n])


def test_split_points_are_increasing_quantiles_of_the_block_separators():
    task, open_table = _task({1: [b"b", b"d", b"f", b"h"], 2: [b"a", b"c", b"e", b"g"]})
    assert split_points(task, open_table, 2) == [b"e"]
    assert split_points(task, open_table, 4) == [b"c", b"e", b"g"]
    # repeated separators give fewer, still increasing, points
    task, open_table = _task({1: [b"x"] * 8})
    assert split_points(task, open_table, 4) == [b"x"]
    task, open_table = _task({1: []})
    assert split_points(task, open_table, 4) == []


def test_split_gives_adjacent_ranges_covering_every_key():
    job = CompactionJob(task=None, dirname="d", grandparents=[], target_file_size=1,
                        max_grandparent_overlap=1, table_options=None, numbers=[7])
    parts = split(job, [b"c", b"m"])
    assert [p.bounds for p in parts] == [(None, b"c"), (b"c", b"m"), (b"m", None)]
    assert all(p.numbers == [] for p in parts) and job.numbers == [7] and job.bounds == (None, None)


def _levels_disjoint(db):
    for level in db._version.levels[1:]:
        for a, b in zip(level, level[1:]):
            assert a.largest < b.smallest, (a, b)


def test_a_db_with_split_compactions_answers_like_a_dict_and_reopens(tmp_path):
    rnd = random.Random(11)
    model = {}
    with DB.open(tmp_path / "db", **OPTS) as db:
        for i in range(30_000):
            k = b"k%05d" % rnd.randrange(12_000)
            if rnd.random() < 0.15:
                db.delete(k)
                model.pop(k, None)
            else:
                v = rnd.randbytes(rnd.randrange(0, 120))
                db.put(k, v)
                model[k] = v
        db.flush()
        db.compact()  # a manual compaction splits too
        st = db.stats()
        assert st["subcompactions"] >= 2, st["subcompactions"]  # the split path ran
        assert st["failed"] is None
        _levels_disjoint(db)
        assert dict(db.scan()) == model
        for k in rnd.sample(sorted(model), 500):
            assert db.get(k) == model[k]
        assert db.get(b"k99999") is None
    with DB.open(tmp_path / "db", **OPTS) as db:
        assert dict(db.scan()) == model
        _levels_disjoint(db)


def test_closing_during_a_split_compaction_loses_nothing(tmp_path):
    """close() while compact() runs split ranges in the workers: the compaction is cancelled
    (or finishes), and the reopened DB holds every write."""
    rnd = random.Random(3)
    model = {}
    db = DB.open(tmp_path / "db", **dict(OPTS, disable_auto_compactions=True))
    for i in range(20_000):
        k = rnd.randbytes(8)
        v = rnd.randbytes(100)
        db.put(k, v)
        model[k] = v
    db.flush()
    errors = []

    def compact():
        try:
            db.compact()
        except Exception as exc:  # the close may cancel it: ClosedError
            errors.append(exc)

    t = threading.Thread(target=compact)
    t.start()
    while db.stats()["compaction_running"] is None and t.is_alive():
        pass
    db.close()
    t.join(60)
    assert not t.is_alive()
    assert all(type(e).__name__ == "ClosedError" for e in errors), errors
    with DB.open(tmp_path / "db", **OPTS) as db:
        assert dict(db.scan()) == model
        _levels_disjoint(db)
