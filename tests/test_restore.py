"""``sievekv cluster restore CHECKPOINT_DIR`` (router/cli/restore_cmd.py, router/restore_journal.py,
engine/db_copy.py): a checkpoint put back in place of a stopped local cluster's data.

The first test runs a real cluster (supervisor, shards and router on 127.0.0.1, stopped by the
``lab`` finalizer, even on failure). The others build checkpoints with the engine directly
(keys split by the config's slot ranges, as the router splits them) and run the real CLI on
them, so they start no server except where ``cluster start`` must refuse.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import textwrap

import pytest

from engine import DB
from engine.db_copy import copy_db
from engine.vfs import FileSystem
from router import preflight
from router import restore_journal as rj
from router.cli import app
from router.client import Client
from router.config import even_slot_ranges, load
from router.slots import slot_of

from .test_cli_e2e import cli_env_cleared  # noqa: F401 (a fixture, used by pytestmark)
from .test_cli_e2e import clean_cli_env, sievekv
from .test_review_lifecycle import conf_text, lab, one_error_line  # noqa: F401 (lab: fixture)

pytestmark = pytest.mark.usefixtures("cli_env_cleared")

SMALL = dict(memtable_bytes=16 << 10, target_file_size=16 << 10)


def tree(data_dir: str) -> dict:
    """Every path under ``data_dir`` with (inode, size, mtime): equal trees = nothing changed."""
    out = {}
    for root, dirs, files in os.walk(data_dir):
        for n in dirs + files:
            p = os.path.join(root, n)
            st = os.lstat(p)
            out[os.path.relpath(p, data_dir)] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def staging_left(data_dir: str) -> list[str]:
    return [n for n in os.listdir(data_dir) if n.endswith(rj.STAGING_SUFFIX)]


def content(data_dir: str, shards: int) -> dict:
    """Every key of every shard directory (opened with the engine: nothing running)."""
    got = {}
    for i in range(shards):
        path = os.path.join(data_dir, f"shard-{i}")
        if not os.path.exists(path):
            continue
        with DB.open(path, create_if_missing=False) as db:
            got.update(db.scan())
    return got


def make_checkpoint(base, ranges, model: dict, work) -> None:
    """``base/shard-i`` for each slot range: a checkpoint (DB.checkpoint) of a DB holding the
    keys of ``model`` whose slot is in that range."""
    os.makedirs(base)
    for i, (lo, hi) in enumerate(ranges):
        src = os.path.join(work, f"{os.path.basename(base)}-src-{i}")
        with DB.open(src, **SMALL) as db:
            for k, v in model.items():
                if lo <= slot_of(k) <= hi:
                    db.put(k, v)
            db.checkpoint(os.path.join(base, f"shard-{i}"))


def model_of(n: int, tag: str, seed: int = 0) -> dict:
    rng = random.Random(seed)
    return {b"key%05d" % i: f"{tag}{i}-".encode() + bytes(rng.randrange(256) for _ in range(40))
            for i in range(n)}


class Offline:
    """A 2-shard config in ``root`` and the CLI bound to it; nothing is started."""

    def __init__(self, root, text: str | None = None):
        self.root = str(root)
        self.conf = os.path.join(self.root, "cluster.toml")
        with open(self.conf, "w") as f:
            f.write(text or conf_text(shards=2))
        self.data_dir = os.path.join(self.root, "data")

    def cli(self, *argv, **kw):
        return sievekv(*argv, "--config", self.conf, **kw)

    def restore(self, *argv, **kw):
        return self.cli("cluster", "restore", *argv, **kw)


# ---------------------------------------------------------------------------------------------
# a real cluster
# ---------------------------------------------------------------------------------------------

def test_restore_brings_back_the_checkpoint_state_and_keeps_the_old_data(lab, tmp_path):
    c = lab(conf_text(shards=2, shard_opts='[engine]\nmemtable_bytes = "32KiB"'))
    c.start()
    at_checkpoint = model_of(1500, "v")
    router = c.state()["router_address"]
    with Client(router) as cl:
        cl.write(list(at_checkpoint.items()))
    r = c.cli("checkpoint", str(tmp_path / "ck"), "--quiet")
    assert r.returncode == 0, r.stderr
    after = dict(at_checkpoint)
    with Client(router) as cl:
        changed = {b"key%05d" % i: b"overwritten" for i in range(0, 1500, 7)}
        cl.write(list(changed.items()))
        after.update(changed)
        for i in range(3, 1500, 11):
            cl.delete(b"key%05d" % i)
            after.pop(b"key%05d" % i, None)
        added = {b"new%04d" % i: b"added" for i in range(300)}
        cl.write(list(added.items()))
        after.update(added)

    # Running: refused, nothing changed.
    r = c.cli("cluster", "restore", str(tmp_path / "ck"))
    assert r.returncode == 6, (r.returncode, r.stdout, r.stderr)
    assert one_error_line(r.stderr) and "locked by a running cluster" in r.stderr
    assert not staging_left(c.data_dir)
    assert not [n for n in os.listdir(c.data_dir) if n.startswith(rj.BACKUP_PREFIX)]
    with Client(router) as cl:
        assert dict(cl.scan()) == after

    r = c.cli("cluster", "stop")
    assert r.returncode == 0, r.stderr
    r = c.cli("cluster", "restore", str(tmp_path / "ck"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    backups = [n for n in os.listdir(c.data_dir) if n.startswith(rj.BACKUP_PREFIX)]
    assert len(backups) == 1
    backup = os.path.join(c.data_dir, backups[0])
    assert sorted(os.listdir(backup)) == ["shard-0", "shard-1"]
    for i in (0, 1):
        assert lines[i].startswith(f"shard-{i}    ") and ", verified); old data in " in lines[i]
        assert lines[i].endswith(os.path.join(backup, f"shard-{i}"))
    assert lines[2].startswith(f"restored 2 shards from {tmp_path / 'ck'} into {c.data_dir}")
    assert lines[2].endswith(f"next: sievekv cluster start --config {c.conf}")
    assert "verifying shard-1: intact" in r.stderr
    assert not staging_left(c.data_dir)
    assert not os.path.exists(rj.journal_path(c.data_dir))

    c.start()
    with Client(c.state()["router_address"]) as cl:
        assert dict(cl.scan()) == at_checkpoint  # across both shards
    r = c.cli("cluster", "stop")
    assert r.returncode == 0, r.stderr

    # The old data can be put back by hand.
    for i in (0, 1):
        shard = os.path.join(c.data_dir, f"shard-{i}")
        os.rename(shard, str(tmp_path / f"restored-{i}"))
        os.rename(os.path.join(backup, f"shard-{i}"), shard)
    c.start()
    with Client(c.state()["router_address"]) as cl:
        assert dict(cl.scan()) == after


# ---------------------------------------------------------------------------------------------
# refusals (no server)
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def restored_template(tmp_path_factory):
    """What ``restored`` starts from, made once per module: an Offline 2-shard setup (in a
    directory of its own) whose data directory holds checkpoint ``ck``, restored by the CLI."""
    root = tmp_path_factory.mktemp("restored")
    o = Offline(root)
    model = model_of(800, "old")
    make_checkpoint(str(root / "ck"), even_slot_ranges(2), model, str(root))
    with pytest.MonkeyPatch.context() as mp:
        clean_cli_env(mp)
        r = o.restore(str(root / "ck"), "--quiet")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # --quiet
    assert content(o.data_dir, 2) == model
    return root, model


@pytest.fixture
def restored(restored_template, tmp_path):
    """An Offline 2-shard setup in ``tmp_path`` whose data directory holds checkpoint
    ``tmp_path/ck`` (restored), and the model of it: a copy of ``restored_template`` (the
    config, the checkpoint and the data directory), each test's own."""
    root, model = restored_template
    for name in os.listdir(root):
        src = os.path.join(root, name)
        if os.path.isdir(src):
            shutil.copytree(src, tmp_path / name, symlinks=True)
        else:
            shutil.copy2(src, tmp_path / name)
    return Offline(tmp_path), model


