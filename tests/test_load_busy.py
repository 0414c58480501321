"""`sievekv load` rides out a write stall: a batch refused as busy is sent again.

A shard whose writes are held past the call's deadline answers RESOURCE_EXHAUSTED "write not
applied" (tests/test_write_timeout.py). Nothing of the batch was applied where it failed, and
applying the rest again stores the same values, so `load` waits (0.5 s, doubling to 5 s) and
sends the batch again, for at most ``--busy-wait`` seconds in a row, saying so on stderr.

The shard is served in this process over a real engine.DB whose compactions are held off
(its compaction lock taken) with L0 at its stop trigger, behind a real router process; the
CLI runs as a process of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from router.cluster_map import ClusterMap
from shard.server import create_server

from .conftest import poll_until, start_router_process
from .test_write_timeout import _stopped

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORDS = 300


def _input(tmp_path) -> str:
    path = tmp_path / "in.tsv"
    path.write_text("".join(f"key{i:04d}\tvalue{i}\n" for i in range(RECORDS)))
    return str(path)


def _cli(router_address: str, *args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("SIEVEKV_ROUTER", None)
    env.pop("SIEVEKV_CONFIG", None)
    return subprocess.Popen([sys.executable, "-m", "router.cli", *args, "--router",
                             router_address], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _serve_stopped(tmp_path, procs):
    """(db, release, router) with the stopped shard behind a router process."""
    ctx = _stopped(tmp_path / "db")
    db, _written, release = ctx.__enter__()
    serving = None

    def stop():
        if serving is not None:
            serving.stop(0)
        ctx.__exit__(None, None, None)

    try:
        serving, port = create_server(db, "127.0.0.1:0", name="s0")
        serving.start()
        map_path = tmp_path / "cluster.toml"
        map_path.write_text(ClusterMap.even([("s0", f"127.0.0.1:{port}")]).to_toml())
        router = start_router_process(procs, str(map_path))
    except BaseException:
        stop()
        raise
    return db, release, router, stop


def test_load_waits_out_a_write_stall(procs, tmp_path):
    db, release, router, stop = _serve_stopped(tmp_path, procs)
    try:
        cli = _cli(router.address, "load", _input(tmp_path), "--batch", "100", "--timeout",
                   "1", "--busy-wait", "120")
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(cli.stderr), daemon=True)
        reader.start()
        try:
            assert poll_until(lambda: any("a shard is busy" in ln for ln in lines), 60.0), lines
            assert cli.poll() is None  # still waiting, not failed
            release()  # compactions bring L0 down: the batch goes through
            assert cli.wait(60) == 0, lines
        finally:
            if cli.poll() is None:
                cli.kill()
                cli.wait()
            reader.join(10)
        busy = next(ln for ln in lines if "a shard is busy" in ln)
        assert "write not applied" in busy and "sending the batch again in" in busy
        assert all(db.get(b"key%04d" % i) == b"value%d" % i for i in range(RECORDS))
    finally:
        stop()


def test_load_with_no_busy_wait_stops_at_once_with_exit_7(procs, tmp_path):
    db, release, router, stop = _serve_stopped(tmp_path, procs)
    try:
        cli = _cli(router.address, "load", _input(tmp_path), "--timeout", "1", "--busy-wait",
                   "0", "--quiet")
        try:
            _out, err = cli.communicate(timeout=60)
        finally:
            if cli.poll() is None:
                cli.kill()
                cli.wait()
        assert cli.returncode == 7, err
        assert err.count("\n") == 1 and "load stopped" in err and "write not applied" in err
        assert db.get(b"key0000") is None
    finally:
        stop()
