"""The supervisor: the detached process that owns a local cluster's shards and router.

``sievekv cluster start`` runs ``python -m router.supervisor [--config F] --data-dir D
--ready-fd N`` in a new session and reads its progress from pipe ``N`` (one JSON object per
line: ``spawn``, ``serving``, then ``ready`` or ``error``). The supervisor:

1. takes the cluster lock ``<data_dir>/cluster.lock`` (flock, held for its whole life), checks
   the slot layout and the ports, resolves ports given as 0, writes the cluster map;
2. starts every shard, waits until each reports SERVING on grpc.health.v1, then starts the
   router and waits for it; any failure (a state file that cannot be written included: a
   cluster it does not record cannot be stopped) stops everything it started, reports
   ``error`` and exits 1 — nothing is left running;
3. keeps the state file (router/cluster_state.py) current and restarts a process that dies,
   with the backoff of router/restart_policy.py; past ``max_restarts`` it marks it ``failed``;
4. answers the control socket (``restart``, ``ping``, ``stop``; one JSON line each way);
5. on SIGTERM (``cluster stop``) stops the router, then the shards (SIGTERM, SIGKILL after
   ``stop_timeout``), records how each ended, releases the lock and exits 0.

Children share the supervisor's process group, get /dev/null as stdin and log to
``<data_dir>/logs/<name>.log``. Single-threaded: one loop polls children, probes starting
ones and serves the control socket.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import select
import signal
import socket
import subprocess
import sys
import time
import traceback

import psutil

from engine.errors import LockedError
from engine.vfs import FileSystem
from shard.tls import TlsError

from . import cluster_state as cs
from . import health_probe, launch, preflight
from .cluster_state import ProcStatus
from .config import ClusterConfig, ConfigError, load
from .restart_policy import RestartPolicy, RestartTracker

TICK = 0.1  # seconds between checks of the children
PROBE_TIMEOUT = 0.5


def tls_start_hint(probe_tls) -> str:
    """What to check when a process of a [tls] cluster never answered the health check
    (made with ``probe_tls``, launch.client_tls): the certificate's CA and names, and with
    client_ca, that [tls] cert is also the supervisor's (and the router's) client
    certificate, which the servers refuse unless its extendedKeyUsage allows clientAuth."""
    hint = (" (TLS on: is its certificate signed by [tls] ca, and does it name the host it "
            "listens on (127.0.0.1, or ::1, for a wildcard address)?")
    if probe_tls.cert is not None:
        hint += (" With client_ca, [tls] cert is also the client certificate of the health "
                 "checks and of the router: its extendedKeyUsage must allow clientAuth as "
                 "well as serverAuth, and client_ca must have signed it")
    return hint + ")"


class StartFailure(Exception):
    """The cluster could not start. ``kind``: "conflict", "config" or "failed"."""

    def __init__(self, message: str, kind: str = "failed"):
        super().__init__(message)
        self.kind = kind


def _log(msg: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} supervisor[{os.getpid()}]: {msg}", flush=True)


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def last_log_line(path: str) -> str:
    """The last non-empty line of a log (what a dying process said last), or ""."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            lines = [ln.strip() for ln in f.read().decode("utf-8", "replace").splitlines()]
    except OSError:
        return ""
    lines = [ln for ln in lines if ln and not ln.startswith("==== ")]  # not our banners
    return lines[-1][:300] if lines else ""


