"""The router process: ``python -m router --cluster-map FILE --listen HOST:PORT [--processes N]``.

With ``--processes 1`` (the default) this process serves. With N > 1 it is a supervisor that
creates no gRPC object at all: it reserves the port with an SO_REUSEPORT socket (as gRPC's
examples/python/multiprocessing does), *spawns* N router processes that each bind that port
with SO_REUSEPORT and one channel per shard, and on SIGTERM/SIGINT forwards SIGTERM to them
and waits for their drain. Once every process serves, the port is written to ``--port-file``
(atomically) and ``sievekv router listening on HOST:PORT`` is printed on stdout.

A process that dies after startup is restarted with the backoff of router/restart_policy.py
and the cluster supervisor's default policy (:data:`RESTART_POLICY`: after 0.5 s, doubling
with each crash within 60 s up to 30 s). One that crashes more than 5 times within 60 s is
given up on, as the cluster supervisor gives up on a shard; since router processes are
interchangeable copies, this one does not serve on with fewer: it drains the others, prints
one line ``router: giving up: router process I ...`` (with the last start failure it
reported, e.g. a port it could not bind) and exits 1, so that whatever supervises it
(systemd's ``Restart=on-failure``, the cluster supervisor and its own backoff) sees a failed
router rather than one silently serving with fewer processes.

Each process reports its startup (``ready`` or ``failed`` and why) on its own one-way pipe,
one message per process life: nothing a process writes accumulates across restarts, so no
number of restarts can leave a process unable to exit (a shared multiprocessing.Queue that
the supervisor stopped reading filled up and blocked the exit of its writers).

TLS (shard/tls.py): ``--tls-cert``/``--tls-key`` (and ``--tls-client-ca`` for mTLS) make the
listen port TLS, the same for every process; ``--shard-tls-ca`` (and ``--shard-tls-cert``/
``--shard-tls-key``, the router's client certificate) make its channels to the shards TLS,
health checks included. The files are checked before anything is spawned or bound.

Metrics: process i of N serves Prometheus on ``--metrics-port + i`` (0 = off), plain HTTP.
Exit codes: 0 after a drain, 1 when the cluster map is invalid, startup fails or a router
process keeps crashing (see above), 2 for usage (a TLS file that cannot be used included).
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass

from engine.errors import SieveError
from shard.address import listen_address_arg
from shard.limits import DEFAULT_MAX_VALUE_BYTES, Limits, max_value_bytes_arg
from shard.tls import TlsError, client_tls, server_tls
from shard.worker import (add_server_tls_args, stop_event_on_signals, wait_for_stop,
                          watch_parent, write_port_file)

from . import cluster_map as cmap
from .restart_policy import RestartPolicy, RestartTracker
from .server import DEFAULT_ADMIN_TIMEOUT, DEFAULT_TIMEOUT, DEFAULT_WORKERS, create_router_server

log = logging.getLogger("router")
READY_TIMEOUT = 60.0
RESTART_POLICY = RestartPolicy(delay=0.5, delay_max=30.0, max_restarts=5, window=60.0)
"""How a crashed router process is restarted: the cluster supervisor's defaults
(``[supervisor]`` in router/default_config.toml)."""
TICK = 0.2  # seconds between the supervisor's checks of its processes


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m router",
                                description="Serve a sievekv cluster (KV + Admin) over gRPC.")
    p.add_argument("--cluster-map", required=True, help="TOML cluster map (see router/cluster_map.py)")
    p.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT; port 0 = any free port",
                   type=listen_address_arg)
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
    add_server_tls_args(p, "the router's listen port (every --processes process)")
    g = p.add_argument_group("TLS to the shards", "channels to the shards and their health "
                             "checks (default: plaintext)")
    g.add_argument("--shard-tls-ca", metavar="PEM",
                   help="connect to the shards over TLS, verifying them with this CA")
    g.add_argument("--shard-tls-cert", metavar="PEM",
                   help="the router's client certificate, for shards that require mTLS "
                        "(needs --shard-tls-key)")
    g.add_argument("--shard-tls-key", metavar="PEM", help="private key of --shard-tls-cert")
    return p


SHARD_TLS_FLAGS = ("--shard-tls-ca", "--shard-tls-cert", "--shard-tls-key")


def load_tls(args: argparse.Namespace):
    """(ServerTls | None, ClientTls | None) of the TLS flags; raises TlsError."""
    return (server_tls(args.tls_cert, args.tls_key, args.tls_client_ca),
            client_tls(args.shard_tls_ca, args.shard_tls_cert, args.shard_tls_key,
                       flags=SHARD_TLS_FLAGS))


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
    """Run one router process on ``address`` until SIGTERM. ``ready``: the write end of a
    multiprocessing pipe (a spawned process) on which it sends one ``("ready", index, port)``
    or ``("failed", index, reason)`` and closes it."""
    stop = stop_event_on_signals(log)
    if parent_watch or args.exit_with_parent:
        # A spawned router process (parent_watch) watches the router that spawned it.
        watch_parent(stop, logger=log, parent=parent if parent_watch else args.parent_pid)
        if stop.is_set():
            return 0
    host = address.rsplit(":", 1)[0]
    try:
        cluster_map = cmap.load(args.cluster_map)
        tls, shard_tls = load_tls(args)  # checked in main too: read again by each process
        metrics = None
        if args.metrics_port:
            metrics = _serve_metrics(args.metrics_port + index, args.metrics_host or host)
        serving, port = create_router_server(
            cluster_map, address, limits=Limits(max_value_bytes=args.max_value_bytes),
            metrics=metrics, default_timeout=args.default_timeout,
            admin_timeout=args.admin_timeout, reuse_port=reuse_port, max_workers=args.workers,
            max_calls_per_shard=args.max_calls_per_shard, tls=tls, shard_tls=shard_tls)
    except (SieveError, OSError) as exc:
        print(f"router: cannot start: {exc}", file=sys.stderr, flush=True)
        if ready is not None:
            _report(ready, ("failed", index, str(exc)))
        return 1
    serving.start()
    if ready is not None:
        _report(ready, ("ready", index, port))
    else:
        if args.port_file:
            write_port_file(args.port_file, port)
        print(f"sievekv router listening on {host}:{port}{' (TLS)' if tls else ''}", flush=True)
    log.info("router process %d serving %d shard(s) on %s:%d", index, len(cluster_map.shards), host, port)
    wait_for_stop(stop)
    serving.drain(args.drain_grace)
    log.info("router process %d drained", index)
    return 0


def _serve_metrics(port: int, host: str):
    """RequestMetrics served by Prometheus on ``host:port``; OSError naming the address."""
    from prometheus_client import CollectorRegistry

    from shard.metrics import RequestMetrics
    from shard.metrics import serve as serve_metrics

    registry = CollectorRegistry()
    metrics = RequestMetrics(registry)
    try:
        serve_metrics(port, host, registry)
    except OSError as exc:
        raise OSError(f"cannot serve metrics on {host}:{port}: {exc}") from None
    return metrics


def _report(ready, message: tuple) -> None:
    """Send the one startup message on this process's pipe (a few dozen bytes into an empty
    pipe: never blocks) and close it."""
    try:
        ready.send(message)
    except OSError:
        pass  # the supervisor is gone; watch_parent stops this process
    finally:
        ready.close()


def _child(args: argparse.Namespace, address: str, index: int, ready, parent: int) -> None:
    _setup_logging(args.log_level)
    sys.exit(serve(args, address, index=index, reuse_port=True, ready=ready, parent_watch=True,
                   parent=parent))


def reserve_port(host: str, port: int) -> socket.socket:
    """A bound (not listening) SO_REUSEPORT socket holding ``host:port`` for the children.
    OSError naming the address when it cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 0:
            raise OSError("SO_REUSEPORT is not available: use --processes 1")
        try:
            sock.bind((host.strip("[]"), port))
        except OSError as exc:
            raise OSError(f"cannot listen on {host}:{port}: {exc}") from None
    except BaseException:
        sock.close()
        raise
    return sock


