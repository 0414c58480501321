"""A DB directory without CURRENT (engine/recovery.py, step 2): a DB that lost its CURRENT is
refused (its tables and logs hold data a new DB would delete), a first open that crashed
before writing CURRENT (a manifest alone) is created anew."""

from __future__ import annotations

import os

import pytest

from engine import DB
from engine.errors import CorruptionError


def test_a_db_that_lost_its_current_file_is_corruption_not_a_new_empty_db(tmp_path):
    """LevelDB would create a new DB here (MANIFEST-000001 over the old one, every table then
    unreferenced and deleted); we refuse and name the file, and write nothing."""
    path = tmp_path / "db"
    with DB.open(str(path)) as db:
        db.put(b"k", b"v")
        db.flush()
    os.remove(path / "CURRENT")
    before = sorted(os.listdir(path))
    with pytest.raises(CorruptionError, match="CURRENT is missing"):
        DB.open(str(path))
    assert sorted(os.listdir(path)) == before
    (path / "CURRENT").write_text(
        next(n for n in before if n.startswith("MANIFEST-")) + "\n")
    with DB.open(str(path)) as db:
        assert db.get(b"k") == b"v"


@pytest.mark.parametrize("unflushed", [False, True])
def test_a_lost_current_with_only_logs_is_refused_too(tmp_path, unflushed):
    """Writes never flushed live in the log alone: a new DB would delete it as obsolete."""
    path = tmp_path / "db"
    db = DB.open(str(path))
    db.put(b"k", b"v", sync=True)
    if not unflushed:
        db.flush()
    db.close()
    os.remove(path / "CURRENT")
    with pytest.raises(CorruptionError, match="CURRENT is missing"):
        DB.open(str(path))


def test_a_first_open_that_crashed_before_current_is_created_anew(tmp_path):
    """Manifest.create writes MANIFEST-000001, then CURRENT: a crash between them leaves a
    manifest alone (and maybe CURRENT's temp file), which held nothing yet."""
    path = tmp_path / "db"
    path.mkdir()
    (path / "MANIFEST-000001").write_bytes(b"\x00" * 10)  # torn, never named by CURRENT
    (path / "000001.tmp").write_bytes(b"MANIFEST-")
    with DB.open(str(path)) as db:
        db.put(b"k", b"v")
    with DB.open(str(path)) as db:
        assert db.get(b"k") == b"v"