class Child:
    """One supervised process: its spec, the running Popen, and its restart history."""

    def __init__(self, spec: launch.ProcessSpec, policy: RestartPolicy, start_timeout: float):
        self.spec = spec
        self.tracker = RestartTracker(policy)
        self.start_timeout = start_timeout
        self.popen: subprocess.Popen | None = None
        self.create_time: float | None = None
        self.status = ProcStatus.STOPPED
        self.restarts = 0
        self.started_at: float | None = None  # wall clock, for uptime
        self.serving_since: float | None = None
        self.last_exit: str | None = None
        self.children: list[list] = []  # [[pid, create_time]] of a router's workers
        self.restart_at = 0.0  # monotonic, in BACKOFF
        self.deadline = 0.0  # monotonic: SERVING due (STARTING) or SIGKILL due (STOPPING)
        self.restart_requested = False
        self.next_probe = 0.0

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def spawn(self, env: dict, cwd: str) -> None:
        os.makedirs(os.path.dirname(self.spec.log), exist_ok=True)
        with open(self.spec.log, "ab") as log:
            log.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} starting {self.spec.name}: "
                      f"{' '.join(self.spec.argv)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(self.spec.argv, stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                          close_fds=True)
        self.create_time = cs.process_identity(self.popen.pid)
        self.status = ProcStatus.STARTING
        self.started_at = time.time()
        self.serving_since = None
        self.children = []
        self.deadline = time.monotonic() + self.start_timeout
        self.next_probe = 0.0

    def signal(self, sig: int) -> None:
        if self.alive:
            try:
                self.popen.send_signal(sig)
            except ProcessLookupError:
                pass

    def kill_workers(self) -> None:
        """SIGKILL recorded worker processes that outlived their parent (router workers)."""
        for pid, ct in self.children:
            if cs.pid_alive(pid, ct):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def record_workers(self) -> None:
        try:
            kids = psutil.Process(self.popen.pid).children(recursive=True)
            self.children = [[k.pid, k.create_time()] for k in kids]
        except psutil.Error:
            self.children = []

    def to_json(self) -> dict:
        s = self.spec
        return {
            "name": s.name, "role": s.role, "shard": s.shard, "address": s.address,
            "metrics_port": s.metrics_port, "log": s.log, "data_dir": s.data_dir,
            "pid": self.popen.pid if self.popen else None, "create_time": self.create_time,
            "children": self.children, "status": self.status, "restarts": self.restarts,
            "started_at": self.started_at, "serving_since": self.serving_since,
            "last_exit": self.last_exit,
        }


