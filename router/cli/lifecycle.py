"""``sievekv cluster start | stop | restart``: run a local cluster through its supervisor.

``start`` spawns ``python -m router.supervisor`` detached (new session, stdin /dev/null, output
to ``<data_dir>/logs/supervisor.log``) and follows its progress on a pipe until ``ready`` or
``error``; on any failure it makes sure the supervisor's whole process group is gone before
returning, so nothing is left running. ``stop`` signals the supervisor and then deals with any
recorded process that outlived it; only processes whose pid *and* start time match the state
file are ever signalled.
"""

from __future__ import annotations

import io
import json
import os
import select
import signal
import subprocess
import sys
import time

from engine.errors import LockedError
from engine.vfs import FileSystem

from .. import cluster_state as cs
from .. import launch, preflight
from .. import restore_journal as rj
from ..config import DEFAULT_CONFIG_NAME, ClusterConfig
from ..humanize import format_counted, format_duration
from ..supervisor import control_request
from . import target
from .exit_codes import CONFLICT, ERROR, OK, PARTIAL, UNREACHABLE, USAGE, CliError

SUPERVISOR_MODULE = "router.supervisor"


def _say(args, msg: str) -> None:
    if not getattr(args, "quiet", False):
        print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# start
# ---------------------------------------------------------------------------------------------

def cmd_start(args) -> int:
    cfg = target.load_config(args)
    t0 = time.monotonic()
    try:  # before anything is created in it
        preflight.check_data_dir(cfg.data_dir)
    except preflight.PreflightError as exc:
        raise CliError(f"{exc}; nothing was started", USAGE) from None
    _check_not_running(cfg)
    where = cfg.router.address if cfg.router.port else f"{cfg.router.host}:(a free port)"
    _say(args, f"starting sievekv: {format_counted(len(cfg.shards), 'shard')}, router on {where}, "
               f"data in {cfg.data_dir}")
    ready = start_supervisor(cfg, on_event=lambda ev: _progress(args, ev))
    took = time.monotonic() - t0
    _say(args, f"cluster is up in {took:.1f}s (supervisor pid {ready['pid']}); "
               f"router at {ready['router']}")
    print(ready["router"], flush=True)
    return OK


def _make_dirs(cfg: ClusterConfig) -> None:
    try:
        os.makedirs(os.path.join(cfg.data_dir, cs.LOG_DIR), exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot create data directory {cfg.data_dir}: {cs.os_reason(exc)}",
                       USAGE if cs.unusable_data_dir(exc) else ERROR) from None


def _check_not_running(cfg: ClusterConfig) -> None:
    """Fail fast (CONFLICT) if a supervisor holds the data directory's lock; USAGE or ERROR
    (see cluster_state.unusable_data_dir) if the lock file cannot be opened at all."""
    _make_dirs(cfg)
    path = cs.lock_path(cfg.data_dir)
    try:
        FileSystem().lock(path).release()
    except LockedError:
        restore = rj.running(cfg.data_dir)
        if restore:
            raise CliError(f"data directory {cfg.data_dir} is locked by "
                           f"{rj.running_line(restore)}: wait for it to end, then start the "
                           f"cluster", CONFLICT) from None
        owner = ""
        try:
            pid = cs.read_state(cfg.data_dir).get("supervisor", {}).get("pid")
            owner = f" (supervisor pid {pid})" if pid else ""
        except cs.StateError:
            pass
        raise CliError(f"data directory {cfg.data_dir} is locked by a running cluster{owner}; "
                       f"stop it first with `sievekv cluster stop`", CONFLICT) from None
    except OSError as exc:  # StorageIOError: EROFS, EACCES, EISDIR, EIO...
        raise CliError(f"cannot open the cluster lock {path}: {cs.os_reason(exc)}",
                       USAGE if cs.unusable_data_dir(exc) else ERROR) from None


