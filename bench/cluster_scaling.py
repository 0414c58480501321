"""Cluster scaling: Get and Put throughput of a whole local cluster as shards and router
processes are added, with many client processes (`sievekv bench`), against the one-shard,
one-router cluster measured in the same run.

    python3 bench/cluster_scaling.py [--layouts 1x1,2x1,4x1,8x1,8x2,8x4] [--clients 16]
                                     [--seconds 3] [--keys 20000] [--router-option KEY=VALUE]

A layout SxR is S shards behind R router processes (SO_REUSEPORT). For each layout: start a
cluster with `sievekv cluster start` (free ports, a fresh data directory), preload --keys keys
(`sievekv bench --preload`), run `sievekv bench --op get` and `--op put` with --clients client
processes for --seconds each, stop the cluster. Printed per layout: ops/s, p50/p99 latency and
the ratio to the first layout. Scaling needs cores: on a 2-CPU machine every process shares
the same two, so expect ratios near 1 there. Every cluster started is stopped (also on error).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIG = """
[cluster]
data_dir = "data"
[router]
listen = "127.0.0.1:0"
processes = {routers}
{router_options}
[shards]
count = {shards}
base_port = 0
[supervisor]
start_timeout = 120.0
stop_timeout = 20.0
"""


def sievekv(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.pop("SIEVEKV_CONFIG", None)
    env.pop("SIEVEKV_ROUTER", None)
    return subprocess.run([sys.executable, "-m", "router.cli", *argv], capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=REPO)


def bench(conf: str, op: str, args, preload: bool = False) -> dict:
    argv = ["bench", "--config", conf, "--op", op, "--clients", str(args.clients),
            "--seconds", str(args.seconds), "--keys", str(args.keys), "--json", "--quiet"]
    if preload:
        argv.append("--preload")
    r = sievekv(*argv)
    if r.returncode != 0:
        raise RuntimeError(f"bench {op}: exit {r.returncode}: {r.stderr.strip()}")
    return json.loads(r.stdout)["ops"][op]


def run_layout(shards: int, routers: int, args) -> dict:
    d = tempfile.mkdtemp(prefix=f"sievekv-scale-{shards}x{routers}-")
    conf = os.path.join(d, "cluster.toml")
    with open(conf, "w") as f:
        f.write(CONFIG.format(shards=shards, routers=routers,
                              router_options="\n".join(args.router_option)))
    try:
        r = sievekv("cluster", "start", "--config", conf)
        if r.returncode != 0:
            raise RuntimeError(f"cluster start {shards}x{routers}: {r.stderr.strip()}")
        get = bench(conf, "get", args, preload=True)
        put = bench(conf, "put", args)
        return {"get": get, "put": put}
    finally:
        sievekv("cluster", "stop", "--config", conf, "--timeout", "20")
        shutil.rmtree(d, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layouts", default="1x1,2x1,4x1,8x1,8x2,8x4")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--keys", type=int, default=20000)
    p.add_argument("--router-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a [router] config line for every layout, e.g. max_calls_per_shard=16 "
                        "(TOML value syntax; repeatable)")
    args = p.parse_args()
    layouts = [tuple(int(x) for x in item.split("x")) for item in args.layouts.split(",")]
    print(f"cluster scaling: {args.clients} client processes, {args.seconds:g} s per op, "
          f"{args.keys} keys of 100 B, {os.cpu_count()} CPUs; ratios against {layouts[0][0]} "
          f"shard(s) x {layouts[0][1]} router(s) in this run"
          + "".join(f"; [router] {o}" for o in args.router_option), flush=True)
    print(f"{'shards x routers':>16} {'get ops/s':>10} {'ratio':>6} {'p50 ms':>7} {'p99 ms':>7}"
          f" {'put ops/s':>10} {'ratio':>6} {'p50 ms':>7} {'p99 ms':>7} {'errors':>7}", flush=True)
    base = None
    for shards, routers in layouts:
        res = run_layout(shards, routers, args)
        g, w = res["get"], res["put"]
        if base is None:
            base = (g["ops_per_s"], w["ops_per_s"])
        errors = sum(sum(x.get("errors", {}).values()) for x in (g, w))
        print(f"{f'{shards} x {routers}':>16} {g['ops_per_s']:>10,.0f} {g['ops_per_s'] / base[0]:>5.2f}x"
              f" {g['latency_ms']['p50']:>7.2f} {g['latency_ms']['p99']:>7.2f}"
              f" {w['ops_per_s']:>10,.0f} {w['ops_per_s'] / base[1]:>5.2f}x"
              f" {w['latency_ms']['p50']:>7.2f} {w['latency_ms']['p99']:>7.2f} {errors:>7}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
