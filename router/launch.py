"""What the supervisor runs: the command line of each shard and router process, and the
cluster map file the router reads.

Pure apart from :func:`write_cluster_map` (one file). The flags are those of
``python -m shard`` (parsed in shard/worker.py) and ``python -m router`` (router/worker.py).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

from . import cluster_state as cs
from .config import ClusterConfig, ShardSpec


@dataclass(frozen=True)
class ProcessSpec:
    """Everything needed to (re)start one process of the cluster."""

    name: str  # "shard-0", ..., "router"
    role: str  # "shard" | "router"
    shard: int | None
    address: str
    metrics_port: int
    argv: tuple[str, ...]
    log: str
    data_dir: str | None  # the shard's own directory


def shard_spec(cfg: ClusterConfig, shard: ShardSpec) -> ProcessSpec:
    ddir = cs.shard_dir(cfg.data_dir, shard.index)
    argv = [sys.executable, "-m", "shard", "--data-dir", ddir, "--listen", shard.address,
            "--name", shard.name, "--max-value-bytes", str(cfg.limits.max_value_size),
            "--drain-grace", f"{drain_grace(cfg):g}", "--exit-with-parent", "--parent-pid", str(os.getpid())]
    for name, value in sorted(engine_overrides(cfg).items()):
        argv += ["--engine-option", f"{name}={json.dumps(value)}"]
    if shard.metrics_port:
        argv += ["--metrics-port", str(shard.metrics_port)]
    argv += server_tls_args(cfg)
    return ProcessSpec(shard.name, "shard", shard.index, shard.address, shard.metrics_port,
                       tuple(argv), cs.log_path(cfg.data_dir, shard.name), ddir)


def engine_overrides(cfg: ClusterConfig) -> dict:
    """The engine options whose configured value differs from the engine's default (the
    value limit travels as --max-value-bytes)."""
    from engine.options import Options

    defaults = {name: default for name, default, _ in Options.describe()}
    return {k: v for k, v in cfg.engine.items()
            if k != "max_value_size" and (k not in defaults or defaults[k] != v)}


def drain_grace(cfg: ClusterConfig) -> float:
    """Seconds a draining process gives in-flight calls: half the stop timeout, so that the
    flush and close that follow still fit before the supervisor's SIGKILL."""
    return max(0.5, cfg.supervisor.stop_timeout / 2)


def router_spec(cfg: ClusterConfig) -> ProcessSpec:
    r = cfg.router
    argv = [sys.executable, "-m", "router", "--cluster-map", cluster_map_path(cfg.data_dir),
            "--listen", r.address, "--processes", str(r.processes),
            "--max-value-bytes", str(cfg.limits.max_value_size),
            "--drain-grace", f"{drain_grace(cfg):g}", "--workers", str(r.workers),
            "--exit-with-parent", "--parent-pid", str(os.getpid())]
    if r.max_calls_per_shard:
        argv += ["--max-calls-per-shard", str(r.max_calls_per_shard)]
    if r.metrics_port:
        argv += ["--metrics-port", str(r.metrics_port)]
    argv += server_tls_args(cfg)
    if cfg.tls.enabled:
        argv += ["--shard-tls-ca", cfg.tls.ca]
        if cfg.tls.client_ca:  # the shards require a client certificate: the same one
            argv += ["--shard-tls-cert", cfg.tls.cert, "--shard-tls-key", cfg.tls.key]
    return ProcessSpec("router", "router", None, r.address, r.metrics_port, tuple(argv),
                       cs.log_path(cfg.data_dir, "router"), None)


def server_tls_args(cfg: ClusterConfig) -> list[str]:
    """The TLS flags of a shard's or the router's listen port ([tls]; none when off)."""
    t = cfg.tls
    if not t.enabled:
        return []
    return ["--tls-cert", t.cert, "--tls-key", t.key] + (
        ["--tls-client-ca", t.client_ca] if t.client_ca else [])


def client_tls(cfg: ClusterConfig):
    """The checked shard.tls.ClientTls with which a client of this cluster (the supervisor's
    health checks, the CLI) connects: the [tls] ca, and cert/key as the client certificate
    when the servers require one; None when TLS is off. Also checks the servers' files.
    Raises shard.tls.TlsError naming the file."""
    from shard import tls

    t = cfg.tls
    if not t.enabled:
        return None
    flags = ("[tls] cert", "[tls] key", "[tls] client_ca")
    tls.server_tls(t.cert, t.key, t.client_ca or None, flags=flags)
    return tls.client_tls(t.ca, t.cert if t.client_ca else None, t.key if t.client_ca else None,
                          flags=("[tls] ca", "[tls] cert", "[tls] key"))


def cluster_map_path(data_dir: str) -> str:
    return os.path.join(data_dir, cs.CLUSTER_MAP_FILE)


def cluster_map_text(cfg: ClusterConfig) -> str:
    """The cluster map (router/cluster_map.py's TOML format) for ``cfg``'s shards."""
    lines = ["# Written by the sievekv supervisor at cluster start; do not edit.",
             "slot_count = 16384", ""]
    for s in cfg.shards:
        lines += ["[[shards]]", f'name = "{s.name}"', f'address = "{s.address}"',
                  f"slots = [[{s.slot_start}, {s.slot_end}]]", ""]
    return "\n".join(lines)


def write_cluster_map(cfg: ClusterConfig) -> str:
    path = cluster_map_path(cfg.data_dir)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(cluster_map_text(cfg))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def child_env() -> dict:
    """The environment of every child: ours, with this source tree importable and unbuffered
    output (so a log ends with the child's last words)."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        env["PYTHONPATH"] = os.pathsep.join([root] + parts)
    env["PYTHONUNBUFFERED"] = "1"
    return env
