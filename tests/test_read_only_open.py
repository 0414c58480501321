"""``DB.open(path, read_only=True)`` (engine/read_only.py): reads everything, writes nothing."""

from __future__ import annotations

import os

import pytest

from engine import DB
from engine.errors import InvalidArgumentError, LockedError
from engine.read_only import ReadOnlyError


def _files(path: str) -> dict:
    """name -> (bytes, mtime_ns) of every file in ``path``."""
    out = {}
    for name in sorted(os.listdir(path)):
        p = os.path.join(path, name)
        with open(p, "rb") as f:
            out[name] = (f.read(), os.stat(p).st_mtime_ns)
    return out


def _db_with_unflushed_logs(path: str) -> dict:
    """A closed DB with tables, a deletion and writes only in its log (a normal open would
    carry them over into a new log and rewrite the manifest). Returns the contents."""
    model = {}
    db = DB.open(path, table_workers=0, memtable_bytes=16 << 10)
    for i in range(600):  # several memtables: tables and more than one log
        k, v = b"k%05d" % i, b"v%d" % i * 10
        db.put(k, v)
        model[k] = v
    db.flush()
    for i in range(600, 700):
        k, v = b"k%05d" % i, b"w%d" % i
        db.put(k, v)
        model[k] = v
    db.delete(b"k00003")
    del model[b"k00003"]
    db.close()
    return model


def test_read_only_open_returns_unflushed_log_data_and_changes_no_file(tmp_path):
    path = str(tmp_path / "db")
    model = _db_with_unflushed_logs(path)
    assert any(n.endswith(".log") and os.path.getsize(os.path.join(path, n))
               for n in os.listdir(path))
    before = _files(path)
    dir_mtime = os.stat(path).st_mtime_ns
    with DB.open(path, read_only=True, table_workers=0) as db:
        assert dict(db.scan()) == model
        assert db.get(b"k00650") == model[b"k00650"] and db.get(b"k00003") is None
        assert db.verify()["damaged"] == []
    assert _files(path) == before
    assert os.stat(path).st_mtime_ns == dir_mtime  # nothing created, renamed or removed
    # And a normal open afterwards sees the same data (nothing was lost either).
    with DB.open(path, table_workers=0) as db:
        assert dict(db.scan()) == model


def test_read_only_open_of_a_torn_log_tail_drops_it_and_writes_nothing(tmp_path):
    path = str(tmp_path / "db")
    model = _db_with_unflushed_logs(path)
    log = max(n for n in os.listdir(path) if n.endswith(".log"))
    with open(os.path.join(path, log), "ab") as f:
        f.write(b"\x07" * 5)  # a torn record header
    before = _files(path)
    with DB.open(path, read_only=True) as db:
        assert dict(db.scan()) == model
    assert _files(path) == before


@pytest.mark.parametrize("call", ["put", "delete", "write", "flush", "compact", "checkpoint"])
def test_read_only_db_refuses_every_write(tmp_path, call):
    path = str(tmp_path / "db")
    _db_with_unflushed_logs(path)
    before = _files(path)
    args = {"put": (b"a", b"b"), "delete": (b"a",), "write": ([(b"a", b"b")],), "flush": (),
            "compact": (), "checkpoint": (str(tmp_path / "ck"),)}[call]
    with DB.open(path, read_only=True) as db:
        with pytest.raises(ReadOnlyError, match="read-only"):
            getattr(db, call)(*args)
    assert _files(path) == before
    assert not os.path.exists(tmp_path / "ck")


def test_read_only_open_takes_the_lock_and_creates_nothing(tmp_path):
    path = str(tmp_path / "db")
    _db_with_unflushed_logs(path)
    with DB.open(path, table_workers=0):
        with pytest.raises(LockedError):
            DB.open(path, read_only=True)
    with DB.open(path, read_only=True):
        with pytest.raises(LockedError):
            DB.open(path, table_workers=0)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InvalidArgumentError, match="holds no DB"):
        DB.open(str(empty), read_only=True)
    assert os.listdir(empty) == []
    with pytest.raises(InvalidArgumentError):
        DB.open(str(tmp_path / "missing"), read_only=True)
    assert not os.path.exists(tmp_path / "missing")
