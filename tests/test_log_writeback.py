"""Early writeback of the log (engine/wal/writer.py ``WRITEBACK_BYTES``, engine/vfs.py
``WritableFile.start_writeback``).

Every ``WRITEBACK_BYTES`` appended, a log writer asks the OS to start writing them out, so the
fsync that ends a log at a memtable switch (which a writer waits for) has little left to do.
What must hold: the requests cover what was appended, in order, once each; they are advice
only (a power loss still drops every byte not synced, and a failing request is ignored); the
log reads back the same.
"""

import os

from engine.faultfs import FaultInjectionFS
from engine.vfs import FileSystem, WritableFile
from engine.wal import LogWriter, read_log
from engine.wal.writer import WRITEBACK_BYTES


class _Recording(FileSystem):
    """The real file system, noting each writeback request (the layer is injectable for this)."""

    def __init__(self):
        super().__init__()
        self.requests = []

    def open_writable(self, path):
        f = super().open_writable(path)
        requests = self.requests
        start = f.start_writeback

        def start_writeback(offset, length):
            requests.append((offset, length))
            start(offset, length)

        f.start_writeback = start_writeback
        return f


def test_writeback_is_requested_every_writeback_bytes_over_what_was_appended(tmp_path):
    fs = _Recording()
    path = str(tmp_path / "000001.log")
    w = LogWriter(fs.open_writable(path))
    payloads = [os.urandom(997 + i % 50) for i in range(3500)]
    for p in payloads:
        w.add_record(p)
    w.sync()
    w.close()
    size = os.path.getsize(path)
    assert len(fs.requests) == size // WRITEBACK_BYTES >= 3
    pos = 0
    for offset, length in fs.requests:  # back to back from 0, each at least WRITEBACK_BYTES
        assert offset == pos and length >= WRITEBACK_BYTES
        pos += length
    assert size - pos < WRITEBACK_BYTES
    assert read_log(FileSystem(), path).records == payloads


def test_writeback_is_only_advice_a_power_loss_still_drops_unsynced_bytes(tmp_path):
    fs = FaultInjectionFS()
    path = str(tmp_path / "000001.log")
    w = LogWriter(fs.open_writable(path))
    fs.sync_dir(str(tmp_path))  # the name survives; the question is the bytes
    payloads = [os.urandom(1000) for _ in range(3000)]
    for p in payloads[:1000]:
        w.add_record(p)
    w.sync()  # ~1 MB durable
    for p in payloads[1000:]:  # ~2 MB more, written back early but never synced
        w.add_record(p)
    w.close()
    fs.crash("drop")
    assert read_log(FileSystem(), path).records == payloads[:1000]


def test_a_failing_writeback_request_is_ignored(tmp_path):
    f = FileSystem().open_writable(str(tmp_path / "x"))
    f.append(b"x" * 100)
    fd = f._fd
    f.close()
    f._fd = fd  # a closed descriptor: the request fails (EBADF) and is ignored
    f.start_writeback(0, 100)
    assert isinstance(f, WritableFile)