def _refused(o: Offline, ck: str, code: int, words: str, *extra) -> None:
    before = tree(o.data_dir)
    r = o.restore(ck, *extra)
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert one_error_line(r.stderr), r.stderr
    assert words in r.stderr, r.stderr
    assert r.stdout == ""
    assert tree(o.data_dir) == before
    assert not staging_left(o.data_dir)


def test_checkpoints_that_do_not_match_the_config_are_refused_and_nothing_changes(restored,
                                                                                  tmp_path):
    o, model = restored
    good = str(tmp_path / "ck")

    def variant(name: str) -> str:
        path = str(tmp_path / name)
        shutil.copytree(good, path)
        return path

    ck = variant("missing")
    shutil.rmtree(os.path.join(ck, "shard-1"))
    _refused(o, ck, 2, f"checkpoint {ck} has no shard-1")

    ck = variant("extra")
    shutil.copytree(os.path.join(ck, "shard-1"), os.path.join(ck, "shard-2"))
    _refused(o, ck, 2, f"{ck}/shard-2 is not a shard of this config")

    ck = variant("staging")
    os.makedirs(os.path.join(ck, "shard-1.checkpoint-tmp"))
    _refused(o, ck, 2, "unfinished checkpoint's staging directory")

    ck = variant("nocurrent")
    os.remove(os.path.join(ck, "shard-0", "CURRENT"))
    _refused(o, ck, 2, "checkpoint shard-0 is incomplete")

    ck = variant("notable")
    victim = sorted(n for n in os.listdir(os.path.join(ck, "shard-1")) if n.endswith(".sst"))[0]
    os.remove(os.path.join(ck, "shard-1", victim))
    _refused(o, ck, 2, f"checkpoint shard-1 is incomplete: {ck}/shard-1/{victim}")

    # A data directory (a write-ahead log with writes in it) is not a checkpoint.
    ck = variant("datadir")
    with DB.open(os.path.join(ck, "shard-1")) as db:
        db.put(b"unflushed", b"x")
    _refused(o, ck, 2, f"{ck}/shard-1 is a data directory, not a checkpoint")

    # 4 shards restored into 2, and a 2-shard checkpoint with its shards exchanged.
    four = str(tmp_path / "four")
    make_checkpoint(four, even_slot_ranges(4), model, str(tmp_path))
    _refused(o, four, 2, "is not a shard of this config")
    ck = variant("swapped")
    os.rename(os.path.join(ck, "shard-0"), os.path.join(ck, "tmp"))
    os.rename(os.path.join(ck, "shard-1"), os.path.join(ck, "shard-0"))
    os.rename(os.path.join(ck, "tmp"), os.path.join(ck, "shard-1"))
    r = o.restore(ck)
    assert r.returncode == 2 and one_error_line(r.stderr)
    assert "checkpoint shard-0 holds key slot " in r.stderr
    assert ("which this config gives to shard-1: restore needs the slot layout the checkpoint "
            "was taken with") in r.stderr

    # The 2-shard checkpoint into a 2-shard config with other slot ranges.
    os.makedirs(tmp_path / "other")
    other = Offline(tmp_path / "other", textwrap.dedent("""
        [cluster]
        data_dir = "data"
        [shards]
        count = 2
        [[shard]]
        slots = [0, 99]
        [[shard]]
        slots = [100, 16383]
    """))
    r = other.restore(good)
    assert r.returncode == 2 and one_error_line(r.stderr), r.stderr
    assert "holds key slot " in r.stderr and "which this config gives to shard-1" in r.stderr
    assert not os.path.exists(os.path.join(other.data_dir, "shard-0"))
    # ... and that config pointed at the data directory made with the even layout.
    r = other.restore(good, "--data-dir", o.data_dir)
    assert r.returncode == 2 and "was created with slot ranges 0-8191,8192-16383" in r.stderr

    assert content(o.data_dir, 2) == model


