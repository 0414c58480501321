"""``sievekv cluster reshard`` (router/cli/reshard_cmd.py, router/restore_journal.py): a stopped
local cluster's keys moved to another slot layout, old data kept in ``reshard-backup-*/``.

One test runs a real cluster (supervisor, shards and router on 127.0.0.1, stopped by the
``lab`` finalizer even on failure). The others build data directories with the engine directly
(keys split by slot as the router splits them, the layout recorded as ``cluster start``
records it) and drive the command's functions or the CLI on them; the only servers they start
are the ``cluster start`` calls that must refuse a journal.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import textwrap

import pytest

from engine import DB
from router import preflight
from router import restore_journal as rj
from engine.vfs import FileSystem
from router.cli import app, reshard_cmd
from router.cli.exit_codes import CliError
from router.client import Client
from router.config import loads
from router.slots import slot_of

from .test_cli_e2e import ROOT, cli_env_cleared  # noqa: F401 (a fixture, used by pytestmark)
from .test_cli_e2e import sievekv
from .test_restore import tree  # noqa: F401 (also imported from here by the review tests)
from .test_review_lifecycle import lab, one_error_line  # noqa: F401 (lab: fixture)

pytestmark = pytest.mark.usefixtures("cli_env_cleared")

SMALL = dict(memtable_bytes=16 << 10, target_file_size=16 << 10)


def conf(shards: int, slots=None) -> str:
    """A config of ``shards`` shards (``slots``: their ranges; default even) in ./data."""
    text = textwrap.dedent(f"""
        [cluster]
        data_dir = "data"
        [router]
        listen = "127.0.0.1:0"
        [shards]
        count = {shards}
        base_port = 0
        [engine]
        memtable_bytes = "16KiB"
        target_file_size = "16KiB"
        [supervisor]
        start_timeout = 60.0
        stop_timeout = 10.0
        restart_delay = 0.2
    """)
    for lo, hi in slots or ():
        text += f"[[shard]]\nslots = [{lo}, {hi}]\n"
    return text


def model_of(n: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    return {b"key%05d" % i: b"v%d-" % i + rng.randbytes(rng.randrange(60)) for i in range(n)}


class Setup:
    """A directory with ``cluster.toml`` and ``data/``; configs are written and loaded here."""

    def __init__(self, root):
        self.root = str(root)
        self.conf = os.path.join(self.root, "cluster.toml")
        self.data_dir = os.path.join(self.root, "data")

    def config(self, text: str):
        with open(self.conf, "w") as f:
            f.write(text)
        return loads(text, source=self.conf, base_dir=self.root)

    def build(self, text: str, model: dict, garbage: bool = True):
        """A data directory of config ``text`` holding ``model`` (as a stopped cluster leaves
        it: layout recorded, one DB per shard, some keys overwritten and deleted on the way)."""
        cfg = self.config(text)
        os.makedirs(self.data_dir)
        preflight.check_layout(cfg)
        for s in cfg.shards:
            with DB.open(os.path.join(self.data_dir, s.name), **SMALL) as db:
                mine = [(k, v) for k, v in model.items()
                        if s.slot_start <= slot_of(k) <= s.slot_end]
                if garbage:
                    db.write([(k, b"old") for k, _ in mine[::3]])
                    db.write([(b"gone%04d" % i, b"x") for i in range(40)
                              if s.slot_start <= slot_of(b"gone%04d" % i) <= s.slot_end])
                    db.flush()
                    db.write([(b"gone%04d" % i, None) for i in range(40)])
                for i in range(0, len(mine), 200):
                    db.write(mine[i:i + 200])
        return cfg

    def cli(self, *argv, **kw):
        return sievekv(*argv, "--config", self.conf, **kw)

    def layout(self) -> list:
        with open(os.path.join(self.data_dir, "cluster-layout.json")) as f:
            return json.load(f)["slots"]

    def backups(self) -> list[str]:
        return sorted(n for n in os.listdir(self.data_dir)
                      if n.startswith(rj.RESHARD_BACKUP_PREFIX))

    def left(self) -> list[str]:
        return sorted(n for n in os.listdir(self.data_dir)
                      if n.endswith((rj.RESHARD_STAGING_SUFFIX, rj.DISCARD_SUFFIX)))


def shard_contents(data_dir: str, layout: list) -> dict:
    """Every key of every shard of ``layout``; asserts each shard holds only keys of its slots."""
    got = {}
    for i, (lo, hi) in enumerate(layout):
        with DB.open(os.path.join(data_dir, f"shard-{i}"), create_if_missing=False,
                     table_workers=0) as db:
            for k, v in db.scan():
                assert lo <= slot_of(k) <= hi, (i, k, slot_of(k))
                got[k] = v
    return got


UNEVEN3 = [(0, 2999), (3000, 12999), (13000, 16383)]


# ---------------------------------------------------------------------------------------------
# a real cluster
# ---------------------------------------------------------------------------------------------

def test_reshard_a_real_cluster_2_to_3_then_3_to_1_and_back(lab, tmp_path):
    c = lab(conf(2))
    c.start()
    model = model_of(2000)
    router = c.state()["router_address"]
    with Client(router) as cl:
        cl.write(list(model.items()))
        # Overwrites, then deletes: the first few one call each (Put, Delete), the rest in
        # one Write each (one call per key cost ~1.4 s of this test).
        over = [(b"key%05d" % i, b"overwritten%d" % i) for i in range(0, 2000, 7)]
        for k, v in over[:20]:
            cl.put(k, v)
        cl.write(over[20:])
        model.update(over)
        gone = [b"key%05d" % i for i in range(3, 2000, 11)]
        for k in gone[:20]:
            cl.delete(k)
        cl.write([(k, None) for k in gone[20:]])
        for k in gone:
            model.pop(k, None)

    # Running: refused, nothing changed.
    (tmp_path / "cluster.toml").write_text(conf(3, UNEVEN3))
    r = c.cli("cluster", "reshard")
    assert r.returncode == 6, (r.returncode, r.stdout, r.stderr)
    assert one_error_line(r.stderr) and "locked by a running cluster" in r.stderr
    (tmp_path / "cluster.toml").write_text(conf(2))
    r = c.cli("cluster", "stop")
    assert r.returncode == 0, r.stderr

    (tmp_path / "cluster.toml").write_text(conf(3, UNEVEN3))
    r = c.cli("cluster", "reshard")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("shard-0    0-8191 -> 0-2999: ") and "old data in " in lines[0]
    assert lines[2].startswith("shard-2    new (13000-16383): ")
    assert lines[3].startswith(f"resharded from 2 shards to 3 shards in {c.data_dir}: "
                               f"{len(model):,} keys rewritten")
    assert lines[3].endswith(f"next: sievekv cluster start --config {c.conf}")
    assert "reading shard-1: done, " in r.stderr
    backups = [n for n in os.listdir(c.data_dir) if n.startswith(rj.RESHARD_BACKUP_PREFIX)]
    assert len(backups) == 1
    assert sorted(os.listdir(os.path.join(c.data_dir, backups[0]))) == ["shard-0", "shard-1"]

    c.start()
    with Client(c.state()["router_address"]) as cl:
        keys = sorted(model)
        assert dict(zip(keys, cl.multi_get(keys))) == model
        assert dict(cl.scan()) == model
        assert cl.get(b"key00003") is None
    r = c.cli("cluster", "stop")
    assert r.returncode == 0, r.stderr
    assert shard_contents(c.data_dir, UNEVEN3) == model

    # 3 -> 1 -> 3 (other ranges) without a cluster.
    one = loads(conf(1), source=c.conf, base_dir=str(tmp_path))
    assert reshard_cmd.run(one, quiet=True) == 0
    assert shard_contents(c.data_dir, [(0, 16383)]) == model
    assert not os.path.exists(os.path.join(c.data_dir, "shard-1"))
    three = loads(conf(3), source=c.conf, base_dir=str(tmp_path))
    assert reshard_cmd.run(three, quiet=True) == 0
    layout = [[s.slot_start, s.slot_end] for s in three.shards]
    assert shard_contents(c.data_dir, layout) == model
    with open(os.path.join(c.data_dir, "cluster-layout.json")) as f:
        assert json.load(f) == {"slots": layout}
    assert len([n for n in os.listdir(c.data_dir) if n.startswith(rj.RESHARD_BACKUP_PREFIX)]) >= 2


# ---------------------------------------------------------------------------------------------
# without a cluster
# ---------------------------------------------------------------------------------------------

def test_plan_keeps_shards_whose_range_is_unchanged():
    p = reshard_cmd.plan([(0, 99), (100, 16383)], [(0, 99), (100, 200), (201, 16383)])
    assert [(x.index, x.kind) for x in p] == [(0, "unchanged"), (1, "rewritten"), (2, "new")]
    p = reshard_cmd.plan([(0, 99), (100, 200), (201, 16383)], [(0, 200), (201, 16383)])
    assert [x.kind for x in p] == ["rewritten", "rewritten", "removed"]
    owner = reshard_cmd.owner_index([(0, 99), (100, 200), (201, 16383)])
    assert [owner(s) for s in (0, 99, 100, 200, 201, 16383)] == [0, 0, 1, 1, 2, 2]


def test_unchanged_shard_is_not_touched_and_removed_shard_goes_to_the_backup(tmp_path, capsys):
    s = Setup(tmp_path)
    model = model_of(900, seed=1)
    old = [(0, 4999), (5000, 9999), (10000, 16383)]
    s.build(conf(3, old), model)
    kept = {k: v for k, v in tree(s.data_dir).items() if k.startswith("shard-0")}
    cfg = s.config(conf(2, [(0, 4999), (5000, 16383)]))
    assert reshard_cmd.run(cfg) == 0
    out = capsys.readouterr()
    assert "shard-0    unchanged (0-4999), not read" in out.out
    assert "shard-2    removed (was 10000-16383): " in out.out
    assert "reading shard-2: done, " in out.err
    assert {k: v for k, v in tree(s.data_dir).items() if k.startswith("shard-0")} == kept
    assert not os.path.exists(os.path.join(s.data_dir, "shard-2"))
    (backup,) = s.backups()
    assert sorted(os.listdir(os.path.join(s.data_dir, backup))) == ["shard-1", "shard-2"]
    assert shard_contents(s.data_dir, [(0, 4999), (5000, 16383)]) == model
    assert s.layout() == [[0, 4999], [5000, 16383]]
    assert s.left() == [] and not os.path.exists(rj.journal_path(s.data_dir))
    # The backup is the old data: it reads as before.
    with DB.open(os.path.join(s.data_dir, backup, "shard-2"), create_if_missing=False) as db:
        assert dict(db.scan()) == {k: v for k, v in model.items() if slot_of(k) >= 10000}


def test_same_layout_is_nothing_to_move(tmp_path):
    s = Setup(tmp_path)
    s.build(conf(2), model_of(50), garbage=False)
    r = s.cli("cluster", "reshard")  # the installed command, once
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("nothing to move")
    assert s.backups() == []


def in_process(s: Setup, capsys, *argv):
    """The CLI's main() in this process (no interpreter start): (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = app.main([*argv, "--config", s.conf])
    out = capsys.readouterr()
    return code, out.out, out.err


