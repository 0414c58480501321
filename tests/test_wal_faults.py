"""The WAL under injected faults: a crash at every operation keeps every synced record and
yields a clean prefix; a failed write or sync stops the writer."""

from __future__ import annotations

import errno
import os

import pytest

from engine.errors import StorageIOError
from engine.faultfs import FaultInjectionFS, InjectedCrash
from engine.wal import LogWriter, read_log

RECORDS = [b"r%d-" % i + bytes([i]) * (i * 7) for i in range(12)]


def scenario(fs, d, acked):
    """Write RECORDS, syncing after every other one; ``acked`` gets the count known durable."""
    path = os.path.join(d, "000003.log")
    w = LogWriter(fs.open_writable(path))
    fs.sync_dir(d)
    for i, rec in enumerate(RECORDS):
        w.add_record(rec)
        if i % 2 == 1:
            w.sync()
            acked.append(i + 1)
    w.close()
    return path


def count_ops(tmp_path):
    fs = FaultInjectionFS()
    d = tmp_path / "dry"
    d.mkdir()
    scenario(fs, str(d), [])
    return fs.op_count


@pytest.mark.parametrize("mode", ["drop", "torn", "keep"])
def test_crash_at_every_operation_keeps_synced_records(tmp_path, mode):
    total = count_ops(tmp_path)
    assert total > len(RECORDS)
    for n in range(1, total + 1):
        fs = FaultInjectionFS(seed=n)
        d = tmp_path / f"{mode}-{n}"
        d.mkdir()
        acked: list[int] = []
        fs.crash_after(n)
        with pytest.raises(InjectedCrash):
            scenario(fs, str(d), acked)
        fs.crash(mode)
        path = str(d / "000003.log")
        durable = acked[-1] if acked else 0
        if not os.path.exists(path):
            assert durable == 0
            continue
        res = read_log(fs, path)
        assert res.records == RECORDS[: len(res.records)], (mode, n)
        assert len(res.records) >= durable, (mode, n)
        if mode == "drop":
            assert not res.torn_tail and len(res.records) == durable


def test_partial_write_on_enospc_stops_the_writer_and_reads_as_torn_tail(tmp_path):
    fs = FaultInjectionFS()
    path = str(tmp_path / "000001.log")
    w = LogWriter(fs.open_writable(path))
    w.add_record(b"first")
    w.sync()
    fs.fail_writes_with(errno.ENOSPC, after_bytes=4)
    with pytest.raises(StorageIOError) as ei:
        w.add_record(b"second record")
    assert ei.value.errno == errno.ENOSPC
    fs.fail_writes_with(None)
    with pytest.raises(StorageIOError, match="earlier failure"):
        w.add_record(b"third")  # would land after a partial record: refused
    with pytest.raises(StorageIOError):
        w.sync()
    w.close()
    res = read_log(fs, path)
    assert res.records == [b"first"] and res.dropped_bytes == 4


def test_failed_sync_stops_the_writer(tmp_path):
    fs = FaultInjectionFS()
    w = LogWriter(fs.open_writable(str(tmp_path / "000001.log")))
    w.add_record(b"a")
    fs.fail_sync(True)
    with pytest.raises(StorageIOError):
        w.sync()
    fs.fail_sync(False)
    with pytest.raises(StorageIOError, match="earlier failure"):
        w.add_record(b"b")
    w.close()


def test_read_errors_surface_as_storage_errors(tmp_path):
    fs = FaultInjectionFS()
    path = str(tmp_path / "000001.log")
    w = LogWriter(fs.open_writable(path))
    w.add_record(b"a")
    w.close()
    fs.fail_reads_with(errno.EIO)
    with pytest.raises(StorageIOError):
        read_log(fs, path)