def _progress(args, ev: dict) -> None:
    if ev.get("event") == "spawn":
        _say(args, f"  {ev['name']:<10} {ev['address']:<22} starting (pid {ev['pid']})")
    elif ev.get("event") == "serving":
        _say(args, f"  {ev['name']:<10} {ev['address']:<22} SERVING after {ev['seconds']:.1f}s")


def supervisor_argv(cfg: ClusterConfig, ready_fd: int) -> list[str]:
    argv = [sys.executable, "-m", SUPERVISOR_MODULE, "--data-dir", cfg.data_dir,
            "--ready-fd", str(ready_fd)]
    if cfg.source != DEFAULT_CONFIG_NAME:
        argv += ["--config", cfg.source]
    return argv


def start_supervisor(cfg: ClusterConfig, on_event=None, argv: list[str] | None = None) -> dict:
    """Spawn the supervisor and wait for its ``ready`` event (returned).

    Raises CliError when it reports an error, dies, or misses the deadline; in every such case
    its process group has been killed before this returns. ``argv`` (with ``{fd}`` standing
    for the pipe's descriptor) replaces the default command line; tests use it.
    """
    _make_dirs(cfg)
    r, w = os.pipe()
    cmd = supervisor_argv(cfg, w) if argv is None else [a.replace("{fd}", str(w)) for a in argv]
    log = cs.log_path(cfg.data_dir, "supervisor")
    with open(log, "ab") as logf:
        proc = subprocess.Popen(cmd, start_new_session=True, stdin=subprocess.DEVNULL,
                                stdout=logf, stderr=subprocess.STDOUT, pass_fds=(w,),
                                env=launch.child_env(), cwd=cfg.data_dir)
    os.close(w)
    sup = cfg.supervisor
    deadline = time.monotonic() + 2 * sup.start_timeout + sup.stop_timeout + 10
    try:
        for ev in _events(r, deadline):
            if on_event:
                on_event(ev)
            if ev.get("event") == "ready":
                return ev
            if ev.get("event") == "error":
                _reap(proc, sup.stop_timeout * 2 + 5)
                kind = ev.get("kind")
                code = CONFLICT if kind == "conflict" else USAGE if kind == "config" else ERROR
                raise CliError(ev.get("message", "the cluster failed to start"), code)
        if time.monotonic() >= deadline:
            proc.send_signal(signal.SIGTERM)
            _reap(proc, sup.stop_timeout * 2 + 5)
            raise CliError(f"the cluster did not start in time (see {log})", ERROR)
        _reap(proc, sup.stop_timeout * 2 + 5)
        raise CliError(f"the supervisor exited during start ({_describe(proc.returncode)}): "
                       f"{_last_line(log)} (log: {log})", ERROR)
    except BaseException:
        if proc.returncode is None:  # not reaped yet: stop it and its group
            proc.send_signal(signal.SIGTERM)
            _reap(proc, sup.stop_timeout * 2 + 5)
        raise
    finally:
        os.close(r)


def _events(fd: int, deadline: float):
    """JSON events from the pipe until EOF or the deadline. (poll, not select: select fails
    on a descriptor numbered 1024 or more, as in a process with many files open.)"""
    buf = b""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        if not poller.poll(min(left, 1.0) * 1000):
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                yield json.loads(line)
            except ValueError:
                continue