def _refused(s: Setup, capsys, code: int, words: str, *extra) -> None:
    before = tree(s.data_dir) if os.path.isdir(s.data_dir) else None
    got, out, err = in_process(s, capsys, "cluster", "reshard", *extra)
    assert got == code, (got, out, err)
    assert one_error_line(err), err
    assert words in err, err
    assert out == ""
    after = tree(s.data_dir) if os.path.isdir(s.data_dir) else None
    if before is not None:  # the lock file may be created; nothing else changes
        after.pop("cluster.lock", None)
        before.pop("cluster.lock", None)
    assert after == before


def test_refusals_change_nothing(tmp_path, capsys):
    s = Setup(tmp_path)
    s.config(conf(3))
    _refused(s, capsys, 2, "is not a data directory yet")  # no data directory: none created
    assert not os.path.exists(s.data_dir)
    os.makedirs(s.data_dir)
    _refused(s, capsys, 2, "has no slot layout yet")
    shutil.rmtree(s.data_dir)

    model = model_of(300)
    s.build(conf(2), model)
    with open(s.conf, "w") as f:
        f.write(conf(3) + "[engine]\nbogus = 1\n")
    _refused(s, capsys, 2, "config")  # an invalid new config
    with open(s.conf, "w") as f:
        f.write(conf(2, [(0, 10), (12, 16383)]))
    _refused(s, capsys, 2, "leaves a gap")

    s.config(conf(3))
    os.makedirs(os.path.join(s.data_dir, "shard-2"))  # in the way of a new shard
    _refused(s, capsys, 2, "would be replaced by the new shard-2")
    os.rmdir(os.path.join(s.data_dir, "shard-2"))
    os.rename(os.path.join(s.data_dir, "shard-1"), str(tmp_path / "moved"))
    _refused(s, capsys, 2, "its keys cannot be found")
    os.rename(str(tmp_path / "moved"), os.path.join(s.data_dir, "shard-1"))

    with DB.open(os.path.join(s.data_dir, "shard-1"), create_if_missing=False):
        _refused(s, capsys, 6, "open in another process")

    rj.write(s.data_dir, {"operation": "reshard", "backup": "x", "shards": [],
                          "old_layout": {"slots": [[0, 16383]]},
                          "new_layout": {"slots": [[0, 16383]]}})
    _refused(s, capsys, 2, "holds an interrupted reshard")
    code, _, err = in_process(s, capsys, "cluster", "restore", "--finish")  # not a restore's
    assert code == 2 and "`sievekv cluster reshard --finish`" in err, err
    os.remove(rj.journal_path(s.data_dir))
    rj.write(s.data_dir, {"checkpoint": "/ck", "backup": "x", "shards": []})  # an old journal
    _refused(s, capsys, 2, "holds an interrupted restore from /ck")
    _refused(s, capsys, 2, "not of a reshard", "--finish")
    os.remove(rj.journal_path(s.data_dir))
    _refused(s, capsys, 2, "holds no interrupted reshard", "--undo")

    assert shard_contents(s.data_dir, [(0, 8191), (8192, 16383)]) == model


