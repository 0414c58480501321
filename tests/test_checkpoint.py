"""DB.checkpoint, Admin.Checkpoint, Client.checkpoint and `sievekv checkpoint`: a consistent
copy of a live DB that opens as it is (engine/checkpoint.py). The cluster tests run real shard
and router processes (stopped by start_cluster's finalizer, even on failure)."""

import errno
import os
import threading

import grpc
import pytest

from engine import DB
from engine.checkpoint import STAGING_MARKER, STAGING_SUFFIX
from engine.errors import AlreadyExistsError, ClosedError, InvalidArgumentError, StorageIOError
from engine.vfs import FileSystem
from router.client import Client
from router.client_errors import PartialAdminError
from sievekv_proto import sievekv_pb2 as pb
from sievekv_proto import sievekv_pb2_grpc as pbg

from .test_cli_e2e import cli_env_cleared  # noqa: F401 (a fixture, used by pytestmark)
from .test_cli_e2e import sievekv, two_shard_cluster

SMALL = dict(memtable_bytes=32 << 10, target_file_size=32 << 10, max_bytes_for_level_base=128 << 10)


def _fill(db, n=6000, seed=0) -> dict:
    """Puts over a key space with overwrites and deletes, through several flushes and
    compactions; the model of what the DB holds."""
    import random
    rng = random.Random(seed)
    model = {}
    for i in range(n):
        k = b"k%05d" % rng.randrange(n // 2)
        if i % 7 == 0:
            db.delete(k)
            model.pop(k, None)
        else:
            v = b"v%d-" % i + bytes(rng.randrange(256) for _ in range(30))
            db.put(k, v)
            model[k] = v
    return model


def _content(path, **opts) -> dict:
    with DB.open(str(path), **opts) as db:
        return dict(db.scan())


def test_a_checkpoint_opens_with_every_acknowledged_write_and_is_independent(tmp_path):
    db = DB.open(str(tmp_path / "db"), **SMALL)
    try:
        model = _fill(db)
        db.put(b"in-memtable", b"x")  # not flushed yet: the checkpoint flushes it
        model[b"in-memtable"] = b"x"
        r = db.checkpoint(tmp_path / "ck")
        assert r["path"] == str(tmp_path / "ck")
        tables = [n for n in os.listdir(tmp_path / "ck") if n.endswith(".sst")]
        assert r["tables"] == len(tables) >= 2  # (the count depends on compaction's progress)
        assert r["linked"] == r["tables"] and r["copied"] == 0
        assert r["bytes"] == sum(os.path.getsize(tmp_path / "ck" / n)
                                 for n in os.listdir(tmp_path / "ck") if n.endswith(".sst"))
        assert not os.path.exists(str(tmp_path / "ck") + STAGING_SUFFIX)
        assert STAGING_MARKER not in os.listdir(tmp_path / "ck")
        assert not [n for n in os.listdir(tmp_path / "ck") if n.endswith(".log")]
        # The source goes on: new writes and a full compaction (which deletes every table the
        # checkpoint linked) change nothing in the checkpoint.
        db.put(b"after", b"1")
        db.delete(next(iter(model)))
        db.compact()
    finally:
        db.close()
    assert _content(tmp_path / "ck") == model
    # The checkpoint is a DB of its own: writable, reopenable, with sequence numbers above
    # every entry it holds (a new write wins over the checkpointed value of its key).
    key = next(iter(model))
    with DB.open(str(tmp_path / "ck"), **SMALL) as ck:
        ck.put(key, b"newer")
        ck.compact()
        assert ck.get(key) == b"newer"
    model[key] = b"newer"
    assert _content(tmp_path / "ck") == model
    assert _content(tmp_path / "db")[b"after"] == b"1"  # and the source has its own


def test_a_checkpoint_taken_during_writes_is_a_consistent_prefix(tmp_path):
    """A writer puts z000000, z000001, ... in order while the checkpoint runs: the checkpoint
    holds a contiguous prefix of them (no later write without every earlier one), and every
    key written before the call."""
    db = DB.open(str(tmp_path / "db"), **SMALL)
    stop = threading.Event()
    written = []

    def writer():
        i = 0
        while not stop.is_set():
            db.put(b"z%06d" % i, b"w" * 40)
            written.append(i)
            i += 1

    try:
        model = _fill(db, 3000)
        t = threading.Thread(target=writer)
        t.start()
        try:
            while len(written) < 200:
                stop.wait(0.01)
            before = len(written)
            db.checkpoint(tmp_path / "ck")
        finally:
            stop.set()
            t.join()
    finally:
        db.close()
    got = _content(tmp_path / "ck")
    zs = sorted(int(k[1:]) for k in got if k.startswith(b"z"))
    assert zs == list(range(len(zs))) and len(zs) >= before
    assert {k: v for k, v in got.items() if not k.startswith(b"z")} == model


def test_bad_destinations_are_refused_and_nothing_is_written(tmp_path):
    db = DB.open(str(tmp_path / "db"), **SMALL)
    try:
        _fill(db, 500)
        (tmp_path / "taken").mkdir()
        with pytest.raises(AlreadyExistsError, match="already exists"):
            db.checkpoint(tmp_path / "taken")
        with pytest.raises(InvalidArgumentError, match="parent .* does not exist"):
            db.checkpoint(tmp_path / "no" / "such" / "ck")
        (tmp_path / "file").write_text("x")
        with pytest.raises(InvalidArgumentError, match="parent .*file is not a directory"):
            db.checkpoint(tmp_path / "file" / "ck")
        (tmp_path / "file").unlink()
        assert not (tmp_path / "no").exists()
        with pytest.raises(InvalidArgumentError, match="inside the DB's directory"):
            db.checkpoint(tmp_path / "db" / "ck")
        with pytest.raises(InvalidArgumentError, match="inside the DB's directory"):
            db.checkpoint(tmp_path / "db" / "new" / "ck", create_parents=True)
        assert not (tmp_path / "db" / "new").exists()
        for bad in ("", b"/tmp/x", 7, None):
            with pytest.raises(InvalidArgumentError, match="must be a path"):
                db.checkpoint(bad)
        assert sorted(os.listdir(tmp_path)) == ["db", "taken"]
        # create_parents makes the missing directories.
        r = db.checkpoint(tmp_path / "no" / "such" / "ck", create_parents=True)
        assert r["tables"] >= 1 and os.path.isdir(tmp_path / "no" / "such" / "ck")
    finally:
        db.close()
    with pytest.raises(ClosedError):
        db.checkpoint(tmp_path / "later")
    assert not (tmp_path / "later").exists()


def test_a_leftover_staging_directory_is_cleared_but_foreign_files_are_never_deleted(tmp_path):
    db = DB.open(str(tmp_path / "db"), **SMALL)
    try:
        model = _fill(db, 800)
        staging = str(tmp_path / "ck") + STAGING_SUFFIX
        os.mkdir(staging)  # what a crash between link and rename leaves behind
        for name in ("000007.sst", "MANIFEST-000009", "CURRENT", STAGING_MARKER):
            with open(os.path.join(staging, name), "wb") as f:
                f.write(b"partial")
        db.checkpoint(tmp_path / "ck")
        assert not os.path.exists(staging)
        # A directory at the staging path without the marker is not a checkpoint's: refused,
        # nothing in it deleted (it may be a user's directory, a DB, a finished checkpoint).
        os.mkdir(str(tmp_path / "ck2") + STAGING_SUFFIX)
        with open(os.path.join(str(tmp_path / "ck2") + STAGING_SUFFIX, "notes.txt"), "w") as f:
            f.write("mine")
        with pytest.raises(InvalidArgumentError, match="not a checkpoint's staging directory"):
            db.checkpoint(tmp_path / "ck2")
        assert os.path.exists(os.path.join(str(tmp_path / "ck2") + STAGING_SUFFIX, "notes.txt"))
        assert not (tmp_path / "ck2").exists()
    finally:
        db.close()
    assert _content(tmp_path / "ck") == model


class _NoLinks(FileSystem):
    """A file system where hard links fail with ``err`` (EXDEV: another file system) after
    ``ok`` successful ones."""

    def __init__(self, err, ok=0):
        super().__init__()
        self.err, self.ok = err, ok

    def link(self, src, dst):
        if self.ok > 0:
            self.ok -= 1
            return super().link(src, dst)
        raise StorageIOError("link failed (injected)", path=src, errno_=self.err)


def test_tables_are_copied_where_the_file_system_refuses_links(tmp_path):
    fs = _NoLinks(errno.EXDEV, ok=2)
    # (no compactions: a linked table whose source a compaction deleted has one link too)
    db = DB.open(str(tmp_path / "db"), fs=fs, disable_auto_compactions=True, **SMALL)
    try:
        model = _fill(db)
        r = db.checkpoint(tmp_path / "ck")
        assert r["linked"] == 2 and r["copied"] == r["tables"] - 2 > 0
        # copies are files of their own (one link), with the source's bytes
        copies = [n for n in os.listdir(tmp_path / "ck")
                  if n.endswith(".sst") and os.stat(tmp_path / "ck" / n).st_nlink == 1]
        assert len(copies) == r["copied"]
    finally:
        db.close()
    # every checksum of every copied block holds (no compaction first: it would rewrite them)
    with DB.open(str(tmp_path / "ck"), disable_auto_compactions=True) as ck:
        report = ck.verify()
    assert report["tables"] == r["tables"] and report["damaged"] == []
    assert _content(tmp_path / "ck") == model


def test_a_failed_checkpoint_leaves_nothing_and_the_db_goes_on(tmp_path):
    fs = _NoLinks(errno.EIO, ok=1)  # EIO is not "links unsupported": the call fails
    db = DB.open(str(tmp_path / "db"), fs=fs, **SMALL)
    try:
        model = _fill(db)
        with pytest.raises(StorageIOError, match="link failed"):
            db.checkpoint(tmp_path / "ck")
        assert sorted(os.listdir(tmp_path)) == ["db"]
        db.put(b"still", b"writable")
        model[b"still"] = b"writable"
        fs.err = errno.EXDEV
        db.checkpoint(tmp_path / "ck")
    finally:
        db.close()
    assert _content(tmp_path / "ck") == model == _content(tmp_path / "db")


# -- a real cluster ---------------------------------------------------------------------------

pytestmark = pytest.mark.usefixtures("cli_env_cleared")
cluster = two_shard_cluster("checkpoint")


def test_checkpoint_of_a_cluster_through_the_router(cluster, tmp_path):
    cfg = ["--config", cluster["conf"]]
    model = {b"key%05d" % i: b"v%d" % i for i in range(3000)}
    with Client(cluster["router"]) as c:
        c.write(list(model.items()))
        c.delete(b"key00007")
        del model[b"key00007"]
        results = c.checkpoint(str(tmp_path / "ck1"))
        assert sorted(r.shard for r in results) == ["shard-0", "shard-1"]
        assert all(r.ok and r.report["path"] == str(tmp_path / "ck1" / r.shard)
                   for r in results)
        # The same directory again: every shard refuses with ALREADY_EXISTS, nothing changes.
        with pytest.raises(PartialAdminError) as e:
            c.checkpoint(str(tmp_path / "ck1"))
        assert e.value.code == grpc.StatusCode.ALREADY_EXISTS
        assert all(s.code == grpc.StatusCode.ALREADY_EXISTS for s in e.value.sections)
    # A relative directory sent as it is: INVALID_ARGUMENT from the router and from a shard.
    with grpc.insecure_channel(cluster["router"]) as ch:
        with pytest.raises(grpc.RpcError) as e:
            pbg.AdminStub(ch).Checkpoint(pb.CheckpointRequest(dir="rel/ck"), timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "absolute" in e.value.details()

    r = sievekv("checkpoint", str(tmp_path / "ck2"), *cfg)
    assert r.returncode == 0, r.stderr
    lines = sorted(r.stdout.splitlines())
    assert len(lines) == 2 and all(" linked, 0 copied) in " in x for x in lines), lines
    assert lines[0].startswith(f"shard-0    {tmp_path / 'ck2' / 'shard-0'}: ")
    r = sievekv("checkpoint", str(tmp_path / "ck2"), *cfg)
    assert r.returncode == 6, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith("sievekv: error: checkpoint: 2 of 2 shards' directories")
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr

    # Each shard's checkpoint opens as a data directory; together they hold the model.
    for ck in ("ck1", "ck2"):
        got = {}
        for shard in ("shard-0", "shard-1"):
            got.update(_content(tmp_path / ck / shard))
        assert got == model


class _GatedTables(FileSystem):
    """Creating the n-th table file (n = 1, 2, ...) waits for ``gates[n]`` if there is one;
    ``opened[n]`` is set when it is reached."""

    def __init__(self, gates):
        super().__init__()
        self.gates = gates
        self.opened = {n: threading.Event() for n in gates}
        self.n = 0

    def open_writable(self, path):
        if path.endswith(".sst"):
            self.n += 1
            if self.n in self.gates:
                self.opened[self.n].set()
                assert self.gates[self.n].wait(60)
        return super().open_writable(path)


def test_flush_waits_for_its_own_memtable_not_for_ones_frozen_after_it(tmp_path):
    """Found writing checkpoint (which flushes first): flush() waited until *no* memtable was
    frozen, so under a steady stream of writes it could wait for ever (a checkpoint beside one
    writer thread took 12 s). Here the memtable a flush froze (M1) is held until a writer has
    frozen the next one (M2), whose table is then held until the end: the flush must return
    once M1 is in L0."""
    go1, go2 = threading.Event(), threading.Event()
    fs = _GatedTables({1: go1, 2: go2})
    db = DB.open(str(tmp_path / "db"), fs=fs, table_workers=0, disable_auto_compactions=True,
                 memtable_bytes=16 << 10)
    flusher = None
    try:
        db.put(b"a", b"1")
        flusher = threading.Thread(target=db.flush)
        flusher.start()
        assert fs.opened[1].wait(60)  # M1 frozen by the flush, its table being written
        i = 0
        while db.stats()["memtable"]["frozen"] < 2:  # a writer freezes M2
            db.put(b"b%06d" % i, b"x" * 100)
            i += 1
        go1.set()
        flusher.join(30)
        assert not flusher.is_alive(), "flush() waited for a memtable frozen after its own"
        assert fs.opened[2].wait(60)  # M2's flush is still held: the flush did not wait for it
    finally:
        go1.set()
        go2.set()
        if flusher is not None:
            flusher.join(60)
        db.close()


class _SlowCopies(_NoLinks):
    """No hard links; each 1 MiB chunk the thread named "checkpoint" reads for a copy waits
    for ``step`` (so the test can see the progress between chunks; a background compaction's
    reads are not held)."""

    def __init__(self):
        super().__init__(errno.EXDEV)
        self.step = threading.Semaphore(0)

    def open_readable(self, path):
        f = super().open_readable(path)
        if path.endswith(".sst") and threading.current_thread().name == "checkpoint":
            read_at = f.read_at

            def slow(offset, n):
                assert self.step.acquire(timeout=60)
                return read_at(offset, n)
            f.read_at = slow
        return f


def test_a_checkpoint_that_copies_shows_its_progress_in_stats(tmp_path):
    fs = _SlowCopies()
    db = DB.open(str(tmp_path / "db"), fs=fs, **SMALL)
    try:
        model = _fill(db, 3000)
        db.flush()
        assert db.stats()["checkpoint_running"] is None
        result = {}
        t = threading.Thread(target=lambda: result.update(db.checkpoint(tmp_path / "ck")),
                             name="checkpoint")
        t.start()
        try:
            fs.step.release()  # the first table's only chunk
            seen = None
            for _ in range(600):
                run = db.stats()["checkpoint_running"]
                if run and run["tables_done"] >= 1:
                    seen = run
                    break
                t.join(0.05)
            assert seen is not None and seen["tables"] > 1
            assert 0 < seen["bytes_done"] < seen["bytes"] and seen["tables_done"] < seen["tables"]
        finally:
            for _ in range(10000):
                fs.step.release()
            t.join(60)
        assert result["copied"] == result["tables"] and db.stats()["checkpoint_running"] is None
    finally:
        db.close()
    assert _content(tmp_path / "ck") == model


def test_cli_exit_codes_for_a_path_no_shard_can_use(cluster, tmp_path):
    cfg = ["--config", cluster["conf"]]
    (tmp_path / "a-file").write_text("x")
    for bad in (tmp_path / "a-file" / "ck", "/proc/sievekv-ck"):
        r = sievekv("checkpoint", str(bad), *cfg)
        assert r.returncode == 2, (bad, r.returncode, r.stdout, r.stderr)
        assert r.stdout.count("FAILED: INVALID_ARGUMENT: ") == 2, r.stdout
        assert r.stderr == f"sievekv: error: checkpoint: no shard can use {bad} (see above)\n"