def test_a_shard_directory_open_in_another_process_is_a_conflict(restored, tmp_path):
    o, model = restored
    # The holder runs no compactions: one started by its open (L0 at its trigger) would change
    # the tree that _refused checks is left alone (a clean-clone CI run saw exactly that).
    with DB.open(os.path.join(o.data_dir, "shard-1"), create_if_missing=False,
                 disable_auto_compactions=True):
        _refused(o, str(tmp_path / "ck"), 6, "shard-1's data directory is open in another")


def test_a_damaged_checkpoint_table_refuses_the_whole_restore(restored, tmp_path):
    o, model = restored
    ck = str(tmp_path / "damaged")
    make_checkpoint(ck, even_slot_ranges(2), model_of(800, "new"), str(tmp_path))
    shard = os.path.join(ck, "shard-1")
    table = max((n for n in os.listdir(shard) if n.endswith(".sst")),
                key=lambda n: os.path.getsize(os.path.join(shard, n)))
    path = os.path.join(shard, table)
    with open(path, "r+b") as f:  # a byte of the first data block
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0x40]))
    _refused(o, ck, 1, f"checkpoint shard-1: table {table} is damaged: corruption in {path} ")
    assert content(o.data_dir, 2) == model


# ---------------------------------------------------------------------------------------------
# an interrupted restore
# ---------------------------------------------------------------------------------------------

