"""The router process: ``python -m router --cluster-map FILE --listen HOST:PORT [--processes N]``.

With ``--processes 1`` (the default) this process serves. With N > 1 it is a supervisor that
creates no gRPC object at all: it reserves the port with an SO_REUSEPORT socket (as gRPC's
examples/python/multiprocessing does), *spawns* N router processes that each bind that port
with SO_REUSEPORT and one channel per shard, restarts a process that dies (at most once a
second per process), and on SIGTERM/SIGINT forwards SIGTERM to them and waits for their
drain. Once every process serves, the port is written to ``--port-file`` (atomically) and
``sievekv router listening on HOST:PORT`` is printed on stdout.

Metrics: process i of N serves Prometheus on ``--metrics-port + i`` (0 = off).
Exit codes: 0 after a drain, 1 when the cluster map is invalid or startup fails, 2 for usage.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import queue
import socket
import sys
import time

from engine.errors import SieveError
from shard.limits import DEFAULT_MAX_VALUE_BYTES, Limits, max_value_bytes_arg
from shard.worker import stop_event_on_signals, wait_for_stop, watch_parent, write_port_file

from . import cluster_map as cmap
from .server import DEFAULT_ADMIN_TIMEOUT, DEFAULT_TIMEOUT, DEFAULT_WORKERS, create_router_server

log = logging.getLogger("router")
READY_TIMEOUT = 60.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m router",
                                description="Serve a sievekv cluster (KV + Admin) over gRPC.")
    p.add_argument("--cluster-map", required=True, help="TOML cluster map (see router/cluster_map.py)")
    p.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT; port 0 = any free port")
    p.add_argument("--processes", type=int, default=1, help="router processes sharing the port")
    p.add_argument("--port-file", help="write the bound port here once serving")
    p.add_argument("--max-value-bytes", type=max_value_bytes_arg, default=DEFAULT_MAX_VALUE_BYTES,
                   help="largest value accepted; must match the shards'")
    p.add_argument("--default-timeout", type=float, default=DEFAULT_TIMEOUT,
                   help="deadline (s) of shard calls when the client sets none")
    p.add_argument("--admin-timeout", type=float, default=DEFAULT_ADMIN_TIMEOUT,
                   help="deadline (s) of long calls (Scan streams, Flush, Compact) when the "
                        "client sets none")
    p.add_argument("--drain-grace", type=float, default=10.0,
                   help="seconds in-flight calls get to finish on SIGTERM")
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help="handler threads per process")
    p.add_argument("--max-calls-per-shard", type=_positive_int, default=None,
                   help="reads, and as many writes, one shard may have waiting on it per router "
                        "process; more wait their turn, and fail fast with UNAVAILABLE once the "
                        "shard has answered none for 2 s (default: workers / 4)")
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus port of process 0; 0 = off")
    p.add_argument("--metrics-host", default=None, help="Prometheus bind host (default: the listen host)")
    p.add_argument("--exit-with-parent", action="store_true",
                   help="drain and exit when the parent process goes away")
    p.add_argument("--parent-pid", type=int, default=None,
                   help="with --exit-with-parent: the parent's pid (default: the parent at start); "
                        "a router that finds another parent exits at once")
    p.add_argument("--log-level", default="INFO")
    return p


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")


def serve(args: argparse.Namespace, address: str, *, index: int = 0, reuse_port: bool = False,
          ready=None, parent_watch: bool = False, parent: int | None = None) -> int:
    """Run one router process on ``address`` until SIGTERM; report readiness on ``ready``."""
    stop = stop_event_on_signals(log)
    if parent_watch or args.exit_with_parent:
        # A spawned router process (parent_watch) watches the router that spawned it.
        watch_parent(stop, logger=log, parent=parent if parent_watch else args.parent_pid)
        if stop.is_set():
            return 0
    host = address.rsplit(":", 1)[0]
    try:
        cluster_map = cmap.load(args.cluster_map)
        metrics = None
        if args.metrics_port:
            from prometheus_client import CollectorRegistry

            from shard.metrics import RequestMetrics
            from shard.metrics import serve as serve_metrics

            registry = CollectorRegistry()
            metrics = RequestMetrics(registry)
            serve_metrics(args.metrics_port + index, args.metrics_host or host, registry)
        serving, port = create_router_server(
            cluster_map, address, limits=Limits(max_value_bytes=args.max_value_bytes),
            metrics=metrics, default_timeout=args.default_timeout,
            admin_timeout=args.admin_timeout, reuse_port=reuse_port, max_workers=args.workers,
            max_calls_per_shard=args.max_calls_per_shard)
    except (SieveError, OSError) as exc:
        message = f"router: cannot start: {exc}"
        if ready is not None:
            ready.put(("failed", index, message))
        print(message, file=sys.stderr)
        return 1
    serving.start()
    if ready is not None:
        ready.put(("ready", index, port))
    else:
        if args.port_file:
            write_port_file(args.port_file, port)
        print(f"sievekv router listening on {host}:{port}", flush=True)
    log.info("router process %d serving %d shard(s) on %s:%d", index, len(cluster_map.shards), host, port)
    wait_for_stop(stop)
    serving.drain(args.drain_grace)
    log.info("router process %d drained", index)
    return 0


def _child(args: argparse.Namespace, address: str, index: int, ready, parent: int) -> None:
    _setup_logging(args.log_level)
    sys.exit(serve(args, address, index=index, reuse_port=True, ready=ready, parent_watch=True,
                   parent=parent))


def reserve_port(host: str, port: int) -> socket.socket:
    """A bound (not listening) SO_REUSEPORT socket holding ``host:port`` for the children."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 0:
        sock.close()
        raise OSError("SO_REUSEPORT is not available: use --processes 1")
    sock.bind((host.strip("[]"), port))
    return sock


