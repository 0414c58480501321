"""The shard process: ``python -m shard --data-dir DIR --listen HOST:PORT [options]``.

Startup: raise the soft open-file limit to the hard one (:func:`raise_open_file_limit`), open
the backend (engine.DB), build and start the server, then announce the bound
port: write it (digits and a newline, atomically: temp file + rename) to ``--port-file`` and
print ``sievekv shard NAME listening on HOST:PORT`` on stdout. A parent that passed port 0
reads the port file.

SIGTERM or SIGINT drains (:meth:`shard.serving.Serving.drain`): health NOT_SERVING, new calls
UNAVAILABLE, in-flight calls finish (``--drain-grace`` seconds at most), then the memtable is
flushed (unless ``--no-flush-on-exit``), the engine closes and the process exits 0.

TLS: ``--tls-cert`` and ``--tls-key`` serve TLS instead of plaintext; ``--tls-client-ca``
also requires client certificates signed by that CA (mTLS). The files are checked before the
engine opens (:mod:`shard.tls`); a bad one exits 2 with one line naming it.

Exit codes: 0 after a drain, 1 when startup fails (one line on stderr), 2 for bad usage
(including a TLS file that cannot be used).
gRPC objects are created only in this process, after any fork: spawn it, never fork it after a
channel or server exists.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading

from engine.errors import SieveError
from engine.open_files import raise_to_hard

from .address import listen_address_arg
from .backend import open_engine
from .limits import DEFAULT_MAX_VALUE_BYTES, Limits, max_value_bytes_arg
from .server import DEFAULT_WORKERS, create_server
from .tls import TlsError, server_tls

log = logging.getLogger("shard")


def parse_engine_option(text: str) -> tuple[str, object]:
    """``NAME=VALUE`` -> (name, value); VALUE is read as JSON (``1024``, ``true``, ``null``,
    ``[10, 8]``) and otherwise kept as a string."""
    name, sep, raw = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        return name.strip(), json.loads(raw)
    except ValueError:
        return name.strip(), raw


def build_parser(prog: str = "python -m shard") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Serve one sievekv engine directory over gRPC.")
    p.add_argument("--data-dir", required=True, help="engine directory (created if missing)")
    p.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT to serve on; port 0 = any free port",
                   type=listen_address_arg)
    p.add_argument("--port-file", help="write the bound port here once serving")
    p.add_argument("--name", help="shard name in reports (default: the data directory's name)")
    p.add_argument("--max-value-bytes", type=max_value_bytes_arg, default=DEFAULT_MAX_VALUE_BYTES,
                   help="largest value accepted (also the engine's max_value_size); messages may be "
                        "1 MiB larger")
    p.add_argument("--engine-option", action="append", default=[], type=parse_engine_option,
                   metavar="NAME=VALUE", help="engine option (see engine.options.Options); repeatable")
    p.add_argument("--flush-on-exit", action=argparse.BooleanOptionalAction, default=True,
                   help="flush the memtable when draining (default: on)")
    p.add_argument("--drain-grace", type=float, default=10.0,
                   help="seconds in-flight calls get to finish on SIGTERM")
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help="handler threads")
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus port; 0 = off")
    p.add_argument("--metrics-host", default=None, help="Prometheus bind host (default: the listen host)")
    p.add_argument("--exit-with-parent", action="store_true",
                   help="drain and exit when the parent process goes away (for supervisors and tests)")
    p.add_argument("--parent-pid", type=int, default=None,
                   help="with --exit-with-parent: the parent's pid (default: the parent at start); "
                        "a shard that finds another parent exits at once")
    p.add_argument("--log-level", default="INFO")
    add_server_tls_args(p)
    return p


def add_server_tls_args(p: argparse.ArgumentParser, what: str = "the listen port") -> None:
    """--tls-cert, --tls-key, --tls-client-ca (shard and router)."""
    g = p.add_argument_group("TLS", f"TLS of {what} (default: plaintext); see deploy/README.md")
    g.add_argument("--tls-cert", metavar="PEM", help="server certificate chain; serve TLS "
                   "(needs --tls-key)")
    g.add_argument("--tls-key", metavar="PEM", help="private key of --tls-cert (unencrypted)")
    g.add_argument("--tls-client-ca", metavar="PEM",
                   help="require client certificates signed by this CA (mutual TLS)")


def load_server_tls(args: argparse.Namespace, prog: str):
    """The ServerTls of --tls-cert/--tls-key/--tls-client-ca (None: plaintext); a file that
    cannot be used prints one line ``PROG: error: ...`` on stderr and raises SystemExit(2)."""
    try:
        return server_tls(args.tls_cert, args.tls_key, args.tls_client_ca)
    except TlsError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def raise_open_file_limit(logger: logging.Logger = log) -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; return (old, new) soft.

    A server raises it at startup (as ``ulimit -n`` in a unit file would), before any table is
    open; the engine would also raise it when its tables need it (engine/open_files.py says
    why: up to three descriptors per open table). A failure is logged, never fatal.
    """
    return raise_to_hard(logger)