def test_a_key_outside_its_shards_slots_is_refused_and_staging_removed(tmp_path):
    s = Setup(tmp_path)
    s.build(conf(2), model_of(200))
    stray = next(b"stray%d" % i for i in range(100) if slot_of(b"stray%d" % i) >= 8192)
    with DB.open(os.path.join(s.data_dir, "shard-0"), create_if_missing=False) as db:
        db.put(stray, b"x")
    with pytest.raises(CliError) as ei:
        reshard_cmd.run(s.config(conf(3)), quiet=True)
    assert ei.value.code == 1 and "outside its slot range 0-8191" in str(ei.value)
    assert s.left() == [] and s.backups() == [] and s.layout() == [[0, 8191], [8192, 16383]]
    assert not os.path.exists(os.path.join(s.data_dir, "shard-2"))


def test_a_damaged_old_shard_is_refused_and_staging_removed(tmp_path):
    s = Setup(tmp_path)
    model = model_of(400)
    s.build(conf(2), model, garbage=False)
    shard1 = os.path.join(s.data_dir, "shard-1")
    with DB.open(shard1, create_if_missing=False) as db:
        db.flush()
    table = max((n for n in os.listdir(shard1) if n.endswith(".sst")),
                key=lambda n: os.path.getsize(os.path.join(shard1, n)))
    with open(os.path.join(shard1, table), "r+b") as f:
        f.seek(10)
        b = f.read(1)
        f.seek(10)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(CliError) as ei:
        reshard_cmd.run(s.config(conf(3)), quiet=True)
    assert ei.value.code == 1 and "nothing was resharded" in str(ei.value), str(ei.value)
    assert s.left() == [] and s.backups() == [] and s.layout() == [[0, 8191], [8192, 16383]]
    assert not os.path.exists(os.path.join(s.data_dir, "shard-2"))


