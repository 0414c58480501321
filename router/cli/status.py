"""``sievekv cluster status``: one row per process, from the state file plus live checks.

For every process recorded by the supervisor: is the recorded pid (with its start time) alive,
what does its gRPC health service say, since when has it run; for shards also the engine's own
numbers, asked of the shard directly (Admin.Stats and Admin.FilterReport), so the table is
right even while the router is down. ``--json`` gives the same with raw numbers, plus metrics
ports and URLs.

Exit code: 0 when the supervisor runs and every process is SERVING, 4 (PARTIAL) when some are
not, 3 (UNREACHABLE) when the cluster is not running at all.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import grpc

from .. import cluster_state as cs
from .. import health_probe
from .. import restore_journal as rj
from ..config import split_address
from ..humanize import format_bytes, format_count, format_duration
from . import rpc, target
from .exit_codes import OK, PARTIAL, UNREACHABLE
from .table import render

STATUS_TIMEOUT = 2.0
# Recorded statuses of a process that is not meant to run; any other status with no live pid
# is shown as "dead" (the supervisor died and did not record the exit).
_NOT_RUNNING = ("failed", "backoff", "stopped")


def shard_numbers(stats: dict, filters: dict) -> dict:
    """Keys, resident filter bytes (and the parts they come from) out of one shard's reports.

    ``keys`` is an estimate, as in any LSM: entries in tables minus tombstones plus entries in
    the active memtable (an overwritten key counts once per version still stored).
    """
    levels = stats.get("levels", [])
    entries = sum(lv.get("entries", 0) - lv.get("tombstones", 0) for lv in levels)
    mem = stats.get("memtable", {}).get("entries", 0)
    return {
        "keys": entries + mem,
        "tables": sum(lv.get("tables", 0) for lv in levels),
        "table_bytes": stats.get("total_table_bytes"),
        "filter_resident_bytes": filters.get("totals", {}).get("resident_bytes"),
        "filter_bytes": filters.get("totals", {}).get("filter_bytes"),
    }


def disk_bytes(path: str | None) -> int | None:
    """Bytes of every file under ``path`` (the shard's directory: tables, logs, manifest)."""
    if not path or not os.path.isdir(path):
        return None
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_size
            except OSError:
                pass  # removed while we walked (compaction): not on disk any more
    return total


def _probe(p: dict, now: float) -> dict:
    alive = cs.pid_alive(p.get("pid"), p.get("create_time"))
    row = {
        "name": p["name"], "role": p["role"], "shard": p.get("shard"), "pid": p.get("pid"),
        "alive": alive, "address": p["address"], "status": p.get("status"),
        "health": health_probe.probe(p["address"], STATUS_TIMEOUT, tls=rpc.tls()) if alive else "DOWN",
        "uptime_s": (now - p["started_at"]) if alive and p.get("started_at") else None,
        "restarts": p.get("restarts", 0), "last_exit": p.get("last_exit"),
        "workers": len(p.get("children") or []),
        "metrics_port": p.get("metrics_port") or None,
        "metrics_url": None, "log": p.get("log"), "data_dir": p.get("data_dir"),
        "keys": None, "tables": None, "table_bytes": None, "filter_bytes": None,
        "filter_resident_bytes": None, "error": None,
        "disk_bytes": disk_bytes(p.get("data_dir")) if p["role"] == "shard" else None,
    }
    if row["metrics_port"]:
        host, _ = split_address(p["address"])
        row["metrics_url"] = f"http://{host}:{row['metrics_port']}/metrics"
    if p["role"] == "shard" and row["health"] == health_probe.SERVING:
        try:
            stats = rpc.report_json(p["address"], "Stats", STATUS_TIMEOUT)
            filters = rpc.report_json(p["address"], "FilterReport", STATUS_TIMEOUT)
            row.update(shard_numbers(next(iter(stats.get("shards", {}).values()), {}),
                                     next(iter(filters.get("shards", {}).values()), {})))
        except grpc.RpcError as exc:
            row["error"] = f"{exc.code().name}: {exc.details()}"
    return row


def collect(doc: dict) -> dict:
    """The status document (what ``--json`` prints)."""
    now = time.time()
    sup = doc.get("supervisor") or {}
    sup_alive = cs.pid_alive(sup.get("pid"), sup.get("create_time"))
    procs = doc.get("processes", [])
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(procs)))) as pool:
        rows = list(pool.map(lambda p: _probe(p, now), procs))
    slots = {s["index"]: [s["slot_start"], s["slot_end"]]
             for s in doc.get("config", {}).get("shards", [])}
    for r in rows:
        if r["shard"] is not None:
            r["slots"] = slots.get(r["shard"])
    serving = sum(1 for r in rows if r["health"] == health_probe.SERVING)
    if not sup_alive and serving == 0:
        overall = "stopped" if doc.get("state") in ("stopped", "failed") else "down"
    elif sup_alive and serving == len(rows) and doc.get("state") == "running":
        overall = "running"
    else:
        overall = "degraded"
    return {
        "cluster": overall,
        "recorded_state": doc.get("state"),
        "error": doc.get("error"),
        "data_dir": doc.get("data_dir"),
        "router_address": doc.get("router_address"),
        "supervisor": {"pid": sup.get("pid"), "alive": sup_alive,
                       "uptime_s": (now - sup["started_at"]) if sup_alive and sup.get(
                           "started_at") else None,
                       "log": sup.get("log")},
        "processes": rows,
        "restore": rj.running(doc["data_dir"]) if doc.get("data_dir") else None,
        "totals": {k: (sum(r[k] for r in rows if r[k] is not None)
                       if any(r[k] is not None for r in rows) else None)
                   for k in ("keys", "disk_bytes", "filter_resident_bytes")},
    }