def _interrupted(o: Offline, ck: str, renames: int) -> dict:
    """Stage ``ck`` and write the journal as ``cluster restore`` does, then do only the first
    ``renames`` of its directory renames: a crash at that point. Returns the journal."""
    fs = FileSystem()
    backup = os.path.join(o.data_dir, rj.BACKUP_PREFIX + "20260101T000000Z")
    entries = []
    for i in (0, 1):
        data = os.path.join(o.data_dir, f"shard-{i}")
        e = {"name": f"shard-{i}", "data": data, "staged": data + rj.STAGING_SUFFIX,
             "backup": os.path.join(backup, f"shard-{i}"), "had_data": os.path.exists(data)}
        copy_db(fs, os.path.join(ck, f"shard-{i}"), e["staged"])
        entries.append(e)
    doc = {"checkpoint": ck, "backup": backup, "started_at": "2026-01-01T00:00:00Z",
           "shards": entries}
    rj.write(o.data_dir, doc)
    os.makedirs(backup)
    steps = []
    for e in entries:
        if e["had_data"]:
            steps.append((e["data"], e["backup"]))
        steps.append((e["staged"], e["data"]))
    for src, dst in steps[:renames]:
        os.rename(src, dst)
    return doc


def test_an_interrupted_restore_is_detected_by_start_and_restore(restored, tmp_path, lab):
    o, old = restored
    ck = str(tmp_path / "new")
    make_checkpoint(ck, even_slot_ranges(2), model_of(500, "new", seed=1), str(tmp_path))
    _interrupted(o, ck, renames=2)  # shard-0 swapped, shard-1 not: a mix
    c = lab(open(o.conf).read())  # the same config and data directory
    assert c.data_dir == o.data_dir
    r = c.cli("cluster", "start")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert one_error_line(r.stderr)
    assert "holds an interrupted restore from " + ck in r.stderr
    assert "`sievekv cluster restore --finish`" in r.stderr
    assert "`sievekv cluster restore --undo`" in r.stderr
    before = tree(o.data_dir)
    r = o.restore(ck)
    assert r.returncode == 2 and one_error_line(r.stderr) and "--undo" in r.stderr
    assert tree(o.data_dir) == before
    r = o.restore(ck, "--finish")
    assert r.returncode == 2 and "take no CHECKPOINT_DIR" in r.stderr


