"""Shared fixtures that start real shard and router processes on 127.0.0.1.

Every process is started in its own session (``start_new_session``) with ``--exit-with-parent``
and registered with the ``procs`` fixture (or the module-scoped ``module_procs``), whose
teardown SIGKILLs the whole process group of anything still running, even when a test fails.

- ``start_shard_process(procs, data_dir, ...) -> Proc`` and
  ``start_router_process(procs, cluster_map_path, ...) -> Proc`` start one process and wait
  for its port file (``Proc.port``, ``Proc.address``).
- ``cluster4`` (module scope): four shards and one router, with ``.client()``.

The shards serve the real engine.DB (``python -m shard``).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest

from . import sigterm

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START_TIMEOUT = 30.0

# A shell without job control starts a background command (`... &`, nohup) with SIGINT ignored,
# and every process a test starts would inherit that: the Ctrl-C tests would then meet a CLI
# that cannot be interrupted (exit 0, not 130). Children of a process with a Python handler
# start with the default, so give the test process one.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# A run stopped with SIGTERM (a CI timeout, `kill`) tears its fixtures down as Ctrl-C does, so
# it does not leave the processes they started running (tests/sigterm.py).
sigterm.install()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port that is free right now (bound without SO_REUSEPORT, then released), for a
    server that cannot bind port 0 itself (metrics ports, fixed cluster configs).

    Picked at random *below* the kernel's ephemeral range: port 0 would hand out a port from
    that range, where every outgoing connection (gRPC channels of this run and of anything
    else on the machine) also takes its local port, so it could be taken again before the
    server binds it."""
    low = _ephemeral_low()
    rng = random.Random()
    for _ in range(100):
        port = rng.randrange(10000, low) if low > 11000 else rng.randrange(1024, 10000)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def poll_until(cond, timeout: float, every: float = 0.02) -> bool:
    """Poll ``cond`` until true (True) or ``timeout`` seconds pass (False): for tests that
    also assert that something does *not* happen in time, where wait_until would fail."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(every)
    return True


def _thread_states(pid: int) -> list[str]:
    states = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # the thread ended
    return states


def sigstop(pid: int, timeout: float = 60.0) -> None:
    """SIGSTOP ``pid`` and return once every one of its threads is stopped.

    kill() only queues the stop: one thread of the target starts the group stop when it next
    runs, and on a loaded machine the process's other threads (gRPC's pollers, handler
    threads) can answer calls in the meantime. A test that relies on "a stopped process
    answers nothing" must wait for the stop to be complete (/proc/PID/task/*/stat state T).
    A process that exits instead (a zombie) counts as stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while True:
        try:
            states = _thread_states(pid)
        except FileNotFoundError:
            return  # gone
        if all(s in "tTZX" for s in states):
            return
        assert time.monotonic() < deadline, f"pid {pid} did not stop within {timeout} s: {states}"
        time.sleep(0.001)


def wait_until(predicate, what: str, timeout: float = 60.0, poll: float = 0.1):
    """Poll ``predicate`` until it returns something true (returned); fail the test naming
    ``what`` after ``timeout`` seconds (generous: machines running CI are often loaded)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll)


@dataclass
class Proc:
    """A started process; ``port`` is read from its port file."""

    popen: subprocess.Popen
    name: str
    log_path: str
    port_file: str
    port: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def wait_ready(self, timeout: float = START_TIMEOUT) -> "Proc":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.path.exists(self.port_file):
                with open(self.port_file) as f:
                    self.port = int(f.read().strip())
                return self
            if not self.alive():
                raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n{self.log()}")
            time.sleep(0.02)
        raise RuntimeError(f"{self.name} did not write its port file in {timeout}s:\n{self.log()}")

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM (drain) and wait; returns the exit code."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
        return self.popen.wait(timeout)

    def kill(self) -> None:
        """SIGKILL the process group (the process and anything it spawned)."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)  # also after the leader exited
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            pass


class ProcRegistry(list):
    """Processes to kill at teardown."""

    def kill_all(self) -> None:
        for p in self:
            p.kill()
        self.clear()


