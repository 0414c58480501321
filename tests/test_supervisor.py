"""The supervisor as real processes, with a tiny gRPC health server standing in for shards and
router: start and readiness, restart after SIGKILL, giving up after repeated crashes, operator
restart, the data-directory lock, a port in use, a child that cannot start, and stop.

The real shard and router are exercised end to end in tests/test_cli_e2e.py; here the children
are small so that the supervisor's own logic is tested quickly and in isolation.
"""

import os
import signal
import socket
import sys
import textwrap
import time
from argparse import Namespace

import pytest

from router import cluster_state as cs
from router import config
from router.cli import lifecycle, status
from router.cli.exit_codes import CONFLICT, ERROR, CliError
from router.supervisor import control_request

CHILD = textwrap.dedent("""
    import os, signal, sys, threading
    from concurrent import futures
    import grpc
    from grpc_health.v1 import health, health_pb2_grpc
    address, ddir = sys.argv[1], sys.argv[2]
    os.makedirs(ddir, exist_ok=True)
    if os.path.exists(os.path.join(ddir, "crash")):
        print("tiny child: crash file present, exiting 3", flush=True)
        sys.exit(3)
    server = grpc.server(futures.ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    server.add_insecure_port(address)
    server.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    stop.wait()
    server.stop(0)
""")

DRIVER = textwrap.dedent("""
    import dataclasses, os, sys
    from router import launch, supervisor
    child = sys.argv[1]
    real_shard, real_router = launch.shard_spec, launch.router_spec
    def shard_spec(cfg, shard):
        s = real_shard(cfg, shard)
        return dataclasses.replace(s, argv=(sys.executable, child, s.address, s.data_dir))
    def router_spec(cfg):
        s = real_router(cfg)
        return dataclasses.replace(
            s, argv=(sys.executable, child, s.address, os.path.join(cfg.data_dir, "router")))
    launch.shard_spec, launch.router_spec = shard_spec, router_spec
    sys.exit(supervisor.main(sys.argv[2:]))
""")


def _config(tmp_path, **extra):
    text = textwrap.dedent(f"""
        [cluster]
        data_dir = "data"
        [router]
        listen = "127.0.0.1:0"
        [shards]
        count = 2
        base_port = 0
        [supervisor]
        start_timeout = 20.0
        stop_timeout = 5.0
        restart_delay = 0.05
        restart_delay_max = 0.2
        max_restarts = {extra.get("max_restarts", 2)}
        restart_window = 60.0
    """)
    text += extra.get("more", "")
    (tmp_path / "c.toml").write_text(text)
    return config.load(str(tmp_path / "c.toml"))


def _argv(tmp_path, cfg):
    (tmp_path / "child.py").write_text(CHILD)
    (tmp_path / "driver.py").write_text(DRIVER)
    return [sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "child.py"),
            "--config", cfg.source, "--ready-fd", "{fd}"]


def _state(cfg):
    return cs.read_state(cfg.data_dir)


def _proc(cfg, name):
    return next(p for p in _state(cfg)["processes"] if p["name"] == name)


