"""Review of ``DB.open(path, read_only=True)`` (engine/read_only.py): findings, first pinned as
strict xfails, now fixed. The same finding seen from ``cluster reshard`` is
tests/test_review_reshard.py ``test_a_refusal_after_reading_leaves_the_old_shards_as_they_were``
[without-lock]. Each test builds a DB in tmp_path and opens it in this process.
"""

from __future__ import annotations

import os
import threading

from engine import DB


def _checkpoint(tmp_path) -> str:
    """A checkpoint directory (tables, MANIFEST, CURRENT; no LOCK, as engine/checkpoint.py
    writes it and `cluster restore` stages it)."""
    src, ck = str(tmp_path / "db"), str(tmp_path / "ck")
    with DB.open(src, table_workers=0) as db:
        db.write([(b"k%03d" % i, b"v%d" % i) for i in range(50)])
        db.checkpoint(ck)
    assert "LOCK" not in os.listdir(ck)
    return ck


# Fixed in session 10; was a strict xfail: a read-only open created LOCK (FileSystem.lock used
# O_CREAT) in a directory without one; it now flocks an existing LOCK opened read-only and
# takes no lock where there is none (engine/read_only.py contract).
def test_read_only_open_of_a_directory_without_lock_creates_no_file(tmp_path):
    ck = _checkpoint(tmp_path)
    names, dir_mtime = sorted(os.listdir(ck)), os.stat(ck).st_mtime_ns
    with DB.open(ck, read_only=True, table_workers=0) as db:
        assert len(list(db.scan())) == 50
    assert sorted(os.listdir(ck)) == names
    assert os.stat(ck).st_mtime_ns == dir_mtime


# Fixed in session 10; was a strict xfail: the contract said "No background thread runs", but
# the table set's unref thread starts at open. The contract now says no flush or compaction
# thread runs (the unref thread only closes tables, and close joins it); this checks that.
def test_read_only_open_starts_no_flush_or_compaction_thread(tmp_path):
    ck = _checkpoint(tmp_path)
    before = set(threading.enumerate())
    with DB.open(ck, read_only=True, table_workers=0) as db:
        db.get(b"k001")
        started = [t.name for t in set(threading.enumerate()) - before]
    assert all(name.startswith("sievekv-unref") for name in started), started
    assert not [t for t in set(threading.enumerate()) - before if t.is_alive()]
