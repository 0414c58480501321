"""``DB.snapshot()``: get, multi_get and scan as of one moment (engine/snapshot.py)."""

from __future__ import annotations

import gc

import pytest

from engine import DB, ClosedError, InvalidArgumentError
from engine.errors import ResultTooLargeError

from .test_batch_visibility import KEYS, _run


def _state(snap, keys):
    return ({k: snap.get(k) for k in keys}, snap.multi_get(keys), list(snap.scan()))


def test_a_snapshot_reads_its_moment_through_switches_flushes_and_compactions(tmp_path):
    keys = [b"k%03d" % i for i in range(300)]
    with DB.open(tmp_path / "db", table_workers=0, memtable_bytes=16 * 1024) as db:
        db.write([(k, b"table") for k in keys[::2]])
        db.flush()
        db.write([(k, b"mem") for k in keys[::3]])
        db.delete(keys[4])
        before = _state(db, keys)  # the DB's own reads, at this moment
        with db.snapshot() as snap:
            assert _state(snap, keys) == before
            mem = db._rs.mem
            for r in range(3):  # overwrite, delete, insert: several memtable switches
                db.write([(k, b"new%d" % r) for k in keys[::5]])
                db.write([(k, None) for k in keys[::7]])
                db.write([(k, b"ins") for k in keys[1::4]])
            assert db._rs.mem is not mem
            db.flush()
            db.compact()
            assert _state(snap, keys) == before
            assert list(snap.scan(keys[10], keys[50], limit=5)) == \
                list((k, v) for k, v in before[2] if keys[10] <= k < keys[50])[:5]
        assert _state(db, keys) != before


def test_reads_after_close_fail_and_a_scan_begun_before_keeps_its_moment(tmp_path):
    with DB.open(tmp_path / "db", table_workers=0) as db:
        db.write([(b"k%03d" % i, b"1") for i in range(100)])
        snap = db.snapshot()
        it = snap.scan()
        assert next(it) == (b"k000", b"1")
        snap.close()
        snap.close()  # idempotent
        db.write([(b"k%03d" % i, b"2") for i in range(100)])
        assert [v for _k, v in it] == [b"1"] * 99
        for read in (lambda: snap.get(b"k001"), lambda: snap.multi_get([b"k001"]),
                     lambda: snap.scan()):
            with pytest.raises(ClosedError, match="snapshot is closed"):
                read()
        db.put(b"k000", b"3")  # a replacing write counts the releases
        assert db._rs.mem._history is None


def test_a_snapshot_of_a_closed_db_raises_closed(tmp_path):
    db = DB.open(tmp_path / "db", table_workers=0)
    db.put(b"a", b"1")
    snap = db.snapshot()
    db.close()
    with pytest.raises(ClosedError, match="DB is closed"):
        snap.get(b"a")
    snap.close()
    with pytest.raises(ClosedError):
        db.snapshot()


def test_a_dropped_snapshot_releases_what_it_holds(tmp_path):
    with DB.open(tmp_path / "db", table_workers=0) as db:
        db.put(b"a", b"1")
        mem = db._rs.mem
        snap = db.snapshot()
        db.put(b"a", b"2")
        assert [r[8:] for r in mem._history[b"a"]] == [b"1"]  # kept for the snapshot
        del snap
        gc.collect()
        db.put(b"a", b"3")
        assert mem._history is None


def test_bad_arguments_are_invalid_and_max_bytes_is_kept(tmp_path):
    with DB.open(tmp_path / "db", table_workers=0) as db:
        db.write([(b"a", b"x" * 10), (b"b", b"y" * 10)])
        with db.snapshot() as snap:
            with pytest.raises(InvalidArgumentError):
                snap.get(b"")
            with pytest.raises(InvalidArgumentError):
                snap.multi_get([b"a", "b"])
            with pytest.raises(InvalidArgumentError):
                snap.scan(limit=-1)
            assert snap.multi_get([b"a", b"b"], max_bytes=20) == [b"x" * 10, b"y" * 10]
            with pytest.raises(ResultTooLargeError):
                snap.multi_get([b"a", b"b"], max_bytes=19)


def test_a_snapshot_taken_while_batches_are_written_sees_one_batch(tmp_path):
    """tests/test_batch_visibility.py's check, each read being a snapshot's multi_get, gets
    and scan together: every value from the same batch."""
    def read_with(db):
        def read():
            with db.snapshot() as snap:
                return (snap.multi_get(KEYS) + [snap.get(k) for k in KEYS]
                        + [v for _k, v in snap.scan()])
        return read

    bad = _run(tmp_path, read_with, batches=1500, one_batch=True, memtable_bytes=64 * 1024)
    assert not bad, f"a snapshot saw more than one batch: {bad[0]}"


def test_snapshot_reads_are_counted_as_gets(tmp_path):
    with DB.open(tmp_path / "db", table_workers=0) as db:
        db.put(b"a", b"1")
        before = db.stats()["gets"]
        with db.snapshot() as snap:
            snap.get(b"a")
            snap.multi_get([b"a", b"b", b"c"])
        assert db.stats()["gets"] == before + 4