def _wait(pred, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            v = pred()
        except (cs.StateError, StopIteration):
            v = None
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _kill_everything(cfg):
    """Finalizer: stop through the CLI, then SIGKILL any recorded pid that survived."""
    try:
        lifecycle.cmd_stop(Namespace(data_dir=cfg.data_dir, quiet=True, timeout=3.0))
    except (CliError, cs.StateError):
        pass
    try:
        doc = _state(cfg)
    except cs.StateError:
        return
    for _, pid, ct in cs.recorded_pids(doc):
        if cs.pid_alive(pid, ct):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def cluster(tmp_path, request):
    cfg = _config(tmp_path)
    request.addfinalizer(lambda: _kill_everything(cfg))
    ready = lifecycle.start_supervisor(cfg, argv=_argv(tmp_path, cfg))
    return cfg, ready


def test_supervised_lifecycle(cluster, tmp_path):
    cfg, ready = cluster
    doc = _state(cfg)
    assert doc["state"] == "running" and ready["router"] == doc["router_address"]
    procs = {p["name"]: p for p in doc["processes"]}
    assert set(procs) == {"shard-0", "shard-1", "router"}
    assert all(p["status"] == "serving" for p in procs.values())
    assert all(cs.pid_alive(p["pid"], p["create_time"]) for p in procs.values())
    # ports given as 0 were resolved once, to distinct real ports
    ports = {config.split_address(p["address"])[1] for p in procs.values()}
    assert len(ports) == 3 and 0 not in ports
    sup = doc["supervisor"]
    assert os.getpgid(procs["shard-0"]["pid"]) == sup["pid"]  # one process group to clean up

    # 1. a shard killed with SIGKILL is restarted on the same address
    old = procs["shard-0"]
    os.kill(old["pid"], signal.SIGKILL)
    new = _wait(lambda: (p := _proc(cfg, "shard-0"))["pid"] != old["pid"]
                and p["status"] == "serving" and p, what="shard-0 restart")
    assert new["restarts"] == 1 and new["address"] == old["address"]
    assert new["last_exit"] == "killed by SIGKILL"

    # 2. a shard that keeps crashing is given up on after max_restarts (2) restarts
    (tmp_path / "data" / "shard-1" / "crash").write_text("")
    os.kill(procs["shard-1"]["pid"], signal.SIGKILL)
    failed = _wait(lambda: (p := _proc(cfg, "shard-1"))["status"] == "failed" and p,
                   what="shard-1 failed")
    assert failed["restarts"] == 2 and failed["last_exit"] == "exit code 3"
    # A negative check, so a sleep: no event marks "no restart came". 0.5 s is over twice
    # restart_delay_max (0.2 s); a late restart can only go unseen (pass), never fail the test.
    time.sleep(0.5)
    assert _proc(cfg, "shard-1")["restarts"] == 2  # no further attempts
    assert _proc(cfg, "router")["status"] == "serving"
    st = status.collect(_state(cfg))  # and `cluster status` says so
    row = next(r for r in st["processes"] if r["name"] == "shard-1")
    assert st["cluster"] == "degraded" and row["status"] == "failed" and not row["alive"]
    assert "shard-1: last exit exit code 3" in status.render_text(st)

    # 3. an operator restart tries again (and resets the crash history)
    (tmp_path / "data" / "shard-1" / "crash").unlink()
    assert control_request(sup["control"], {"op": "restart", "name": "shard-1"})["ok"]
    _wait(lambda: _proc(cfg, "shard-1")["status"] == "serving", what="shard-1 back")
    bad = control_request(sup["control"], {"op": "restart", "name": "shard-9"})
    assert not bad["ok"] and "no process named" in bad["error"]

    # 4. a second cluster on the same data directory fails fast, naming the owner
    with pytest.raises(CliError) as ei:
        lifecycle._check_not_running(cfg)
    assert ei.value.code == CONFLICT and f"supervisor pid {sup['pid']}" in str(ei.value)
    with pytest.raises(CliError) as ei:  # and the supervisor itself refuses too
        lifecycle.start_supervisor(cfg, argv=_argv(tmp_path, cfg))
    assert ei.value.code == CONFLICT and "locked" in str(ei.value)
    assert cs.pid_alive(sup["pid"], sup["create_time"])  # the first cluster is untouched

    # 5. stop leaves nothing behind
    pids = cs.recorded_pids(_state(cfg))
    assert lifecycle.cmd_stop(Namespace(data_dir=cfg.data_dir, quiet=True, timeout=None)) == 0
    assert not [p for _, p, ct in pids if cs.pid_alive(p, ct)]
    doc = _state(cfg)
    assert doc["state"] == "stopped"
    assert {p["status"] for p in doc["processes"]} == {"stopped"}
    assert not os.path.exists(sup["control"])


def test_a_child_that_cannot_start_fails_the_start_and_leaves_nothing(tmp_path):
    cfg = _config(tmp_path)
    try:
        (tmp_path / "data" / "shard-1").mkdir(parents=True)
        (tmp_path / "data" / "shard-1" / "crash").write_text("")
        with pytest.raises(CliError) as ei:
            lifecycle.start_supervisor(cfg, argv=_argv(tmp_path, cfg))
        msg = str(ei.value)
        assert ei.value.code == ERROR
        assert "shard-1" in msg and "exit code 3 while starting" in msg
        assert "crash file present" in msg  # the child's last words
        doc = _state(cfg)
        assert doc["state"] == "failed"
        assert not [p for _, p, ct in cs.recorded_pids(doc) if cs.pid_alive(p, ct)]
    finally:
        _kill_everything(cfg)


def test_a_port_in_use_fails_the_start_with_a_conflict(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        cfg = _config(tmp_path, more=f'\n[[shard]]\nlisten = "127.0.0.1:{port}"\n[[shard]]\n')
        try:
            with pytest.raises(CliError) as ei:
                lifecycle.start_supervisor(cfg, argv=_argv(tmp_path, cfg))
            assert ei.value.code == CONFLICT
            assert str(ei.value) == f"port {port} on 127.0.0.1 (shard-0) is already in use"
            # nothing was spawned, and the lock was released
            lifecycle._check_not_running(cfg)
        finally:
            _kill_everything(cfg)
