"""The cluster state file and the data-directory layout of a local cluster.

The supervisor owns ``<data_dir>/cluster-state.json`` and rewrites it (write a temporary
file, fsync, rename, fsync the directory) whenever a process starts, becomes healthy, dies or
stops; the CLI only reads it. A reader therefore sees the previous or the next version, never
a torn one. Schema (version 1)::

    {"version": 1, "state": "starting" | "running" | "stopping" | "stopped" | "failed",
     "error": str | null, "updated_at": unix seconds,
     "data_dir": abs path, "config": ClusterConfig.to_dict(), "router_address": "host:port",
     "supervisor": {"pid", "create_time", "started_at", "control": socket path, "log"},
     "processes": [{"name": "shard-0" | "router", "role": "shard" | "router",
                    "shard": int | null, "address", "metrics_port": int (0 = off),
                    "pid": int | null, "create_time": float | null, "children": [[pid, ct]...],
                    "status": see ProcStatus, "restarts": int, "started_at": float | null,
                    "last_exit": str | null, "log": path, "data_dir": path | null}]}

A pid is trusted only with its create time (:func:`pid_alive`): after a reboot or a crash the
number may belong to someone else, and the CLI never signals a process it cannot identify.

The cluster lock (``<data_dir>/cluster.lock``) is an exclusive flock held by the supervisor for
its whole life, taken with engine.vfs's FileSystem.lock.
"""

from __future__ import annotations

import errno
import json
import os
import time

import psutil

from engine.vfs import FileSystem, default_fs

STATE_VERSION = 1
STATE_FILE = "cluster-state.json"
LOCK_FILE = "cluster.lock"
CLUSTER_MAP_FILE = "cluster-map.toml"
LAYOUT_FILE = "cluster-layout.json"
LOG_DIR = "logs"
CONTROL_SOCKET = "supervisor.sock"


class ProcStatus:
    """Values of a process entry's ``status``."""

    STARTING = "starting"  # spawned, not yet SERVING
    SERVING = "serving"  # health check said SERVING
    BACKOFF = "backoff"  # died; will be restarted after a delay
    FAILED = "failed"  # died too often; the supervisor gave up
    STOPPING = "stopping"
    STOPPED = "stopped"


def state_path(data_dir: str) -> str:
    return os.path.join(data_dir, STATE_FILE)


def lock_path(data_dir: str) -> str:
    return os.path.join(data_dir, LOCK_FILE)


def log_path(data_dir: str, name: str) -> str:
    return os.path.join(data_dir, LOG_DIR, f"{name}.log")


def shard_dir(data_dir: str, index: int) -> str:
    return os.path.join(data_dir, f"shard-{index}")


def control_path(data_dir: str) -> str:
    return os.path.join(data_dir, CONTROL_SOCKET)


# errnos of a data directory the operator must fix (permissions, a read-only mount, a file
# where a directory belongs or the other way round): a usage error, not an I/O failure.
_UNUSABLE_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.EISDIR, errno.ENOTDIR,
                    errno.EEXIST, errno.ENOENT, errno.ELOOP, errno.ENAMETOOLONG}


def unusable_data_dir(exc: OSError) -> bool:
    """True if ``exc``, from creating or writing a file of the data directory, says the
    directory cannot be used as it is (fix and retry); False for an I/O failure (full disk, EIO)."""
    return exc.errno in _UNUSABLE_ERRNOS


def os_reason(exc: OSError) -> str:
    """The reason of ``exc`` alone, e.g. "Is a directory" (no errno number, no path)."""
    return os.strerror(exc.errno) if exc.errno else (str(exc) or type(exc).__name__)


class StateError(Exception):
    """The state file is missing or unreadable. ``str()`` is one line for the user."""


def read_state(data_dir: str) -> dict:
    """Parse the state file of ``data_dir``; raises StateError if absent or damaged."""
    path = state_path(data_dir)
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except FileNotFoundError:
        raise StateError(f"no cluster state at {path} (was the cluster started with this "
                         f"--config / --data-dir?)") from None
    except (OSError, ValueError) as exc:
        raise StateError(f"cannot read cluster state {path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("version") != STATE_VERSION:
        raise StateError(f"cluster state {path} has an unknown format version")
    return doc


def write_state(data_dir: str, doc: dict, fs: FileSystem | None = None) -> None:
    """Atomically replace the state file with ``doc`` (``updated_at`` is set here)."""
    fs = fs or default_fs()
    doc["version"] = STATE_VERSION
    doc["updated_at"] = time.time()
    path = state_path(data_dir)
    replace_file(fs, data_dir, path, f"{path}.tmp.{os.getpid()}",
                 json.dumps(doc, indent=1, sort_keys=True).encode())


def replace_file(fs: FileSystem, data_dir: str, path: str, tmp: str, data: bytes) -> None:
    """Atomically make ``data`` the contents of ``path`` in ``data_dir``: written to ``tmp``,
    synced, renamed over ``path``, directory synced. A failed write or rename removes ``tmp``
    (a full disk leaves nothing behind) and raises."""
    try:
        f = fs.open_writable(tmp)
        try:
            f.append(data)
            f.sync()
        finally:
            f.close()
        fs.rename(tmp, path)
    except BaseException:
        try:
            fs.remove(tmp)
        except OSError:
            pass
        raise
    fs.sync_dir(data_dir)


def process_identity(pid: int) -> float | None:
    """The create time of ``pid`` (psutil's), or None if no such process."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:
        return None


def pid_alive(pid: int | None, create_time: float | None) -> bool:
    """True iff ``pid`` runs and is the same process that was recorded (same create time).

    A zombie (exited, not yet reaped) counts as not alive.
    """
    if not pid or create_time is None:
        return False
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        return abs(p.create_time() - create_time) < 0.05
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False


def recorded_pids(doc: dict) -> list[tuple[str, int, float]]:
    """Every (name, pid, create_time) the state file names: supervisor, processes, children."""
    out = []
    sup = doc.get("supervisor") or {}
    if sup.get("pid"):
        out.append(("supervisor", sup["pid"], sup.get("create_time")))
    for p in doc.get("processes", []):
        if p.get("pid"):
            out.append((p["name"], p["pid"], p.get("create_time")))
        for cpid, ct in p.get("children") or []:
            out.append((f"{p['name']} worker", cpid, ct))
    return out
