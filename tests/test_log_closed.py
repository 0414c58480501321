"""A log the DB finished with ends with its CLOSED record (docs/format.md, "Record"), so that
damage to its last batch is corruption, not a torn tail that silently drops an acknowledged
write (before session 6 a flipped bit in the last batch of a cleanly closed log lost that
batch with no error; the corruption sweep showed it). A log the DB was still writing when it
stopped (a crash) keeps the lenient rule: its damaged last record is dropped."""

from __future__ import annotations

import errno
import os

import pytest

from engine import DB
from engine.errors import CorruptionError
from engine.faultfs import FaultInjectionFS
from engine.format import LOG_HEADER_SIZE
from engine.wal import LogWriter, parse_log
from engine.vfs import default_fs


def _logs(path: str) -> list[str]:
    return sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".log"))


def _write(db, n: int = 20) -> None:
    for i in range(n):
        db.put(b"k%03d" % i, b"v%03d" % i)


def test_a_cleanly_closed_log_ends_with_closed_and_its_damaged_last_batch_is_an_error(tmp_path):
    path = str(tmp_path / "db")
    with DB.open(path, table_workers=0) as db:
        _write(db)
    (log,) = _logs(path)
    data = open(log, "rb").read()
    res = parse_log(data)
    assert res.closed and len(res.records) == 20 and res.end_offset == len(data)
    last = res.offsets[-1]
    bad = bytearray(data)
    bad[last + LOG_HEADER_SIZE + 3] ^= 0x10  # inside the last batch
    open(log, "wb").write(bytes(bad))
    with pytest.raises(CorruptionError) as info:
        DB.open(path, table_workers=0)
    assert info.value.path == log and info.value.offset == last
    open(log, "wb").write(data)
    with DB.open(path, table_workers=0) as db:  # repaired: every write is there
        assert [db.get(b"k%03d" % i) for i in range(20)] == [b"v%03d" % i for i in range(20)]


def test_a_crashed_log_has_no_closed_record_and_drops_a_damaged_last_batch(tmp_path):
    path = str(tmp_path / "db")
    db = DB.open(path, table_workers=0)
    try:
        _write(db)
        (log,) = _logs(path)
        image = open(log, "rb").read()  # what a crash right now would leave
    finally:
        db.close()
    res = parse_log(image)
    assert not res.closed and len(res.records) == 20
    bad = bytearray(image)
    bad[res.offsets[-1] + LOG_HEADER_SIZE + 3] ^= 0x10
    crashed = str(tmp_path / "crashed")
    os.makedirs(crashed)
    for name in os.listdir(path):
        if name != "LOCK":
            src = os.path.join(path, name)
            dst = os.path.join(crashed, name)
            open(dst, "wb").write(bytes(bad) if src == log else open(src, "rb").read())
    with DB.open(crashed, table_workers=0) as db:  # the torn-tail rule: the last batch dropped
        assert db.get(b"k019") is None
        assert [db.get(b"k%03d" % i) for i in range(19)] == [b"v%03d" % i for i in range(19)]


def test_a_damaged_closed_record_drops_only_itself(tmp_path):
    path = str(tmp_path / "db")
    with DB.open(path, table_workers=0) as db:
        _write(db)
    (log,) = _logs(path)
    pristine = {n: open(os.path.join(path, n), "rb").read() for n in os.listdir(path)
                if n != "LOCK"}
    data = pristine[os.path.basename(log)]
    for off in range(len(data) - LOG_HEADER_SIZE, len(data)):  # every byte of the marker
        copy = str(tmp_path / f"copy{off}")
        os.makedirs(copy)
        for name, content in pristine.items():
            if name == os.path.basename(log):
                content = bytearray(content)
                content[off] ^= 0x01
            open(os.path.join(copy, name), "wb").write(bytes(content))
        with DB.open(copy, table_workers=0) as db:
            assert [db.get(b"k%03d" % i) for i in range(20)] == [b"v%03d" % i for i in range(20)]


def test_bytes_after_closed_are_dropped_unless_they_are_a_record(tmp_path):
    fs = default_fs()
    p = str(tmp_path / "x.log")
    w = LogWriter(fs.open_writable(p))
    w.add_record(b"one")
    w.add_closed_marker()
    w.sync()
    w.close()
    data = open(p, "rb").read()
    zeros = parse_log(data + bytes(100))  # zero fill after it hides no write
    assert zeros.records == [b"one"] and zeros.closed and zeros.dropped_bytes == 100
    w = LogWriter(fs.open_appendable(p))  # what the DB never does: append after CLOSED
    w.add_record(b"two")
    w.close()
    with pytest.raises(CorruptionError, match="after the log's CLOSED record"):
        parse_log(open(p, "rb").read())


def test_the_writer_takes_no_record_after_closed(tmp_path):
    w = LogWriter(default_fs().open_writable(str(tmp_path / "x.log")))
    w.add_record(b"a")
    w.add_closed_marker()
    with pytest.raises(Exception, match="CLOSED record"):
        w.add_record(b"b")
    w.sync()  # still allowed: the marker must become durable
    w.close()


def test_a_full_disk_at_the_closed_record_still_closes_cleanly(tmp_path):
    """The marker is best effort: if appending it fails, close syncs what was written and the
    reopen reads every write (the torn marker is a torn tail)."""
    fs = FaultInjectionFS(seed=3)
    path = str(tmp_path / "db")
    db = DB.open(path, fs=fs)
    _write(db)
    fs.fail_writes_with(errno.ENOSPC, after_bytes=4)  # the 9-byte marker is cut at 4 bytes
    db.close()
    fs.fail_writes_with(None)
    fs.crash("drop")  # only what was synced survives
    with DB.open(path, fs=fs) as db:
        assert [db.get(b"k%03d" % i) for i in range(20)] == [b"v%03d" % i for i in range(20)]