@pytest.mark.parametrize("how", ["finish", "undo"])
def test_an_interrupted_restore_is_settled_from_every_crash_point(restored, tmp_path, how,
                                                                  capsys):
    o, old = restored
    new = model_of(500, "new", seed=1)
    ck = str(tmp_path / "new")
    make_checkpoint(ck, even_slot_ranges(2), new, str(tmp_path))
    os.makedirs(tmp_path / "keep")
    shutil.copytree(o.data_dir, tmp_path / "keep" / "data", symlinks=True)
    for renames in range(5):  # 2 shards x (old aside, staged in)
        shutil.rmtree(o.data_dir)
        shutil.copytree(tmp_path / "keep" / "data", o.data_dir, symlinks=True)
        doc = _interrupted(o, ck, renames)
        code = app.main(["cluster", "restore", f"--{how}", "--config", o.conf])
        out = capsys.readouterr()
        assert code == 0, (renames, out.err)
        assert not os.path.exists(rj.journal_path(o.data_dir))
        assert not staging_left(o.data_dir)
        preflight.check_no_restore(load(o.conf))  # a start would go on
        if how == "finish":
            assert content(o.data_dir, 2) == new, renames
            assert content(doc["backup"], 2) == old, renames
            assert "the restore from " + ck + " is finished" in out.out
        else:
            assert content(o.data_dir, 2) == old, renames
            assert not os.path.exists(doc["backup"])
            assert "is undone" in out.out
        # Nothing left to settle.
        assert app.main(["cluster", "restore", f"--{how}", "--config", o.conf]) == 2
        assert "holds no interrupted restore" in capsys.readouterr().err


def test_restore_into_a_new_data_directory_records_the_layout(tmp_path):
    o = Offline(tmp_path)
    model = model_of(300, "v")
    make_checkpoint(str(tmp_path / "ck"), even_slot_ranges(2), model, str(tmp_path))
    r = o.restore(str(tmp_path / "ck"), "--no-verify")
    assert r.returncode == 0, r.stderr
    assert "no old data" in r.stdout and "verified" not in r.stdout
    assert "verifying" not in r.stderr
    assert not [n for n in os.listdir(o.data_dir) if n.startswith(rj.BACKUP_PREFIX)]
    with open(os.path.join(o.data_dir, "cluster-layout.json")) as f:
        assert json.load(f) == {"slots": [[0, 8191], [8192, 16383]]}
    assert content(o.data_dir, 2) == model
    # The checkpoint is untouched: its manifest was copied, not linked.
    for i in (0, 1):
        names = os.listdir(tmp_path / "ck" / f"shard-{i}")
        assert not [n for n in names if n.endswith(".log")]
        man = [n for n in names if n.startswith("MANIFEST-")]
        assert len(man) == 1 and os.stat(tmp_path / "ck" / f"shard-{i}" / man[0]).st_nlink == 1


# ---------------------------------------------------------------------------------------------
# engine/db_copy.py
# ---------------------------------------------------------------------------------------------