def _spawn(registry: ProcRegistry, name: str, argv: list[str], run_dir: str) -> Proc:
    os.makedirs(run_dir, exist_ok=True)
    port_file = os.path.join(run_dir, f"{name}.port")
    if os.path.exists(port_file):
        os.remove(port_file)
    log_path = os.path.join(run_dir, f"{name}.log")
    log = open(log_path, "ab")
    try:
        popen = subprocess.Popen([*argv, "--port-file", port_file], cwd=REPO, stdout=log,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
    finally:
        log.close()
    proc = Proc(popen, name, log_path, port_file)
    registry.append(proc)
    return proc


def start_shard_process(registry: ProcRegistry, data_dir: str, *, name: str, port: int = 0,
                        extra: tuple[str, ...] = (), wait: bool = True) -> Proc:
    """Start ``python -m shard`` serving ``data_dir`` (log and port file beside it)."""
    argv = [sys.executable, "-m", "shard", "--data-dir", data_dir, "--listen", f"127.0.0.1:{port}",
            "--name", name, "--exit-with-parent", "--log-level", "WARNING", *extra]
    proc = _spawn(registry, name, argv, os.path.dirname(os.path.abspath(data_dir)))
    return proc.wait_ready() if wait else proc


def start_router_process(registry: ProcRegistry, cluster_map_path: str, *, name: str = "router",
                         processes: int = 1, extra: tuple[str, ...] = (), wait: bool = True) -> Proc:
    """Start ``python -m router`` for ``cluster_map_path`` on a free port."""
    argv = [sys.executable, "-m", "router", "--cluster-map", cluster_map_path,
            "--listen", "127.0.0.1:0", "--processes", str(processes), "--exit-with-parent",
            "--log-level", "WARNING", *extra]
    proc = _spawn(registry, name, argv, os.path.dirname(os.path.abspath(cluster_map_path)))
    return proc.wait_ready() if wait else proc


def write_cluster_map(path: str, shards: list[Proc]) -> str:
    from router.cluster_map import ClusterMap

    with open(path, "w", encoding="utf-8") as f:
        f.write(ClusterMap.even([(p.name, p.address) for p in shards]).to_toml())
    return path


@pytest.fixture
def procs():
    """A registry of processes started by one test; all are killed at teardown."""
    registry = ProcRegistry()
    try:
        yield registry
    finally:
        registry.kill_all()


@pytest.fixture(scope="module")
def module_procs():
    """Like ``procs``, shared by the tests of one module."""
    registry = ProcRegistry()
    try:
        yield registry
    finally:
        registry.kill_all()


@dataclass
class Cluster:
    shards: list[Proc]
    router: Proc
    map_path: str
    root: str

    def client(self, **kw):
        from router.client import Client

        return Client(self.router.address, **kw)

    @contextlib.contextmanager
    def unlimited_kv_stub(self):
        """A raw KV stub at the router with no message limits of its own, so that only the
        servers decide what is too large; its channel is closed on exit."""
        import grpc

        from sievekv_proto import sievekv_pb2_grpc as pbg

        ch = grpc.insecure_channel(self.router.address,
                                   options=[("grpc.max_receive_message_length", -1),
                                            ("grpc.max_send_message_length", -1)])
        try:
            yield pbg.KVStub(ch)
        finally:
            ch.close()


@pytest.fixture(scope="module")
def cluster4(module_procs, tmp_path_factory):
    """Four shard processes and one router process (module scope)."""
    root = str(tmp_path_factory.mktemp("cluster4"))
    shards = [start_shard_process(module_procs, os.path.join(root, f"s{i}"), name=f"s{i}", wait=False)
              for i in range(4)]
    for s in shards:
        s.wait_ready()
    map_path = write_cluster_map(os.path.join(root, "cluster.toml"), shards)
    router = start_router_process(module_procs, map_path)
    return Cluster(shards, router, map_path, root)



def open_test_db(path: str, **options):
    """The real engine.DB at ``path`` (for in-process servicer tests)."""
    from engine import DB

    return DB.open(path, **options)