def test_an_empty_old_shard_directory_counts_as_no_keys(tmp_path):
    s = Setup(tmp_path)
    model = {k: v for k, v in model_of(300).items() if slot_of(k) < 8192}
    s.build(conf(2), model, garbage=False)
    shutil.rmtree(os.path.join(s.data_dir, "shard-1"))
    os.makedirs(os.path.join(s.data_dir, "shard-1"))  # as the supervisor makes it
    assert reshard_cmd.run(s.config(conf(3)), quiet=True) == 0
    assert shard_contents(s.data_dir, s.layout()) == model


def test_journal_entries_of_removed_shards_finish_and_undo(tmp_path):
    data, backup = str(tmp_path / "shard-3"), str(tmp_path / "bk" / "shard-3")
    e = {"name": "shard-3", "data": data, "staged": data + rj.RESHARD_STAGING_SUFFIX,
         "backup": backup, "had_data": True, "removed": True}
    os.makedirs(data)
    assert rj.undo_shard(e) == "not moved"
    assert rj.finish_shard(e) == "removed" and os.path.isdir(backup) and not os.path.exists(data)
    assert rj.finish_shard(e) == "done already"
    assert rj.undo_shard(e) == "old data back" and os.path.isdir(data)
    assert not os.path.exists(backup)
    os.makedirs(backup)  # both: never guessed
    for f in (rj.finish_shard, rj.undo_shard):
        with pytest.raises(rj.JournalError, match="settle this shard by hand"):
            f(e)
    assert os.path.isdir(data) and os.path.isdir(backup)
    line = rj.running_line({"pid": 7, "operation": "reshard"})
    assert line == "a `sievekv cluster reshard` (pid 7)"
    line = rj.running_line({"pid": 7, "checkpoint": "/ck"})  # an older build's: a restore
    assert line.startswith("a `sievekv cluster restore` (pid 7")