class Supervisor:
    def __init__(self, cfg: ClusterConfig, ready_fd: int | None):
        self.cfg = cfg
        self.ready_fd = ready_fd
        self.fs = FileSystem()
        self.env = launch.child_env()
        self.lock = None
        self.control: socket.socket | None = None
        self.control_addr: str | None = None
        self.children: list[Child] = []
        self.state = "starting"
        self.error: str | None = None
        self.terminate = False
        self.started_at = time.time()
        self.starting_up = True
        self.unsaved = False  # the last save() failed; _tick tries again
        self.save_error: OSError | None = None  # why it failed
        # Seconds from SIGTERM to SIGKILL when stopping; `cluster stop --timeout` sets it.
        self.stop_timeout = cfg.supervisor.stop_timeout
        self.probe_tls = None  # shard.tls.ClientTls of the health checks ([tls]), if any

    # -- reporting -------------------------------------------------------------------------
    def report(self, **event) -> None:
        """Send one progress event to `cluster start` (ignored once it stopped listening)."""
        if self.ready_fd is None:
            return
        try:
            os.write(self.ready_fd, (json.dumps(event) + "\n").encode())
        except OSError:
            self.close_ready()

    def close_ready(self) -> None:
        if self.ready_fd is not None:
            try:
                os.close(self.ready_fd)
            except OSError:
                pass
            self.ready_fd = None

    def save(self) -> None:
        me = psutil.Process()
        doc = {
            "state": self.state, "error": self.error, "data_dir": self.cfg.data_dir,
            "config": self.cfg.to_dict(), "router_address": self.cfg.router.address,
            "supervisor": {"pid": os.getpid(), "create_time": me.create_time(),
                           "started_at": self.started_at, "control": self.control_addr,
                           "log": cs.log_path(self.cfg.data_dir, "supervisor")},
            "processes": [c.to_json() for c in self.children],
        }
        try:
            cs.write_state(self.cfg.data_dir, doc, self.fs)
        except OSError as exc:  # StorageIOError too: a full or failing disk
            # The processes keep serving: a state file that cannot be written (ENOSPC) must not
            # take a running cluster down. It is written again at the next tick (see _tick).
            # While starting, _check_saved fails the start instead.
            if not self.unsaved:
                _log(f"cannot write the state file: {exc}"
                     + ("" if self.starting_up else "; retrying"))
            self.unsaved, self.save_error = True, exc
            return
        if self.unsaved:
            _log("state file written again")
        self.unsaved, self.save_error = False, None

    def _check_saved(self) -> None:
        """While starting: raise StartFailure if the last save() failed. A cluster whose state
        file does not record its processes cannot be found by `cluster stop` or `status`, so it
        must not be reported up."""
        if self.unsaved:
            exc = self.save_error
            raise StartFailure(f"cannot write the state file {cs.state_path(self.cfg.data_dir)}: "
                               f"{cs.os_reason(exc)}",
                               "config" if cs.unusable_data_dir(exc) else "failed")

    # -- lifecycle -------------------------------------------------------------------------
    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        try:
            self._take_lock()
        except StartFailure as exc:
            _log(f"cannot start: {exc}")
            self.report(event="error", kind=exc.kind, message=str(exc))
            return 1
        try:
            self._start_cluster()
        except StartFailure as exc:
            return self._abort(str(exc), exc.kind)
        except Exception as exc:  # an unexpected failure still leaves nothing running
            _log(traceback.format_exc())
            return self._abort(f"supervisor failed: {exc}", "failed")
        self.state = "running"
        self.save()
        try:
            self._check_saved()
        except StartFailure as exc:
            return self._abort(str(exc), exc.kind)
        self.starting_up = False
        _log(f"cluster ready: router on {self.cfg.router.address}")
        self.report(event="ready", router=self.cfg.router.address, shards=len(self.cfg.shards),
                    data_dir=self.cfg.data_dir, pid=os.getpid())
        self.close_ready()
        try:
            while not self.terminate:
                self._tick()
                self._serve_control(TICK)
        except Exception:
            _log(traceback.format_exc())
        self._shutdown()
        return 0

    def _on_signal(self, signum, frame) -> None:
        _log(f"received {signal.Signals(signum).name}")
        self.terminate = True

    def _take_lock(self) -> None:
        d = self.cfg.data_dir
        try:  # `cluster start` checked this too, before it made the directory
            preflight.check_data_dir(d)
        except preflight.PreflightError as exc:
            raise StartFailure(str(exc), exc.kind) from None
        try:
            os.makedirs(os.path.join(d, cs.LOG_DIR), exist_ok=True)
        except OSError as exc:
            raise StartFailure(f"cannot create data directory {d}: {cs.os_reason(exc)}",
                               "config" if cs.unusable_data_dir(exc) else "failed") from None
        path = cs.lock_path(d)
        try:
            self.lock = self.fs.lock(path)
        except LockedError:
            owner = ""
            try:
                pid = cs.read_state(d).get("supervisor", {}).get("pid")
                owner = f" (supervisor pid {pid})" if pid else ""
            except cs.StateError:
                pass
            raise StartFailure(f"data directory {d} is locked by a running cluster{owner}",
                               "conflict") from None
        except OSError as exc:  # StorageIOError: EROFS, EACCES, EISDIR, EIO...
            raise StartFailure(f"cannot open the cluster lock {path}: {cs.os_reason(exc)}",
                               "config" if cs.unusable_data_dir(exc) else "failed") from None

    def _start_cluster(self) -> None:
        cfg = self.cfg
        try:
            cfg = preflight.resolve_ports(cfg)
            preflight.check_ports(cfg)
            preflight.check_no_restore(cfg)  # an interrupted `cluster restore` is settled first
            preflight.check_layout(cfg)  # last: a first start records the layout
        except preflight.PreflightError as exc:
            raise StartFailure(str(exc), exc.kind) from None
        try:
            self.probe_tls = launch.client_tls(cfg)  # before any process gets the files
        except TlsError as exc:
            raise StartFailure(f"config {cfg.source}: [tls]: {exc}", "config") from None
        self.cfg = cfg
        launch.write_cluster_map(cfg)
        self._open_control()
        policy = RestartPolicy.from_config(cfg.supervisor)
        t = cfg.supervisor.start_timeout
        shards = [Child(launch.shard_spec(cfg, s), policy, t) for s in cfg.shards]
        router = Child(launch.router_spec(cfg), policy, t)
        self.children = shards + [router]
        self.save()
        self._check_saved()  # before any process is started
        for group in (shards, [router]):
            for c in group:
                os.makedirs(c.spec.data_dir or cfg.data_dir, exist_ok=True)
                self._spawn(c)
            self.save()
            self._check_saved()
            while any(c.status != ProcStatus.SERVING for c in group):
                if self.terminate:
                    raise StartFailure("interrupted while starting", "failed")
                self._tick()
                self._check_saved()
                time.sleep(TICK / 2)

    def _abort(self, message: str, kind: str) -> int:
        _log(f"start failed: {message}")
        self.error = message
        self.state = "failed"
        self._stop_all()
        self.save()
        self.report(event="error", kind=kind, message=message)
        self.close_ready()
        self._release()
        return 1

    def _shutdown(self) -> None:
        _log("stopping the cluster")
        self.state = "stopping"
        self.save()
        self._stop_all()
        self.state = "stopped"
        self.save()
        self._release()
        _log("stopped")

    def _release(self) -> None:
        if self.control is not None:
            self.control.close()
            if self.control_addr and not self.control_addr.startswith("@"):
                try:
                    os.unlink(self.control_addr)
                except OSError:
                    pass
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    # -- processes -------------------------------------------------------------------------
    def _spawn(self, c: Child) -> None:
        c.spawn(self.env, self.cfg.data_dir)
        _log(f"started {c.spec.name} pid {c.popen.pid} on {c.spec.address}")
        self.save()  # recorded at once: a supervisor killed now leaves its pid for `cluster stop`
        self.report(event="spawn", name=c.spec.name, address=c.spec.address, pid=c.popen.pid)

    def _tick(self) -> None:
        """One pass over the children: reap, probe, restart, escalate. Saves on change."""
        now = time.monotonic()
        changed = False
        for c in self.children:
            if c.popen is not None and c.popen.poll() is not None and c.status not in (
                    ProcStatus.BACKOFF, ProcStatus.FAILED, ProcStatus.STOPPED):
                self._on_exit(c, now)
                changed = True
            elif c.status == ProcStatus.STARTING:
                if now >= c.deadline:
                    _log(f"{c.spec.name} not SERVING after {c.start_timeout:g}s; killing it")
                    c.last_exit = f"not SERVING within {c.start_timeout:g}s"
                    if self.probe_tls is not None:  # the health checks use [tls]
                        c.last_exit += tls_start_hint(self.probe_tls)
                    c.signal(signal.SIGKILL)
                    c.popen.wait()
                    self._on_exit(c, now, reason=c.last_exit)
                    changed = True
                elif now >= c.next_probe:
                    c.next_probe = now + 0.1
                    if health_probe.probe(c.spec.address, PROBE_TIMEOUT,
                                          tls=self.probe_tls) == health_probe.SERVING:
                        c.status = ProcStatus.SERVING
                        c.serving_since = time.time()
                        if c.spec.role == "router":
                            c.record_workers()
                        took = c.serving_since - c.started_at
                        _log(f"{c.spec.name} is SERVING ({took:.1f}s)")
                        self.report(event="serving", name=c.spec.name, address=c.spec.address,
                                    pid=c.popen.pid, seconds=round(took, 2))
                        changed = True
            elif c.status == ProcStatus.BACKOFF and now >= c.restart_at:
                c.restarts += 1
                self._spawn(c)
                changed = True
            elif c.status == ProcStatus.STOPPING and c.alive and now >= c.deadline:
                _log(f"{c.spec.name} still running {self.cfg.supervisor.stop_timeout:g}s after "
                     f"SIGTERM; sending SIGKILL")
                c.signal(signal.SIGKILL)
        if changed or self.unsaved:
            self.save()

    def _on_exit(self, c: Child, now: float, reason: str | None = None) -> None:
        how = reason or describe_exit(c.popen.returncode)
        c.kill_workers()
        if c.status == ProcStatus.STOPPING:
            c.last_exit = how
            if c.restart_requested:
                c.restart_requested = False
                c.restarts += 1
                _log(f"{c.spec.name} stopped ({how}); restarting as requested")
                self._spawn(c)
            else:
                c.status = ProcStatus.STOPPED
            return
        said = last_log_line(c.spec.log)
        c.last_exit = how
        _log(f"{c.spec.name} pid {c.popen.pid} died: {how}; last log line: {said!r}")
        if self.starting_up:
            detail = f": {said}" if said else ""
            raise StartFailure(f"{c.spec.name} ({c.spec.address}) {how} while starting{detail} "
                               f"(log: {c.spec.log})")
        delay = c.tracker.on_crash(now)
        if delay is None:
            c.status = ProcStatus.FAILED
            _log(f"{c.spec.name} crashed {c.tracker.recent_crashes(now)} times within "
                 f"{c.tracker.policy.window:g}s; giving up")
        else:
            c.status = ProcStatus.BACKOFF
            c.restart_at = now + delay
            _log(f"restarting {c.spec.name} in {delay:g}s")

    def _stop_all(self) -> None:
        """Stop the router, then the shards; SIGKILL whatever outlives stop_timeout."""
        routers = [c for c in self.children if c.spec.role == "router"]
        shards = [c for c in self.children if c.spec.role != "router"]
        for group in (routers, shards):
            for c in group:
                c.restart_requested = False
                if c.alive:
                    _log(f"stopping {c.spec.name} pid {c.popen.pid}")
                    c.signal(signal.SIGTERM)
                    c.status = ProcStatus.STOPPING
                    c.deadline = time.monotonic() + self.stop_timeout
                elif c.status != ProcStatus.STOPPED:
                    c.status = ProcStatus.STOPPED
            self.save()
            while any(c.alive for c in group):
                now = time.monotonic()
                for c in group:
                    if c.alive and now >= c.deadline:
                        _log(f"{c.spec.name} still running after "
                             f"{self.stop_timeout:g}s; sending SIGKILL")
                        c.signal(signal.SIGKILL)
                        c.deadline = now + 3600
                time.sleep(TICK / 2)
            for c in group:
                if c.popen is not None and c.status == ProcStatus.STOPPING:
                    c.last_exit = describe_exit(c.popen.returncode)
                    if c.deadline > time.monotonic() + 60:  # we had to SIGKILL it
                        c.last_exit += " after stop timeout"
                    c.status = ProcStatus.STOPPED
                c.kill_workers()
            self.save()

    def restart(self, name: str) -> dict:
        """Operator restart of one process: graceful stop, then start (crash history reset)."""
        match = [c for c in self.children if c.spec.name == name]
        if not match:
            names = ", ".join(c.spec.name for c in self.children)
            return {"ok": False, "error": f"no process named {name!r} (have: {names})"}
        c = match[0]
        c.tracker.reset()
        old = c.popen.pid if c.popen else None
        if c.alive:
            _log(f"restart of {name} requested; stopping pid {old}")
            c.restart_requested = True
            c.status = ProcStatus.STOPPING
            c.deadline = time.monotonic() + self.cfg.supervisor.stop_timeout
            c.signal(signal.SIGTERM)
        else:
            _log(f"restart of {name} requested; starting it")
            c.restarts += 1
            self._spawn(c)
        self.save()
        return {"ok": True, "old_pid": old}

    # -- control socket --------------------------------------------------------------------
    def _open_control(self) -> None:
        path = cs.control_path(self.cfg.data_dir)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if len(path.encode()) < 100:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            s.bind(path)
            self.control_addr = path
        else:  # too long for sun_path: a Linux abstract socket named after the directory
            tag = hashlib.sha1(self.cfg.data_dir.encode()).hexdigest()[:20]
            s.bind(f"\0sievekv-{tag}")
            self.control_addr = f"@sievekv-{tag}"
        s.listen(8)
        s.setblocking(False)
        self.control = s

    def _serve_control(self, timeout: float) -> None:
        if self.control is None:
            time.sleep(timeout)
            return
        try:  # poll, not select: select fails on a descriptor numbered 1024 or more
            poller = select.poll()
            poller.register(self.control, select.POLLIN)
            ready = poller.poll(timeout * 1000)
        except InterruptedError:
            return
        if not ready:
            return
        try:
            conn, _ = self.control.accept()
        except (BlockingIOError, InterruptedError):
            return
        with conn:
            conn.settimeout(2.0)
            try:
                data = b""
                while not data.endswith(b"\n") and len(data) < 65536:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                reply = self._handle(json.loads(data or b"{}"))
            except (OSError, ValueError) as exc:
                reply = {"ok": False, "error": f"bad request: {exc}"}
            try:
                conn.sendall((json.dumps(reply) + "\n").encode())
            except OSError:
                pass

    def _handle(self, req: dict) -> dict:
        op = req.get("op")
        if op == "ping":
            return {"ok": True, "pid": os.getpid(), "state": self.state}
        if op == "restart":
            return self.restart(str(req.get("name")))
        if op == "stop":
            t = req.get("timeout")
            if t is not None:
                if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0 \
                        or not math.isfinite(t):
                    return {"ok": False, "error": f"stop timeout must be a number > 0, got {t!r}"}
                self.stop_timeout = float(t)
            self.terminate = True
            return {"ok": True}
        return {"ok": False, "error": f"unknown op {op!r}"}