def test_copy_db_copies_tables_where_links_are_refused_and_never_shares_the_manifest(tmp_path):
    import errno

    from engine.db_copy import IncompleteError, describe
    from engine.errors import StorageIOError

    class NoLinks(FileSystem):
        def __init__(self, ok: int):
            super().__init__()
            self.ok = ok

        def link(self, src, dst):
            if self.ok > 0:
                self.ok -= 1
                return super().link(src, dst)
            raise StorageIOError("link failed (injected)", path=src, errno_=errno.EXDEV)

    model = model_of(3000, "v")
    with DB.open(str(tmp_path / "db"), **SMALL) as db:
        for k, v in model.items():
            db.put(k, v)
        db.checkpoint(str(tmp_path / "ck"))
    files = describe(FileSystem(), str(tmp_path / "ck"))
    assert len(files.tables) > 2
    r = copy_db(NoLinks(ok=1), str(tmp_path / "ck"), str(tmp_path / "copy"))
    assert r == {"tables": len(files.tables), "bytes": files.bytes, "linked": 1,
                 "copied": len(files.tables) - 1}
    for name in os.listdir(tmp_path / "copy"):  # the manifest and CURRENT: files of their own
        if not name.endswith(".sst"):
            assert os.stat(tmp_path / "copy" / name).st_nlink == 1, name
    with DB.open(str(tmp_path / "copy"), create_if_missing=False) as db:
        assert db.verify()["damaged"] == []
        assert dict(db.scan()) == model
    # A table the manifest lists, cut short: incomplete.
    victim = filenames_of(tmp_path / "ck")[0]
    with open(victim, "r+b") as f:
        f.truncate(10)
    with pytest.raises(IncompleteError, match="is 10 bytes"):
        describe(FileSystem(), str(tmp_path / "ck"))


def filenames_of(path) -> list[str]:
    return sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".sst"))


# ---------------------------------------------------------------------------------------------
# faults injected into the command (in-process)
# ---------------------------------------------------------------------------------------------

