"""A flush's or compaction's output is checked before the manifest edit that would list it.

The disk garbles a table as it is written (the fault layer flips a bit of its footer before
the fsync; no error is reported), so the table fails to open. The job must fail *before*
its edit: the DB enters its failed state, nothing is installed, the damaged file is removed,
and a reopen (on a sound disk) finds every write, from the memtable's log or from the
compaction's inputs. Before engine/output_check.py, the edit was made first: the reopen met a
manifest listing a table it could not read.
"""

from __future__ import annotations

import os
import random
from dataclasses import replace

import pytest

from engine import DB, filenames
from engine.errors import CorruptionError, StorageIOError
from engine.faultfs import FaultInjectionFS
from engine.output_check import check_output

SMALL = dict(memtable_bytes=1 << 20, target_file_size=16 * 1024, table_workers=0,
             disable_auto_compactions=True)


def _fill(db, n: int, seed: int) -> dict:
    rng = random.Random(seed)
    model = {}
    for _ in range(n):
        k, v = rng.randbytes(12), rng.randbytes(60)
        db.put(k, v)
        model[k] = v
    return model


def _holds(db, model: dict) -> None:
    for k, v in model.items():
        assert db.get(k) == v
    assert dict(db.scan()) == model


def _tables(path) -> set[int]:
    return {int(f[:-4]) for f in os.listdir(path) if f.endswith(".sst")}


def test_a_garbled_flush_output_is_not_installed(tmp_path):
    path = tmp_path / "db"
    fs = FaultInjectionFS(seed=1)
    db = DB.open(str(path), fs=fs, **SMALL)
    try:
        model = _fill(db, 500, seed=1)
        log_number = db._mem.log_number
        assert _tables(path) == set()
        fs.garble_on_sync(lambda p: p.endswith(".sst"), from_end=3)  # the footer's magic
        with pytest.raises(CorruptionError) as info:  # DATA_LOSS through a shard
            db.flush()
        fs.garble_on_sync(None)
        (garbled, _), = fs.garbled
        msg = str(info.value)
        assert os.path.basename(garbled) in msg
        assert "flush output failed its check before install, so nothing was installed" in msg
        assert "write-ahead log still holds its data" in msg
        st = db.stats()
        assert st["failed"] is not None and st["flushes"] == 0
        assert st["levels"][0]["tables"] == 0
        assert not os.path.exists(garbled)  # removed, not left for the reopen to trip on
        assert os.path.exists(filenames.log_file_name(str(path), log_number))
        with pytest.raises(StorageIOError, match="flush output failed its check"):
            db.put(b"after", b"x")  # writes refused, naming the cause
        _holds(db, model)  # reads go on, from the frozen memtable
    finally:
        db.close()
    with DB.open(str(path), **SMALL) as db:  # the log is replayed
        _holds(db, model)
        db.flush()
        _holds(db, model)


def test_a_garbled_compaction_output_keeps_the_inputs(tmp_path):
    path = tmp_path / "db"
    fs = FaultInjectionFS(seed=2)
    db = DB.open(str(path), fs=fs, **SMALL)
    try:
        model = _fill(db, 400, seed=2)
        db.flush()
        model.update(_fill(db, 400, seed=3))
        db.flush()
        inputs = _tables(path)
        assert len(inputs) == 2
        synced: list[str] = []

        def third_output(p: str) -> bool:  # outputs before and after it are sound
            if not p.endswith(".sst"):
                return False
            if p not in synced:
                synced.append(p)
            return synced.index(p) == 2

        fs.garble_on_sync(third_output, from_end=3)
        with pytest.raises(CorruptionError, match="compaction output failed its check before "
                                                  "install.*its input tables stay live"):
            db.compact()
        fs.garble_on_sync(None)
        assert len(fs.garbled) == 1 and len(synced) > 3
        assert _tables(path) == inputs  # every output removed, every input kept
        assert db.stats()["failed"] is not None
        assert set(db._version.live_numbers()) == inputs
        _holds(db, model)
    finally:
        db.close()
    with DB.open(str(path), **SMALL) as db:
        assert set(db._version.live_numbers()) == inputs
        _holds(db, model)
        db.compact()  # the disk is sound now
        assert db.stats()["levels"][0]["tables"] == 0
        _holds(db, model)


def test_a_garbled_output_written_by_a_table_worker_is_not_installed(tmp_path):
    """The same through a worker process (the default): the worker writes with the real file
    system, and the DB garbles the file itself as the disk would, between write and open."""
    path = tmp_path / "db"
    db = DB.open(str(path), **{**SMALL, "table_workers": 1})
    try:
        model = _fill(db, 500, seed=4)
        real = db._tables._open_table

        garbled = []

        def garble_then_open(p, number):
            if p not in garbled:  # once: the second try must meet the same damage
                garbled.append(p)
                with open(p, "r+b") as f:  # the footer's magic, as the disk returns it
                    f.seek(-3, os.SEEK_END)
                    b = f.read(1)
                    f.seek(-3, os.SEEK_END)
                    f.write(bytes([b[0] ^ 0x10]))
            return real(p, number)

        db._tables._open_table = garble_then_open
        with pytest.raises(CorruptionError, match="flush output failed its check"):
            db.flush()
        assert db.stats()["table_workers"]["jobs_in_process"] >= 1  # a worker wrote it
        assert _tables(path) == set()
    finally:
        db.close()
    with DB.open(str(path), **SMALL) as db:
        _holds(db, model)


def test_an_output_that_disagrees_with_its_writer_is_refused(tmp_path):
    """check_output compares the open table with the FileMeta its writer returned."""
    with DB.open(tmp_path / "db", **SMALL) as db:
        _fill(db, 100, seed=5)
        db.flush()
        (f,) = db._version.levels[0]
        table = db._tables.get(f.number)
        check_output(table, f)  # the real description passes
        for field, value in (("size", f.size + 1), ("num_entries", f.num_entries - 1),
                             ("smallest", b"\x00"), ("largest", f.largest + b"\x00")):
            bad = replace(f, **{field: value})
            with pytest.raises(CorruptionError, match=os.path.basename(table.path)):
                check_output(table, bad)


def test_an_open_that_fails_once_is_tried_again(tmp_path):
    """EIO on the first open of a new table, then none: the flush installs."""
    fs = FaultInjectionFS(seed=6)
    with DB.open(str(tmp_path / "db"), fs=fs, **SMALL) as db:
        model = _fill(db, 200, seed=6)
        real = db._tables._open_table
        calls = []

        def once(p, number):
            calls.append(number)
            if len(calls) == 1:
                raise StorageIOError("injected read failure", path=p, errno_=5)
            return real(p, number)

        db._tables._open_table = once
        db.flush()
        assert len(calls) == 2 and calls[0] == calls[1]
        assert db.stats()["failed"] is None and db.stats()["flushes"] == 1
        _holds(db, model)
