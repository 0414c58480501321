"""stats()["compaction_running"]: what a compaction in progress reports (the progress that
`sievekv compact` shows), observed mid-flight through a file layer that pauses the writing of
an output table, so nothing here depends on timing."""

from __future__ import annotations

import threading

from engine import DB
from engine.background import RunningCompaction
from engine.filenames import table_file_name
from engine.vfs import FileSystem, WritableFile


class _PausingFile(WritableFile):
    def append(self, data) -> None:
        fs = self._pause_fs
        if fs.armed and self.size > 0:  # pause once some bytes of an output are written
            fs.armed = False
            fs.reached.set()
            assert fs.resume.wait(60), "the test never resumed the compaction"
        super().append(data)


class PausingFS(FileSystem):
    """The real file system; while ``armed``, the first append to a table being written
    after it already holds data blocks the writer until ``resume`` is set."""

    def __init__(self):
        super().__init__()
        self.armed = False
        self.reached = threading.Event()
        self.resume = threading.Event()

    def open_writable(self, path: str) -> WritableFile:
        f = super().open_writable(path)
        if path.endswith(".sst"):
            f.__class__ = _PausingFile
            f._pause_fs = self
        return f


def _fill(db, n: int, rounds: int) -> None:
    for r in range(rounds):
        db.write([(b"k%07d" % i, b"v%d-%07d" % (r, i) * 4) for i in range(r, n, rounds)])
        db.flush()


def test_manual_compaction_reports_progress_while_it_runs(tmp_path):
    fs = PausingFS()  # table_workers=0: the compaction writes through this layer
    db = DB.open(str(tmp_path / "db"), fs=fs, table_workers=0,
                 disable_auto_compactions=True, target_file_size=64 << 10)
    try:
        _fill(db, 20000, 4)
        assert db.stats()["compaction_running"] is None
        fs.armed = True
        done = []

        def compact():
            db.compact()
            done.append(True)

        t = threading.Thread(target=compact)
        t.start()
        try:
            assert fs.reached.wait(60), "the compaction never wrote an output table"
            now = db.stats()["compaction_running"]
            assert now is not None
            assert now["manual"] is True and now["reason"] == "manual"
            assert now["level"] == 0 and now["output_level"] >= 1
            input_bytes = sum(lv["bytes"] for lv in db.stats()["levels"])
            assert now["input_bytes"] == input_bytes
            assert 0 < now["written_bytes"] < now["input_bytes"]
            assert now["seconds"] >= 0
        finally:
            fs.resume.set()
            t.join(60)
        assert not t.is_alive() and done == [True]
        assert db.stats()["compaction_running"] is None
        assert db.get(b"k0000005") is not None
    finally:
        fs.armed = False
        fs.resume.set()
        db.close()


def test_progress_counts_the_outputs_that_exist(tmp_path):
    """A job in a worker process has its output numbers reserved up front: the bytes written
    are the sizes of those that exist so far (the others are not created yet, or gone)."""
    class Task:
        level, output_level, reason = 0, 2, "l0-count"

        @staticmethod
        def input_bytes():
            return 1000

    running = RunningCompaction(Task, manual=False)
    running.outputs = [7, 8, 9]
    d = str(tmp_path)
    with open(table_file_name(d, 7), "wb") as f:
        f.write(b"x" * 300)
    with open(table_file_name(d, 9), "wb") as f:
        f.write(b"x" * 45)
    got = running.report(FileSystem(), d)
    assert got["written_bytes"] == 345
    assert (got["level"], got["output_level"], got["manual"], got["input_bytes"]) == (0, 2, False, 1000)
    assert got["reason"] == "l0-count"
