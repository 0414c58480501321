"""Review of ``DB.open(path, read_only=True)`` (engine/read_only.py) and its use by ``cluster
reshard``: findings, first pinned as strict xfails, now fixed.

Engine tests build a DB in tmp_path and open it in this process; the reshard test drives
router/cli/reshard_cmd.py in this process (tests/test_reshard.py ``Setup``). No server is started.
"""

from __future__ import annotations

import os
import threading

import pytest

from engine import DB
from router.cli import reshard_cmd
from router.cli.exit_codes import CliError
from router.slots import slot_of

from .test_cli_e2e import cli_env_cleared  # noqa: F401 (a fixture, used by pytestmark)
from .test_reshard import Setup, conf, model_of, tree

pytestmark = pytest.mark.usefixtures("cli_env_cleared")


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


# Fixed in session 10; was a strict xfail: the same LOCK creation seen from cluster reshard:
# old shards without LOCK (restored with --no-verify) gained one when the reshard refused.
def test_a_reshard_refusal_leaves_old_shards_without_lock_as_they_were(tmp_path):
    s = Setup(tmp_path)
    s.build(conf(2), model_of(200), garbage=False)
    stray = next(b"stray%d" % i for i in range(100) if slot_of(b"stray%d" % i) >= 8192)
    with DB.open(os.path.join(s.data_dir, "shard-0"), create_if_missing=False,
                 table_workers=0) as db:
        db.put(stray, b"x")  # shard-0 holds a key of shard-1's slots: refused after reading
    for i in range(2):  # as a checkpoint restored with --no-verify leaves them
        os.remove(os.path.join(s.data_dir, f"shard-{i}", "LOCK"))
    before = tree(s.data_dir)
    with pytest.raises(CliError) as ei:
        reshard_cmd.run(s.config(conf(3)), quiet=True)
    assert ei.value.code == 1 and "outside its slot range" in str(ei.value)
    after = tree(s.data_dir)
    for t in (before, after):
        t.pop("cluster.lock", None)
    assert after == before


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