@dataclass
class _RouterProcess:
    """One of the N router processes, across its restarts. Only the supervisor's thread
    touches it."""

    index: int
    tracker: RestartTracker
    proc: multiprocessing.Process | None = None
    reports: multiprocessing.connection.Connection | None = None  # read end of its pipe
    ready: bool = False
    failure: str | None = None  # what its last start reported, if it failed
    restart_at: float | None = None  # set while it waits out its backoff

    def read_reports(self) -> None:
        """Take what the process sent (one message per life) without blocking."""
        try:
            while self.reports is not None and self.reports.poll(0):
                kind, _, detail = self.reports.recv()
                if kind == "ready":
                    self.ready, self.failure = True, None
                else:
                    self.failure = str(detail)
        except (EOFError, OSError):
            pass  # it exited; its pipe is closed on the next start

    def close(self) -> None:
        if self.reports is not None:
            self.reports.close()
            self.reports = None


def describe_exit(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def supervise(args: argparse.Namespace) -> int:
    """Run ``args.processes`` spawned router processes on one port (see the module doc):
    restart one that dies with :data:`RESTART_POLICY`'s backoff; past its ``max_restarts``
    drain the others and return 1. Single-threaded: one loop polls the processes."""
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
    routers = [_RouterProcess(i, RestartTracker(RESTART_POLICY)) for i in range(args.processes)]

    def start(r: _RouterProcess) -> None:
        # A pipe per process life: its one message can never fill it, and no process ever
        # writes where another (or a later one) must.
        reports, writer = ctx.Pipe(duplex=False)
        try:
            p = ctx.Process(target=_child, args=(args, address, r.index, writer, os.getpid()),
                            name=f"router-{r.index}", daemon=False)
            p.start()
        finally:
            writer.close()  # the child has its copy; ours would hide its exit
        r.close()
        r.proc, r.reports, r.ready, r.failure, r.restart_at = p, reports, False, None, None

    def stop_all() -> None:
        live = [r.proc for r in routers if r.proc is not None]
        for p in live:
            if p.is_alive():
                p.terminate()  # SIGTERM: each child drains
        deadline = time.monotonic() + args.drain_grace + 5
        for p in live:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()
        for r in routers:
            r.close()
        sock.close()

    try:
        for r in routers:
            start(r)
        deadline = time.monotonic() + READY_TIMEOUT
        while not all(r.ready for r in routers):
            if stop.is_set() or time.monotonic() > deadline:
                raise RuntimeError("router processes did not become ready")
            waiting = [r for r in routers if not r.ready]
            multiprocessing.connection.wait([r.reports for r in waiting], timeout=TICK)
            for r in waiting:
                r.read_reports()
                if r.failure is not None:
                    raise RuntimeError(f"router process {r.index}: {r.failure}")
                if not r.ready and not r.proc.is_alive():
                    r.read_reports()  # what it sent just before it exited
                    if r.failure is not None:
                        raise RuntimeError(f"router process {r.index}: {r.failure}")
                    raise RuntimeError(f"router process {r.index} exited during startup "
                                       f"({describe_exit(r.proc.exitcode)})")
    except RuntimeError as exc:
        stop_all()
        print(f"router: cannot start: {exc}", file=sys.stderr)  # last: the line quoted
        return 1

    if args.port_file:
        write_port_file(args.port_file, port)
    tls_on = " (TLS)" if args.tls_cert else ""  # checked by main's load_tls
    print(f"sievekv router listening on {address} ({args.processes} processes){tls_on}",
          flush=True)
    gave_up = None
    while gave_up is None and not stop.wait(TICK):
        now = time.monotonic()
        for r in routers:
            r.read_reports()
            if r.restart_at is not None:
                if now >= r.restart_at:
                    start(r)
                continue
            if r.proc.is_alive():
                continue
            r.read_reports()
            how = describe_exit(r.proc.exitcode)
            if r.failure:
                how += f" ({r.failure})"
            delay = r.tracker.on_crash(now)
            if delay is None:
                gave_up = (f"router: giving up: router process {r.index} exited "
                           f"{r.tracker.recent_crashes(now)} times within "
                           f"{r.tracker.policy.window:g}s, last with {how}; "
                           f"the other router processes were drained")
                break
            log.warning("router process %d exited with %s: restarting it in %gs",
                        r.index, how, delay)
            r.restart_at = now + delay
    stop_all()
    if gave_up is not None:
        print(gave_up, file=sys.stderr, flush=True)  # last: the line a supervisor quotes
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.processes < 1:
        print("router: --processes must be at least 1", file=sys.stderr)
        return 2
    try:
        tls, shard_tls = load_tls(args)  # fail before anything is spawned or bound
    except TlsError as exc:
        print(f"python -m router: error: {exc}", file=sys.stderr, flush=True)
        return 2
    _setup_logging(args.log_level)
    if tls is not None and shard_tls is None:
        log.warning("serving TLS (--tls-cert) but calling the shards in plaintext (no "
                    "--shard-tls-ca): keys and values cross the network unencrypted between "
                    "the router and the shards; give --shard-tls-ca if the shards serve TLS")
    if args.processes == 1:
        return serve(args, args.listen)
    return supervise(args)
