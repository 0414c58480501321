"""Adversarial review of checkpoint (commit 14e8d58): each test here shows a bug found, as a
strict xfail that passes once it is fixed. Real files, real shard and router processes (the
cluster of this module is stopped by its finalizer, even on failure)."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import grpc
import pytest

from engine import DB
from engine.checkpoint import STAGING_SUFFIX
from engine.errors import InvalidArgumentError, StorageIOError
from engine.vfs import FileSystem
from router.client import Client
from sievekv_proto import sievekv_pb2 as pb
from sievekv_proto import sievekv_pb2_grpc as pbg

from .test_checkpoint import SMALL, _content, _fill
from .test_cli_e2e import ROOT, cli_env_cleared, proc, sievekv, two_shard_cluster  # noqa: F401
from .conftest import sigstop

pytestmark = pytest.mark.usefixtures("cli_env_cleared")


# -- the staging directory's name is not reserved ------------------------------------------------

# Fixed in session 8; was a strict xfail: a complete checkpoint written to <dest>.checkpoint-tmp
# was deleted by the next checkpoint to <dest> (staging dirs are now claimed by a flocked marker
# file; one without it is refused).
def test_a_complete_checkpoint_at_the_staging_path_is_never_deleted(tmp_path):
    db = DB.open(str(tmp_path / "db"), **SMALL)
    try:
        model = _fill(db, 1500)
        first = str(tmp_path / "b") + STAGING_SUFFIX
        db.checkpoint(first)  # a valid destination: it did not exist
        try:
            db.checkpoint(tmp_path / "b")
        except InvalidArgumentError:
            pass  # refusing is a fix too
    finally:
        db.close()
    assert os.path.isdir(first), "a complete checkpoint was deleted"
    assert _content(first) == model


# Fixed in session 8; was a strict xfail: a live DB at <dest>.checkpoint-tmp lost every file to
# a checkpoint to <dest> (same fix).
def test_a_live_db_at_the_staging_path_is_never_deleted(tmp_path):
    db = DB.open(str(tmp_path / "db"), **SMALL)
    other_path = str(tmp_path / "x") + STAGING_SUFFIX
    other = DB.open(other_path, **SMALL)
    try:
        _fill(db, 500)
        theirs = _fill(other, 1500, seed=1)
        other.flush()
        try:
            db.checkpoint(tmp_path / "x")
        except InvalidArgumentError:
            pass  # refusing is a fix too
    finally:
        other.close()
        db.close()
    got = _content(other_path)
    intact = got == theirs
    assert intact, f"the other DB holds {len(got)} of its {len(theirs)} keys"


# -- two checkpoints to one destination ----------------------------------------------------------

_B_SCRIPT = textwrap.dedent("""
    import os, sys, time
    from engine import DB
    from engine.vfs import FileSystem

    src, dest, at, go = sys.argv[1:5]

    class Gate(FileSystem):
        # waits before creating the checkpoint's manifest (its tables are linked by then)
        def open_writable(self, path):
            if "MANIFEST" in path and ".checkpoint-tmp" in path:
                open(at, "w").close()
                deadline = time.monotonic() + 60
                while not os.path.exists(go) and time.monotonic() < deadline:
                    time.sleep(0.01)
            return super().open_writable(path)

    db = DB.open(src, fs=Gate(), memtable_bytes=32 << 10)
    try:
        for i in range(300):
            db.put(b"b%05d" % i, b"from b")
        try:
            db.checkpoint(dest)
            print("B ok")
        except Exception as exc:
            print("B failed:", type(exc).__name__)
    finally:
        db.close()