def test_ctrl_c_while_staging_restores_nothing_and_leaves_no_staging(restored, tmp_path,
                                                                     monkeypatch, capsys):
    from router.cli import restore_cmd

    o, old = restored
    ck = str(tmp_path / "new")
    make_checkpoint(ck, even_slot_ranges(2), model_of(500, "new", seed=1), str(tmp_path))
    real = restore_cmd.copy_db

    def interrupted(fs, src, dest, *a, **kw):
        if src.endswith("shard-1"):
            raise KeyboardInterrupt
        return real(fs, src, dest, *a, **kw)

    monkeypatch.setattr(restore_cmd, "copy_db", interrupted)
    before = tree(o.data_dir)
    assert app.main(["cluster", "restore", ck, "--config", o.conf]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == "sievekv: error: interrupted"
    assert tree(o.data_dir) == before and not staging_left(o.data_dir)
    assert content(o.data_dir, 2) == old


def _restore_failing_at_the_second_swap(o, tmp_path, monkeypatch, *args):
    """Run a restore of a new 500-key checkpoint into ``o`` whose swap of shard-1 fails with an
    injected EIO; return the new model and the checkpoint. The injection is undone before
    returning."""
    from router.cli import restore_cmd

    new = model_of(500, "new", seed=1)
    ck = str(tmp_path / "new")
    make_checkpoint(ck, even_slot_ranges(2), new, str(tmp_path))
    real = rj.finish_shard

    def failing(entry, fs=None, op="restore"):
        if entry["name"] == "shard-1":
            raise OSError(5, "Input/output error (injected)")
        return real(entry, fs, op)

    monkeypatch.setattr(restore_cmd.rj, "finish_shard", failing)
    assert app.main(["cluster", "restore", ck, *args, "--config", o.conf]) == 1
    monkeypatch.setattr(restore_cmd.rj, "finish_shard", real)
    return new, ck


def test_a_failure_between_the_swaps_keeps_the_journal_and_finish_completes(restored, tmp_path,
                                                                             monkeypatch, capsys):
    o, old = restored
    new, ck = _restore_failing_at_the_second_swap(o, tmp_path, monkeypatch)
    err = capsys.readouterr().err
    assert one_error_line(err) and "restore stopped while swapping directories" in err
    assert "`sievekv cluster restore --finish`" in err
    assert os.path.exists(rj.journal_path(o.data_dir))
    assert app.main(["cluster", "restore", ck, "--config", o.conf]) == 2  # journal: refused
    assert "interrupted restore" in capsys.readouterr().err
    assert app.main(["cluster", "restore", "--finish", "--config", o.conf]) == 0
    out = capsys.readouterr().out
    assert "shard-0    done already" in out and "shard-1    swapped" in out
    assert content(o.data_dir, 2) == new


# ---------------------------------------------------------------------------------------------
# session 9: review fixes without a review test of their own
# ---------------------------------------------------------------------------------------------

def test_a_journal_tmp_left_by_a_crash_is_removed_by_the_next_restore_or_settle(restored,
                                                                               tmp_path):
    o, old = restored
    tmp = rj.tmp_path(o.data_dir)  # SIGKILL before the journal's rename: nothing swapped
    for argv in (["--finish"], ["--undo"]):
        with open(tmp, "w") as f:
            f.write('{"version": 1, "shar')
        r = o.restore(*argv)
        assert r.returncode == 2 and "holds no interrupted restore" in r.stderr, r.stderr
        assert not os.path.exists(tmp)
    with open(tmp, "w") as f:
        f.write('{"version": 1, "shar')
    r = o.restore(str(tmp_path / "ck"), "--quiet")
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(tmp)
    assert content(o.data_dir, 2) == old


def test_a_symlinked_shard_directory_is_refused(restored, tmp_path):
    o, old = restored
    target = str(tmp_path / "elsewhere-shard-0")
    os.rename(os.path.join(o.data_dir, "shard-0"), target)
    os.symlink(target, os.path.join(o.data_dir, "shard-0"))
    _refused(o, str(tmp_path / "ck"), 2, "is a symbolic link")
    assert content(o.data_dir, 2) == old


def test_finish_refuses_once_an_undo_began_and_a_staged_copy_that_is_not_complete(restored,
                                                                                  tmp_path):
    o, old = restored
    ck = str(tmp_path / "new")
    make_checkpoint(ck, even_slot_ranges(2), model_of(500, "new", seed=1), str(tmp_path))
    doc = _interrupted(o, ck, renames=0)  # journal written, nothing swapped
    staged = doc["shards"][1]["staged"]
    table = next(n for n in os.listdir(staged) if n.endswith(".sst"))
    os.remove(os.path.join(staged, table))
    before = tree(o.data_dir)
    r = o.restore("--finish")
    assert r.returncode == 1 and one_error_line(r.stderr), r.stderr
    assert "shard-1" in r.stderr and "not complete" in r.stderr, r.stderr
    assert tree(o.data_dir) == before  # not even shard-0 was swapped
    rj.write(o.data_dir, dict(doc, undo_started="2026-01-01T00:00:01Z"))
    before = tree(o.data_dir)
    r = o.restore("--finish")
    assert r.returncode == 2 and one_error_line(r.stderr) and "--undo" in r.stderr, r.stderr
    assert tree(o.data_dir) == before
    r = o.restore("--undo")
    assert r.returncode == 0, r.stderr
    assert content(o.data_dir, 2) == old
    assert not [n for n in os.listdir(o.data_dir) if n.endswith(rj.DISCARD_SUFFIX)]


def test_a_moved_data_directory_is_settled_in_its_new_place(restored, tmp_path, monkeypatch,
                                                            capsys):
    o, old = restored
    new, _ = _restore_failing_at_the_second_swap(o, tmp_path, monkeypatch, "--quiet")
    capsys.readouterr()
    doc = rj.read(o.data_dir)
    assert not any(os.path.isabs(e[k]) for e in doc["shards"] for k in ("data", "staged"))
    moved = os.path.join(o.root, "moved")
    os.rename(o.data_dir, moved)
    with open(o.conf) as f:
        text = f.read()
    with open(o.conf, "w") as f:
        f.write(text.replace('data_dir = "data"', 'data_dir = "moved"'))
    assert app.main(["cluster", "restore", "--finish", "--config", o.conf]) == 0
    assert "is finished" in capsys.readouterr().out
    assert content(moved, 2) == new
