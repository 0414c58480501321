"""Can this cluster start here? Port and data-layout checks done before anything is spawned.

* :func:`busy_ports` finds configured ports that something already listens on. gRPC servers
  bind with SO_REUSEPORT, so a second server on a taken port would start *and share the port*
  with the first: the check binds without SO_REUSEPORT, which any listener blocks.
* :func:`pick_free_ports` resolves ``port = 0`` to concrete ports once, at cluster start, so a
  restarted shard comes back where the router expects it.
* :func:`check_layout` refuses a config whose shard slot ranges differ from those the data
  directory was created with: keys would be looked up on the wrong shard.
* :func:`check_data_dir` refuses a data directory that is a shard's engine directory (it
  holds CURRENT, LOCK, MANIFEST-*, tables or logs) or lies directly inside another cluster's
  data directory: ``--data-dir DATA/shard-0`` is a likely slip, and a cluster started there
  would write its own files and shards among that engine's.
* :func:`check_no_restore` refuses a data directory that holds an interrupted ``cluster
  restore`` or ``cluster reshard`` (router/restore_journal.py): it may hold some shards
  restored (resharded) and others not.

Each function returns or raises plain values; no process is started.
"""

from __future__ import annotations

import json
import os
import socket

from . import cluster_state as cs
from . import restore_journal
from .config import ClusterConfig
from .humanize import format_counted


class PreflightError(Exception):
    """``str()`` is one line for the user; ``kind`` is "conflict" or "config"."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def port_is_free(host: str, port: int) -> bool:
    """True if nothing listens on host:port (a bind without SO_REUSEPORT succeeds)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        # SO_REUSEADDR: connections left in TIME_WAIT by a previous run are not "in use".
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def busy_ports(cfg: ClusterConfig) -> list[tuple[str, str, int]]:
    """[(who, host, port)] of every configured non-zero port that is taken."""
    wanted = [("router", cfg.router.host, cfg.router.port)]
    for i in range(cfg.router.processes if cfg.router.metrics_port else 0):
        who = "router metrics" + (f" (router process {i})" if i else "")
        wanted.append((who, cfg.router.host, cfg.router.metrics_port + i))
    for s in cfg.shards:
        wanted.append((s.name, s.host, s.port))
        if s.metrics_port:
            wanted.append((f"{s.name} metrics", s.host, s.metrics_port))
    return [(who, h, p) for who, h, p in wanted if p and not port_is_free(h, p)]


def pick_free_ports(host_count: list[str]) -> list[int]:
    """One distinct free port per entry of ``host_count`` (a list of hosts)."""
    socks, ports = [], []
    try:
        for host in host_count:
            s = socket.socket(_family(host), socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def resolve_ports(cfg: ClusterConfig) -> ClusterConfig:
    """``cfg`` with every gRPC port 0 replaced by a free port."""
    zero = [s for s in cfg.shards if s.port == 0]
    hosts = [s.host for s in zero] + ([cfg.router.host] if cfg.router.port == 0 else [])
    if not hosts:
        return cfg
    ports = iter(pick_free_ports(hosts))
    shard_ports = [s.port or next(ports) for s in cfg.shards]
    router_port = next(ports) if cfg.router.port == 0 else None
    return cfg.with_ports(router_port, shard_ports)


def check_ports(cfg: ClusterConfig) -> None:
    busy = busy_ports(cfg)
    if busy:
        who, h, p = busy[0]
        more = f" (and {len(busy) - 1} more)" if len(busy) > 1 else ""
        raise PreflightError(f"port {p} on {h} ({who}) is already in use{more}", "conflict")


def check_data_dir(data_dir: str) -> None:
    """Raise PreflightError ("config") if ``data_dir`` holds a storage engine's files or its
    parent holds a cluster's state or layout file (see the module doc). Creates nothing."""
    from engine.filenames import FileKind, parse_file_name  # lazy: the CLI's parser skips it

    d = os.path.normpath(data_dir)
    try:
        names = sorted(os.listdir(d))
    except OSError:  # absent (created later) or unreadable (the start names the error)
        names = []
    engine = [n for n in names if (parse_file_name(n) or (None,))[0] in (
        FileKind.CURRENT, FileKind.LOCK, FileKind.MANIFEST, FileKind.TABLE, FileKind.LOG)]
    if engine:
        raise PreflightError(
            f"data directory {d} holds a storage engine's files ({', '.join(engine[:3])}"
            f"{', ...' if len(engine) > 3 else ''}): it is one shard's directory, not a "
            f"cluster's; give the directory that holds the shard-N directories (such as "
            f"{os.path.dirname(d)}) as the data directory", "config")
    parent = os.path.dirname(d)
    marks = [n for n in (cs.STATE_FILE, cs.LAYOUT_FILE) if os.path.exists(os.path.join(parent, n))]
    if marks:
        raise PreflightError(
            f"data directory {d} is inside the data directory of another cluster ({parent} "
            f"holds {marks[0]}); give {parent} itself, or a directory outside it", "config")


def check_no_restore(cfg: ClusterConfig) -> None:
    """Raise PreflightError ("config") while the data directory holds a restore (or reshard)
    journal."""
    why = restore_journal.refusal(cfg.data_dir)
    if why:
        raise PreflightError(why, "config")


def layout_of(cfg: ClusterConfig) -> dict:
    return {"slots": [[s.slot_start, s.slot_end] for s in cfg.shards]}


def check_layout(cfg: ClusterConfig, record: bool = True) -> None:
    """Raise PreflightError if the data directory holds a different shard layout.

    The first start records the layout (``cluster-layout.json``); later starts must match.
    ``record=False`` only checks (a full ``cluster restart`` does, before it stops anything).
    """
    path = os.path.join(cfg.data_dir, cs.LAYOUT_FILE)
    want = layout_of(cfg)
    try:
        with open(path, encoding="utf-8") as f:
            have = json.load(f)
    except FileNotFoundError:
        if not record:
            return
        tmp = path + ".tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(want, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            # A full disk (or Ctrl-C) must not leave a half-written file behind.
            try:
                os.remove(tmp)
            except OSError:
                pass
            raise
        return
    except (OSError, ValueError) as exc:
        raise PreflightError(f"cannot read {path}: {exc}", "config") from None
    if have != want:
        n_have = len(have.get("slots", []))
        raise PreflightError(
            f"{cfg.data_dir} holds a cluster of {format_counted(n_have, 'shard')} with slot ranges "
            f"{_ranges(have)}; this config has {format_counted(len(cfg.shards), 'shard')} with "
            f"{_ranges(want)} "
            f"(keys would be looked up on the wrong shard; move the keys to this layout with "
            f"`sievekv cluster reshard`, or use another data_dir)", "config")


def _ranges(layout: dict) -> str:
    return ",".join(f"{lo}-{hi}" for lo, hi in layout.get("slots", []))