def test_short_disk_is_refused_with_the_numbers(tmp_path):
    with pytest.raises(CliError) as ei:
        reshard_cmd.check_room(str(tmp_path), 3 << 30, free=1 << 30)
    assert ei.value.code == 1
    assert "need about 3.0 GiB" in str(ei.value) and "has 1.0 GiB free" in str(ei.value)
    reshard_cmd.check_room(str(tmp_path), 1 << 20)  # fits


# ---------------------------------------------------------------------------------------------
# crash safety: SIGKILL at the k-th rename / directory sync / removal
# ---------------------------------------------------------------------------------------------

KILLER = """
import atexit, os, signal, sys
from engine.vfs import FileSystem
at, n = int(os.environ["KILL_AT"]), [0]
def wrap(name):
    orig = getattr(FileSystem, name)
    def f(self, *a, **kw):
        n[0] += 1
        if n[0] == at:
            os.kill(os.getpid(), signal.SIGKILL)
        return orig(self, *a, **kw)
    setattr(FileSystem, name, f)
for name in ("rename", "sync_dir", "remove"):
    wrap(name)
atexit.register(lambda: print("fs-ops", n[0], file=sys.stderr))
from router.cli.app import main
sys.exit(main(sys.argv[1:]))
"""


def _reshard_killed_at(s: Setup, at: int) -> subprocess.Popen:
    """Start ``cluster reshard`` in a process that SIGKILLs itself at file-system operation
    ``at``; the caller waits for it (several run at once, each on its own directory)."""
    env = dict(os.environ, KILL_AT=str(at), PYTHONPATH=ROOT)
    env.pop("SIEVEKV_CONFIG", None)
    return subprocess.Popen([sys.executable, "-c", KILLER, "cluster", "reshard", "--quiet",
                             "--config", s.conf], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _wait_all(procs: dict) -> dict:
    """Wait for every process of ``procs`` (at -> Popen); at -> (returncode, stderr). Any
    still running after the (generous) timeout is killed, and none is left behind on failure."""
    out = {}
    try:
        for at, p in procs.items():
            _, err = p.communicate(timeout=120)
            out[at] = (p.returncode, err)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


@pytest.mark.parametrize("old_n,new_n", [(2, 3), (3, 2)])
def test_sigkill_anywhere_then_finish_or_undo_gives_wholly_old_or_wholly_new(tmp_path, capsys,
                                                                             monkeypatch, old_n,
                                                                             new_n):
    old_text, new_text = conf(old_n), conf(new_n, UNEVEN3[:new_n] if new_n == 3 else None)
    model = model_of(300, seed=old_n)
    s = Setup(tmp_path / "probe")
    os.makedirs(s.root)
    s.build(old_text, model, garbage=False)
    cfg = s.config(new_text)
    count = [0]
    for name in ("rename", "sync_dir", "remove"):  # count the operations KILLER counts
        orig = getattr(FileSystem, name)

        def counted(self, *a, _orig=orig, **kw):
            count[0] += 1
            return _orig(self, *a, **kw)
        monkeypatch.setattr(FileSystem, name, counted)
    assert reshard_cmd.run(cfg, quiet=True) == 0
    monkeypatch.undo()
    total = count[0]
    new_layout = s.layout()
    old_layout = [[x.slot_start, x.slot_end] for x in loads(old_text).shards]
    rng = random.Random(old_n * 10 + new_n)
    # Half the kills in the swap (its last ~16 operations), half anywhere.
    points = sorted({*rng.sample(range(max(1, total - 16), total + 1), 3),
                     *rng.sample(range(1, total + 1), 2)})
    start_checked, seen = False, set()
    setups = {}
    for at in points:  # each kill on its own copy of the old data, all killed runs at once
        setups[at] = s = Setup(tmp_path / f"kill{at}")
        if len(setups) == 1:
            os.makedirs(s.root)
            s.build(old_text, model, garbage=False)
        else:
            shutil.copytree(setups[points[0]].root, s.root)
        s.config(new_text)
    killed = _wait_all({at: _reshard_killed_at(setups[at], at) for at in points})
    for at in points:
        s = setups[at]
        returncode, stderr = killed[at]
        assert returncode == -9, (at, returncode, stderr)
        journal = os.path.exists(rj.journal_path(s.data_dir))
        seen.add(journal)
        if journal:
            if not start_checked:  # one real `cluster start` per case: it refuses
                st = s.cli("cluster", "start")
                assert st.returncode == 2 and "holds an interrupted reshard" in st.stderr, st.stderr
                start_checked = True
            undo = rng.random() < 0.5
            code, _, err = in_process(s, capsys, "cluster", "reshard",
                                      "--undo" if undo else "--finish")
            assert code == 0, (at, err)
            assert not os.path.exists(rj.journal_path(s.data_dir))
            want = old_layout if undo else new_layout
        else:
            want = s.layout()
            assert want in (old_layout, new_layout), (at, want)
            if want == old_layout:  # killed before the journal: running it again completes
                code, _, err = in_process(s, capsys, "cluster", "reshard", "--quiet")
                assert code == 0, (at, err)
                want = new_layout
        assert s.layout() == want, at
        assert shard_contents(s.data_dir, want) == model, at
        assert s.left() == [], (at, s.left())
        if want == new_layout:  # the old data is in the backup, whole
            (backup,) = s.backups()
            assert shard_contents(os.path.join(s.data_dir, backup), old_layout) == model
    assert seen == {True, False}  # kills inside the journal's window and outside it


# ---------------------------------------------------------------------------------------------
# session 10: digest check, bounded staging memtable, progress
# ---------------------------------------------------------------------------------------------

def test_pair_digest_sum_is_order_independent_and_sees_values_and_the_key_value_split():
    pairs = [(b"k%d" % i, b"v%d" % i) for i in range(100)]

    def total(ps):
        return sum(reshard_cmd.pair_digest(k, v) for k, v in ps) % reshard_cmd.DIGEST_MOD

    assert total(pairs) == total(list(reversed(pairs)))
    assert total(pairs) != total(pairs[:-1] + [(b"k99", b"v98")])
    assert reshard_cmd.pair_digest(b"ab", b"c") != reshard_cmd.pair_digest(b"a", b"bc")


def test_a_value_changed_on_its_way_to_a_new_shard_is_refused_by_the_digest_check(
        tmp_path, monkeypatch):
    """Counts match, a value differs: the count check alone would pass it."""
    s = Setup(tmp_path)
    s.build(conf(2), model_of(300), garbage=False)
    before = tree(s.data_dir)

    class FlippingDB:  # the engine, with one value changed in the first batch written
        @staticmethod
        def open(path, **options):
            db = DB.open(path, **options)
            if path.endswith(rj.RESHARD_STAGING_SUFFIX) and not options.get("read_only"):
                write = db.write

                def flipped(batch, sync=None):
                    batch = list(batch)
                    if not getattr(db, "_flipped", False):
                        db._flipped = True
                        batch[0] = (batch[0][0], batch[0][1] + b"!")
                    return write(batch, sync)
                db.write = flipped
            return db

    monkeypatch.setattr(reshard_cmd, "DB", FlippingDB)
    with pytest.raises(CliError) as ei:
        reshard_cmd.run(s.config(conf(3)), quiet=True)
    assert ei.value.code == 1 and "not the same keys and values" in str(ei.value)
    assert s.left() == []
    after = tree(s.data_dir)
    for t in (before, after):
        t.pop("cluster.lock", None)
    assert after == before


def test_staged_shards_get_a_bounded_memtable_and_progress_names_totals(tmp_path, capsys):
    s = Setup(tmp_path)
    model = model_of(500)
    s.build(conf(2), model, garbage=False)
    big = conf(3).replace('memtable_bytes = "16KiB"', 'memtable_bytes = "64MiB"')
    cfg = s.config(big)
    assert reshard_cmd._new_options(cfg)["memtable_bytes"] == reshard_cmd.STAGING_MEMTABLE_BYTES
    assert reshard_cmd._new_options(s.config(conf(3)))["memtable_bytes"] == 16 << 10
    cfg = s.config(big)
    assert reshard_cmd.run(cfg) == 0
    err = capsys.readouterr().err
    assert "writing the new shards' last memtables to tables and checking every new shard" in err
    assert "checked shard-2: " in err
    assert shard_contents(s.data_dir, s.layout()) == model