""")


class _GateBeforeRename(FileSystem):
    """sync_dir of a checkpoint's staging directory (the step before its rename) waits for
    ``go``; ``at`` is set when it is reached."""

    def __init__(self):
        super().__init__()
        self.at, self.go = threading.Event(), threading.Event()

    def sync_dir(self, path):
        if path.endswith(STAGING_SUFFIX):
            self.at.set()
            assert self.go.wait(60)
        return super().sync_dir(path)


# Fixed in session 8; was a strict xfail: a second checkpoint to the same dest (another process)
# cleared the first's staging dir, and the first renamed a half-built dir to dest and reported
# success (the marker's flock is held for the whole call).
def test_a_checkpoint_to_a_destination_another_process_is_writing_is_never_partial(tmp_path):
    fs = _GateBeforeRename()
    db = DB.open(str(tmp_path / "a"), fs=fs, **SMALL)
    dest = str(tmp_path / "ck")
    at, go = str(tmp_path / "b-at"), str(tmp_path / "b-go")
    result, b = {}, None

    def run_a():
        try:
            result["a"] = db.checkpoint(dest)
        except StorageIOError as exc:
            result["a"] = exc

    t = threading.Thread(target=run_a)
    try:
        model = _fill(db, 1500)
        t.start()
        assert fs.at.wait(60)  # A's staging is complete, A is about to rename it
        b = subprocess.Popen([sys.executable, "-c", _B_SCRIPT, str(tmp_path / "b"), dest, at,
                              go], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
        deadline = time.monotonic() + 60
        while not os.path.exists(at) and b.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        fs.go.set()
        t.join(60)
        open(go, "w").close()
        if b is not None:
            try:
                b.communicate(timeout=60)
            finally:
                b.kill()
        db.close()
    # Whoever won, dest is a complete checkpoint (A's or B's), or absent; never partial.
    if os.path.exists(dest):
        got = _content(dest)
        assert got == model or got == {b"b%05d" % i: b"from b" for i in range(300)}
    if isinstance(result.get("a"), dict):
        assert _content(dest) == model, "A reported success for something else"


# -- through the service and the CLI -------------------------------------------------------------

cluster = two_shard_cluster("review_checkpoint")


# Fixed in session 8; was a strict xfail: a second Admin.Checkpoint to a directory being written
# got INTERNAL / INVALID_ARGUMENT, not ALREADY_EXISTS (the engine raises AlreadyExistsError).
def test_two_admin_checkpoints_to_one_directory(cluster, tmp_path):
    with Client(cluster["router"]) as c:
        # unflushed data makes each checkpoint's flush take a while
        c.write([(b"big%05d" % i, bytes([i % 251]) * 1000) for i in range(3000)])
        shard = next(s for s in c.cluster_info()["shards"] if s["name"] == "shard-0")
    dest = str(tmp_path / "one")
    with grpc.insecure_channel(shard["address"]) as ch:
        stub = pbg.AdminStub(ch)
        calls = [stub.Checkpoint.future(pb.CheckpointRequest(dir=dest), timeout=60)
                 for _ in range(2)]
        codes = []
        for f in calls:
            try:
                f.result()
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                codes.append(exc.code())
    assert sorted(c.name for c in codes) == ["ALREADY_EXISTS", "OK"], codes
    with DB.open(dest) as ck:
        assert ck.get(b"big00000") is not None or ck.get(b"big00001") is not None


# Fixed in session 8; was a strict xfail: the CLI said "the others' checkpoints are complete"
# when every shard failed.
def test_cli_does_not_claim_complete_checkpoints_when_every_shard_failed(cluster, tmp_path):
    f = tmp_path / "a-file"
    f.write_text("not a directory")
    r = sievekv("checkpoint", str(f), "--config", cluster["conf"])
    assert r.returncode != 0 and r.stdout.count("FAILED") == 2, (r.stdout, r.stderr)
    assert "complete" not in r.stderr, r.stderr


# Fixed in session 8; was a strict xfail: the CLI exited 4, not 3, when --timeout passed before
# a shard answered.
def test_cli_timeout_with_a_slow_shard_exits_3(cluster, tmp_path):
    pid = proc(cluster, "shard-1")["pid"]
    sigstop(pid)  # the shard answers nothing until SIGCONT
    try:
        r = sievekv("checkpoint", str(tmp_path / "t"), "--timeout", "3",
                    "--config", cluster["conf"])
    finally:
        os.kill(pid, signal.SIGCONT)
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