def _reap(proc: subprocess.Popen, timeout: float) -> None:
    """Wait for the supervisor to exit, then SIGKILL anything left in its process group.

    The supervisor is waited for without being reaped (WNOWAIT), so its pid, which is also
    the group id, cannot be reused by a stranger before the group is killed.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            break
        if info is not None:
            break
        time.sleep(0.05)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _describe(rc: int | None) -> str:
    if rc is None:
        return "still running"
    if rc < 0:
        return f"killed by {signal.Signals(-rc).name}"
    return f"exit code {rc}"


def _last_line(path: str) -> str:
    from ..supervisor import last_log_line

    return last_log_line(path) or "no output"


# ---------------------------------------------------------------------------------------------
# stop
# ---------------------------------------------------------------------------------------------

def cmd_stop(args, out=None) -> int:
    """Stop the cluster; one line per process on ``out`` (stdout by default)."""
    out = out or sys.stdout
    doc = target.read_state(args)
    data_dir = doc["data_dir"]
    stop_timeout = float(doc.get("config", {}).get("supervisor", {}).get("stop_timeout", 10.0))
    if getattr(args, "timeout", None):
        stop_timeout = args.timeout
    sup = doc.get("supervisor") or {}
    before = {p["name"]: p for p in doc.get("processes", [])}
    was_alive = {name: cs.pid_alive(p.get("pid"), p.get("create_time"))
                 for name, p in before.items()}

    if cs.pid_alive(sup.get("pid"), sup.get("create_time")):
        _say(args, f"stopping the cluster in {data_dir} (supervisor pid {sup['pid']})")
        asked = False
        if getattr(args, "timeout", None) and sup.get("control"):
            # The supervisor is told the timeout: it, not this command, SIGKILLs what outlives it.
            try:
                asked = control_request(sup["control"], {"op": "stop", "timeout": stop_timeout}
                                        ).get("ok", False)
            except OSError:
                asked = False
        if not asked:
            os.kill(sup["pid"], signal.SIGTERM)
        # The supervisor stops the router, then the shards, each within stop_timeout.
        if not _wait_gone(sup["pid"], sup.get("create_time"), 2 * stop_timeout + 10):
            _say(args, f"supervisor pid {sup['pid']} did not exit; sending SIGKILL")
            _kill(sup["pid"], sup.get("create_time"), signal.SIGKILL)
    elif not any(was_alive.values()):
        restore = rj.running(data_dir)
        busy = f"; {rj.running_line(restore)} is running in it" if restore else ""
        _say(args, f"the cluster in {data_dir} is already stopped{busy}")
    else:
        _say(args, f"supervisor of {data_dir} is not running; stopping its processes directly")

    try:
        doc = cs.read_state(data_dir)
    except cs.StateError:
        pass
    leftovers = []
    for name, pid, ct in cs.recorded_pids(doc):
        if name != "supervisor" and cs.pid_alive(pid, ct):
            leftovers.append((name, pid, ct))
    forced = {}
    for name, pid, ct in leftovers:
        _kill(pid, ct, signal.SIGTERM)
    for name, pid, ct in leftovers:
        if _wait_gone(pid, ct, stop_timeout):
            forced[name] = "stopped by SIGTERM from the CLI"
        else:
            _kill(pid, ct, signal.SIGKILL)
            _wait_gone(pid, ct, 5)
            forced[name] = "killed (SIGKILL) after the stop timeout"

    still = [(n, p) for n, p, ct in cs.recorded_pids(doc) if cs.pid_alive(p, ct)]
    for p in doc.get("processes", []):
        name = p["name"]
        if name in forced:
            how = forced[name]
        elif not was_alive.get(name):
            how = f"was not running ({p.get('status')}" + (
                f", last exit: {p['last_exit']})" if p.get("last_exit") else ")")
        else:
            how = f"stopped ({p.get('last_exit') or 'exited'})"
        print(f"{name:<10} pid {p.get('pid') or '-':<8} {how}", file=out, flush=True)
    if doc.get("state") not in ("stopped",) and not cs.pid_alive(sup.get("pid"),
                                                                  sup.get("create_time")):
        doc["state"] = "stopped"
        for p in doc.get("processes", []):
            p["status"] = cs.ProcStatus.STOPPED
        cs.write_state(data_dir, doc)
    if still:
        names = ", ".join(f"{n} (pid {p})" for n, p in still)
        raise CliError(f"could not stop {names}", ERROR)
    return OK


def _wait_gone(pid: int, ct: float | None, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not cs.pid_alive(pid, ct):
            return True
        time.sleep(0.05)
    return not cs.pid_alive(pid, ct)


def _kill(pid: int, ct: float | None, sig: int) -> None:
    if cs.pid_alive(pid, ct):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


# ---------------------------------------------------------------------------------------------
# restart
# ---------------------------------------------------------------------------------------------

def cmd_restart(args) -> int:
    if args.shard is None:
        return _restart_cluster(args)
    doc = target.read_state(args)
    sup = doc.get("supervisor") or {}
    if not cs.pid_alive(sup.get("pid"), sup.get("create_time")):
        raise CliError(f"the supervisor of {doc['data_dir']} is not running "
                       f"(start the cluster with `sievekv cluster start`)", UNREACHABLE)
    shards = sorted(p["shard"] for p in doc.get("processes", []) if p.get("role") == "shard")
    if args.shard not in shards:
        have = (f"0..{len(shards) - 1}" if shards == list(range(len(shards)))
                else ", ".join(map(str, shards)))
        raise CliError(f"--shard: no shard {args.shard} in this cluster (shards: {have})", USAGE)
    name = f"shard-{args.shard}"
    t0 = time.monotonic()
    try:
        reply = control_request(sup["control"], {"op": "restart", "name": name})
    except OSError as exc:
        raise CliError(f"cannot reach the supervisor at {sup['control']}: {exc}",
                       UNREACHABLE) from None
    if not reply.get("ok"):
        raise CliError(reply.get("error", "restart refused"), USAGE)
    old = reply.get("old_pid")
    cfg = doc.get("config", {}).get("supervisor", {})
    deadline = t0 + float(cfg.get("stop_timeout", 10)) + float(cfg.get("start_timeout", 30)) + 5
    while time.monotonic() < deadline:
        time.sleep(0.1)
        try:
            now = cs.read_state(doc["data_dir"])
        except cs.StateError:
            continue
        p = next((x for x in now.get("processes", []) if x["name"] == name), None)
        if p and p.get("pid") != old and p.get("status") == cs.ProcStatus.SERVING:
            _say(args, f"{name} restarted in {time.monotonic() - t0:.1f}s: "
                       f"pid {old or '-'} -> {p['pid']}, SERVING on {p['address']}")
            return OK
        if p and p.get("status") == cs.ProcStatus.FAILED:
            raise CliError(f"{name} failed to restart ({p.get('last_exit')}; log: {p.get('log')})",
                           PARTIAL)
    raise CliError(f"{name} did not come back within "
                   f"{format_duration(deadline - t0)}", PARTIAL)


def _restart_cluster(args) -> int:
    """Stop, then start with the same config (a file is re-read: edits take effect). Like
    ``start``, stdout gets only the router address; the stop report goes to stderr. A config
    that cannot be loaded, whose slot layout is not the data directory's, or whose [tls] files
    cannot be used (missing, unreadable, a key that does not match) is refused (USAGE) before
    anything is stopped: the start would refuse it and leave the cluster down."""
    doc = target.read_state(args)
    source = doc.get("config", {}).get("source")
    if not getattr(args, "config", None) and source and source != DEFAULT_CONFIG_NAME:
        args.config = source
    if not getattr(args, "data_dir", None):
        args.data_dir = doc["data_dir"]
    cfg = target.load_config(args)
    try:
        preflight.check_layout(cfg, record=False)
    except preflight.PreflightError as exc:
        raise CliError(f"{exc}; nothing was stopped", USAGE) from None
    from shard.tls import TlsError  # imports grpc: only here, as the start would

    try:  # the supervisor's check at start (launch.client_tls), in the same words
        launch.client_tls(cfg)
    except TlsError as exc:
        raise CliError(f"config {cfg.source}: [tls]: {exc}; nothing was stopped",
                       USAGE) from None
    cmd_stop(args, out=io.StringIO() if getattr(args, "quiet", False) else sys.stderr)
    return cmd_start(args)