def cmd_status(args) -> int:
    st = collect(target.read_state(args))
    if args.json:
        print(json.dumps(st, indent=2, sort_keys=True))
    else:
        print(render_text(st))
    if st["cluster"] == "running":
        return OK
    if st["cluster"] in ("stopped", "down"):
        return UNREACHABLE
    return PARTIAL


def render_text(st: dict) -> str:
    sup = st["supervisor"]
    head = (f"cluster {st['cluster']}: router {st['router_address']}, data {st['data_dir']}, "
            f"supervisor " + (f"pid {sup['pid']} up {format_duration(sup['uptime_s'])}"
                              if sup["alive"] else "not running"))
    if st.get("error"):
        head += f"\nlast error: {st['error']}"
    if st.get("restore"):
        head += f"\n{rj.running_line(st['restore'])} holds the data directory"
    rows = []
    for r in st["processes"]:
        status = r["status"] if r["alive"] or r["status"] in _NOT_RUNNING else "dead"
        rows.append([r["name"], r["role"], "-" if r["shard"] is None else r["shard"],
                     r["pid"] if r["alive"] else "-", r["address"], status, r["health"],
                     format_duration(r["uptime_s"]), r["restarts"], format_count(r["keys"]),
                     format_bytes(r["disk_bytes"]), format_bytes(r["filter_resident_bytes"])])
    t = st["totals"]
    rows.append(["total", "", "", "", "", "", "", "", "", format_count(t["keys"]),
                 format_bytes(t["disk_bytes"]), format_bytes(t["filter_resident_bytes"])])
    table = render(["NAME", "ROLE", "SHARD", "PID", "ADDRESS", "STATUS", "HEALTH", "UPTIME",
                    "RESTARTS", "KEYS", "DISK", "FILTERS RES"], rows)
    notes = [f"{r['name']}: last exit {r['last_exit']}"
             for r in st["processes"] if r["status"] in ("failed", "backoff") and r["last_exit"]]
    return "\n".join([head, table] + notes)