def control_request(address: str, request: dict, timeout: float = 5.0) -> dict:
    """Send one request to a supervisor's control socket and return its reply.

    Raises OSError if nobody answers.
    """
    target = "\0" + address[1:] if address.startswith("@") else address
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(target)
        s.sendall((json.dumps(request) + "\n").encode())
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    try:
        return json.loads(data)
    except ValueError:
        raise OSError(f"unreadable reply from supervisor: {data[:100]!r}") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m router.supervisor",
                                 description="Own and supervise a local sievekv cluster.")
    ap.add_argument("--config", help="cluster config (TOML); default: the embedded one")
    ap.add_argument("--data-dir", help="overrides the config's data_dir")
    ap.add_argument("--ready-fd", type=int, help="pipe to report progress on (JSON lines)")
    args = ap.parse_args(argv)
    try:
        cfg = load(args.config, data_dir=args.data_dir)
    except ConfigError as exc:
        if args.ready_fd is not None:
            os.write(args.ready_fd, (json.dumps({"event": "error", "kind": "config",
                                                 "message": str(exc)}) + "\n").encode())
        print(f"supervisor: {exc}", file=sys.stderr)
        return 2
    _log(f"supervising cluster in {cfg.data_dir} (config: {cfg.source})")
    return Supervisor(cfg, args.ready_fd).run()


if __name__ == "__main__":
    sys.exit(main())