def write_port_file(path: str, port: int) -> None:
    """Write ``port`` to ``path`` atomically (readers never see a partial number)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(f"{port}\n")
    os.replace(tmp, path)


def stop_event_on_signals(logger: logging.Logger = log) -> threading.Event:
    """An event set by SIGTERM or SIGINT (must be called from the main thread)."""
    stop = threading.Event()

    def handler(signum, frame):
        logger.info("received %s: draining", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def wait_for_stop(stop: threading.Event, poll: float = 0.2) -> None:
    """Block until ``stop`` is set. Polls: a signal delivered to one of gRPC's threads does not
    interrupt a blocked main thread, whose Python handler then runs only once it wakes."""
    while not stop.wait(poll):
        pass


def watch_parent(stop: threading.Event, interval: float = 0.5, logger: logging.Logger = log,
                 parent: int | None = None) -> None:
    """Set ``stop`` when this process's parent is gone (it died and we were re-parented).

    ``parent``: the pid the parent must have (the supervisor passes its own with
    ``--parent-pid``); default the parent now. Checked at once too, so a parent that died
    before this call (while this process was still importing, ~1 s) is not mistaken for init
    or a subreaper being the parent all along."""
    if parent is None:
        parent = os.getppid()
    elif os.getppid() != parent:
        logger.warning("parent process %d is gone: draining", parent)
        stop.set()
        return

    def run():
        while not stop.wait(interval):
            if os.getppid() != parent:
                logger.warning("parent process %d is gone: draining", parent)
                stop.set()

    threading.Thread(target=run, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None, *, open_backend=open_engine, prog: str = "python -m shard") -> int:
    """Run a shard until SIGTERM. ``open_backend(path, **options)`` opens what is served."""
    args = build_parser(prog).parse_args(argv)
    tls = load_server_tls(args, prog)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")
    name = args.name or os.path.basename(os.path.abspath(args.data_dir))
    host = args.listen.rsplit(":", 1)[0]
    options = dict(args.engine_option)
    options.setdefault("max_value_size", args.max_value_bytes)
    limits = Limits(max_value_bytes=args.max_value_bytes)
    stop = stop_event_on_signals()
    if args.exit_with_parent:
        watch_parent(stop, parent=args.parent_pid)
        if stop.is_set():
            return 0  # the parent died while this process started: serve nothing
    raise_open_file_limit()

    try:
        db = open_backend(args.data_dir, **options)
    except (SieveError, OSError) as exc:
        print(f"shard {name}: cannot open {args.data_dir}: {exc}", file=sys.stderr)
        return 1
    try:
        metrics = None
        if args.metrics_port:
            from prometheus_client import CollectorRegistry

            from .engine_metrics import EngineCollector
            from .metrics import RequestMetrics, serve

            registry = CollectorRegistry()
            metrics = RequestMetrics(registry)
            registry.register(EngineCollector(db))
            serve(args.metrics_port, args.metrics_host or host, registry)
        serving, port = create_server(db, args.listen, name=name, limits=limits, metrics=metrics,
                                      max_workers=args.workers, tls=tls)
    except (SieveError, OSError) as exc:
        print(f"shard {name}: cannot start: {exc}", file=sys.stderr)
        db.close()
        return 1

    serving.start()
    if args.port_file:
        write_port_file(args.port_file, port)
    print(f"sievekv shard {name} listening on {host}:{port}{' (TLS)' if tls else ''}", flush=True)
    log.info("serving %s as shard %s on %s:%d", args.data_dir, name, host, port)

    wait_for_stop(stop)
    serving.drain(args.drain_grace)
    code = 0
    if args.flush_on_exit:
        try:
            db.flush()
        except SieveError as exc:  # the log still holds the writes: the next open replays it
            log.error("shard %s: flush on exit failed (its writes stay in the log): %s", name, exc)
            code = 1
    try:
        db.close()
    except SieveError as exc:
        log.error("shard %s: close failed: %s", name, exc)
        return 1
    log.info("shard %s drained and closed", name)
    return code