def supervise(args: argparse.Namespace) -> int:
    """Run ``args.processes`` spawned router processes on one port (see the module doc)."""
    stop = stop_event_on_signals(log)
    if args.exit_with_parent:
        watch_parent(stop, logger=log, parent=args.parent_pid)
        if stop.is_set():
            return 0
    host, _, port_text = args.listen.rpartition(":")
    try:
        cmap.load(args.cluster_map)  # fail fast, in one place, before spawning anything
        sock = reserve_port(host, int(port_text))
    except (SieveError, OSError, ValueError) as exc:
        print(f"router: cannot start: {exc}", file=sys.stderr)
        return 1
    port = sock.getsockname()[1]
    address = f"{host}:{port}"
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Queue()
    procs: dict[int, multiprocessing.Process] = {}
    started: dict[int, float] = {}

    def start(i: int) -> None:
        p = ctx.Process(target=_child, args=(args, address, i, ready, os.getpid()), name=f"router-{i}", daemon=False)
        p.start()
        procs[i] = p
        started[i] = time.monotonic()

    def stop_all() -> None:
        for p in procs.values():
            if p.is_alive():
                p.terminate()  # SIGTERM: each child drains
        deadline = time.monotonic() + args.drain_grace + 5
        for p in procs.values():
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()
        sock.close()

    try:
        for i in range(args.processes):
            start(i)
        waiting = set(procs)
        deadline = time.monotonic() + READY_TIMEOUT
        while waiting:
            if stop.is_set() or time.monotonic() > deadline:
                raise RuntimeError("router processes did not become ready")
            try:
                kind, i, detail = ready.get(timeout=0.2)
            except queue.Empty:
                dead = [i for i in waiting if not procs[i].is_alive()]
                if dead:
                    raise RuntimeError(f"router process {dead[0]} exited during startup")
                continue
            if kind == "failed":
                raise RuntimeError(detail)
            waiting.discard(i)
    except RuntimeError as exc:
        print(f"router: cannot start: {exc}", file=sys.stderr)
        stop_all()
        return 1

    if args.port_file:
        write_port_file(args.port_file, port)
    print(f"sievekv router listening on {address} ({args.processes} processes)", flush=True)
    while not stop.wait(0.5):
        for i, p in list(procs.items()):
            if not p.is_alive() and time.monotonic() - started[i] >= 1.0:
                log.warning("router process %d exited with %s: restarting it", i, p.exitcode)
                start(i)
    stop_all()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_level)
    if args.processes < 1:
        print("router: --processes must be at least 1", file=sys.stderr)
        return 2
    if args.processes == 1:
        return serve(args, args.listen)
    return supervise(args)
