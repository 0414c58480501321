"""``sievekv bench``: a multi-process load test through the router (like redis-benchmark or
db_bench), reporting ops/s, exact latency percentiles, found ratio, errors by status and the
spread between clients.

Order of events (the order matters: gRPC Python does not survive a fork once a channel exists):

1. check the arguments and resolve the router address and value limit (files only, no gRPC);
2. start ``--clients`` child processes with the "spawn" start method; each makes its own Client
   and answers ready after one warm-up call, or the status that call failed with (no cluster:
   UNAVAILABLE -> exit 3, every child stopped);
3. only then may this process talk gRPC: ``--preload`` writes every key in batches (progress on
   stderr) and flushes;
4. send every child the same start instant (a little in the future) and deadline; show the
   calls/s so far on stderr while they run; sum their results (bench_report.py).

Every child is joined, else terminated, else killed, on every path out (errors, Ctrl-C).
Ctrl-C during the run stops the children, prints what was measured and exits 130.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import time
from multiprocessing.connection import wait

import grpc

from ..humanize import format_bytes, format_count
from . import bench_worker, rpc, target
from .bench_report import render, summarize
from .exit_codes import ERROR, INTERRUPTED, OK, PARTIAL, USAGE, CliError, code_for_grpc
from .progress import StatusLine
from .sizes import cluster_limits, mutation_bytes

OPS = ("get", "put", "mget", "mixed")
DEFAULT_TIMEOUT = 30.0
MAX_SECONDS = 3600.0  # latencies are kept exactly, 8 bytes per call
MAX_CLIENTS = 256
MAX_KEYS = 10**10  # keys are bench:%010d
PRELOAD_BATCH = 1000
PRELOAD_BATCH_BYTES = 1 << 20
START_LEAD = 0.2  # seconds between "go" and the common start instant
STARTUP_WAIT = 60.0  # seconds for the children to start, beyond their warm-up call's deadline
STOP_GRACE = 5.0  # seconds a child may take past the deadline (its last call) before it is ended


def check_args(args, max_value_bytes: int) -> None:
    """Raise CliError(USAGE) with one line for the first bad argument."""
    if not 1 <= args.clients <= MAX_CLIENTS:
        raise CliError(f"--clients: must be in 1..{MAX_CLIENTS}, got {args.clients}", USAGE)
    if not 0 < args.seconds <= MAX_SECONDS:
        raise CliError(f"--seconds: must be > 0 and at most {MAX_SECONDS:.0f}, got "
                       f"{args.seconds:g}", USAGE)
    if not 1 <= args.keys <= MAX_KEYS:
        raise CliError(f"--keys: must be in 1..{MAX_KEYS}, got {args.keys}", USAGE)
    if args.batch < 1:
        raise CliError(f"--batch: must be >= 1, got {args.batch}", USAGE)
    if args.value_size < 0:
        raise CliError(f"--value-size: must be >= 0, got {args.value_size}", USAGE)
    if args.value_size > max_value_bytes:
        raise CliError(f"--value-size: {args.value_size} bytes is over the cluster's value limit "
                       f"of {max_value_bytes} bytes", USAGE)
    # A MultiGet answer carries up to --batch values (about value size + 8 bytes each).
    reply = args.batch * (args.value_size + 8)
    if args.op == "mget" and reply > max_value_bytes + (1 << 20):
        raise CliError(f"--batch: {args.batch} values of {args.value_size} bytes make a "
                       f"{reply}-byte reply, over the cluster's message limit", USAGE)


class _Children:
    """The client processes and their pipes; :meth:`close` ends every one of them."""

    def __init__(self, n: int, spec: bench_worker.Spec):
        ctx = multiprocessing.get_context("spawn")
        self.counters = ctx.RawArray("q", n)
        self.stop = ctx.RawValue("b", 0)
        self.procs, self.conns = [], []
        # A terminal's Ctrl-C reaches the whole process group: a child still starting up
        # (before bench_worker.main ignores SIGINT) would print a KeyboardInterrupt traceback.
        # An ignored signal stays ignored across exec and Python keeps it so, so children
        # start with SIGINT ignored. (Blocking it instead does not survive multiprocessing's
        # spawn: the children got it.) The cost: a Ctrl-C that lands in this process during
        # these few spawn calls is lost, and the bench goes on; the next one stops it.
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for i in range(n):
                parent_end, child_end = ctx.Pipe()
                p = ctx.Process(target=bench_worker.main, name=f"sievekv-bench-{i}",
                                daemon=True, args=(i, spec, child_end, self.counters, self.stop))
                self.procs.append(p)
                self.conns.append(parent_end)
                p.start()
                child_end.close()
        finally:
            signal.signal(signal.SIGINT, old)

    def receive(self, deadline: float, out: dict[int, tuple] | None = None) -> dict[int, tuple]:
        """One message from each child (index -> message) until ``deadline``, added to ``out``
        (a dict the caller keeps, so what arrived survives a Ctrl-C during the wait; children
        already in it are not waited for again). A child that exits without a message gives
        ``("exited", exitcode)``; one that does not answer in time is absent."""
        if out is None:
            out = {}
        index = {id(c): i for i, c in enumerate(self.conns)}
        pending = [c for i, c in enumerate(self.conns) if i not in out]
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for c in wait(pending, timeout=min(left, 0.2)):
                i = index[id(c)]
                try:
                    out[i] = c.recv()
                except (EOFError, OSError):
                    self.procs[i].join(1.0)
                    out[i] = ("exited", self.procs[i].exitcode)
                pending.remove(c)
            self.tick()
        return out

    def tick(self) -> None:
        """Called about every 0.2 s while :meth:`receive` waits (progress lines)."""

    def send_all(self, msg: tuple) -> None:
        for c in self.conns:
            try:
                c.send(msg)
            except (BrokenPipeError, OSError):
                pass

    def close(self) -> None:
        """Stop, join, terminate, kill: no child outlives this call."""
        self.stop.value = 1
        self.send_all(("quit",))
        for p in self.procs:
            p.join(2.0)
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join()
        for c in self.conns:
            c.close()


def _startup_error(messages: dict[int, tuple], n: int, address: str) -> CliError | None:
    for i in range(n):
        msg = messages.get(i)
        if msg is None:
            return CliError(f"bench client {i} did not start within {STARTUP_WAIT:.0f} s", ERROR)
        if msg[0] == "error":
            name, details = msg[1]
            first = (details or "").strip().split("\n")[0]
            status = getattr(grpc.StatusCode, name, None)
            return CliError(f"router {address}: {name}: {first}", code_for_grpc(status, first))
        if msg[0] == "exited":
            return CliError(f"bench client {i} exited (code {msg[1]}) before it was ready", ERROR)
    return None


def _preload(args, address: str, max_value_bytes: int, progress: StatusLine) -> None:
    """Write every key of the key space (values of --value-size random bytes) in batches,
    then flush every shard. Runs after the children exist (this process now uses gRPC)."""
    from ..client import Client
    from ..client_errors import ClientError
    from .exit_codes import from_client_error

    per_record = mutation_bytes(len(bench_worker.bench_key(0)), args.value_size)
    batch = max(1, min(PRELOAD_BATCH, PRELOAD_BATCH_BYTES // per_record))
    block = os.urandom(args.value_size + 4096)
    sync = True if args.sync else None
    t0 = time.monotonic()
    done = 0
    with Client(address, timeout=args.timeout or DEFAULT_TIMEOUT,
                max_value_bytes=max_value_bytes, **rpc.client_tls_args()) as c:
        try:
            for first in range(0, args.keys, batch):
                last = min(first + batch, args.keys)
                c.write([(bench_worker.bench_key(i),
                          block[(i * 61) % 4096:(i * 61) % 4096 + args.value_size])
                         for i in range(first, last)], sync=sync)
                done = last
                el = max(time.monotonic() - t0, 1e-9)
                progress.show(f"preloaded {format_count(done)} of {format_count(args.keys)} keys "
                              f"({format_bytes(done * args.value_size)}) in {el:.1f}s, "
                              f"{format_count(int(done / el))} keys/s", final=done == args.keys)
            c.flush()
        except ClientError as exc:
            progress.end_line()
            raise from_client_error(exc, f"bench --preload (after {done} keys)") from None


def cmd_bench(args) -> int:
    limits = cluster_limits(args)
    check_args(args, limits.max_value_bytes)
    address = target.router_address(args)
    timeout = getattr(args, "timeout", None) or DEFAULT_TIMEOUT
    args.timeout = timeout
    spec = bench_worker.Spec(address=address, op=args.op, keys=args.keys,
                             value_size=args.value_size, batch=args.batch, sync=args.sync,
                             timeout=timeout, max_value_bytes=limits.max_value_bytes,
                             tls=rpc.client_tls_args())
    setup = {"op": args.op, "clients": args.clients, "seconds": args.seconds, "keys": args.keys,
             "value_size": args.value_size, "batch": args.batch, "sync": args.sync,
             "preload": args.preload, "router": address}
    progress = StatusLine(args.quiet)
    try:
        children = _Children(args.clients, spec)  # ends what it started if interrupted
    except KeyboardInterrupt:
        raise CliError("bench interrupted before the run started", INTERRUPTED) from None
    try:
        try:
            ready = children.receive(time.monotonic() + STARTUP_WAIT + timeout)
            error = _startup_error(ready, args.clients, address)
            if error is not None:
                raise error
            if args.preload:
                _preload(args, address, limits.max_value_bytes, progress)
        except KeyboardInterrupt:
            progress.end_line()
            raise CliError("bench interrupted before the run started", INTERRUPTED) from None
        doc, interrupted = _run(args, children, setup, progress)
    finally:
        children.close()
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(render(doc))
    if interrupted:
        print("sievekv: bench interrupted: the numbers above are what was measured so far",
              file=sys.stderr, flush=True)
        return INTERRUPTED
    if doc["lost_clients"]:
        raise CliError(f"bench: {len(doc['lost_clients'])} of {args.clients} clients gave no "
                       f"result ({'; '.join(doc['lost_clients'])}); the numbers above are the "
                       f"others'", PARTIAL)
    error = all_failed(doc)
    if error is not None:
        raise error
    return OK


def all_failed(doc: dict) -> CliError | None:
    """The error to exit with when no call of the run succeeded and some failed: the most
    frequent status and its first message, exit code by status (UNAVAILABLE: 3, else mostly
    1); None when some call succeeded (failures are then only counted)."""
    total = doc["total"]
    if total["calls"] or not total["errors"]:
        return None
    name = max(sorted(total["errors"]), key=total["errors"].get)
    first = next(o["first_errors"][name] for o in doc["ops"].values()
                 if name in o["first_errors"])
    return CliError(f"every call failed: {name}: {first}",
                    code_for_grpc(getattr(grpc.StatusCode, name, None), first))


def _run(args, children: _Children, setup: dict, progress: StatusLine) -> tuple[dict, bool]:
    """Start the children at one instant, show progress, collect their results."""
    start_at = time.monotonic() + START_LEAD
    deadline = start_at + args.seconds
    children.send_all(("go", start_at, deadline))
    word = "keys" if args.op == "mget" else "ops"
    mult = args.batch if args.op == "mget" else 1

    def tick():
        el = time.monotonic() - start_at
        if el <= 0:
            return
        calls = sum(children.counters)
        progress.show(f"bench {args.op}: {min(el, args.seconds):.0f}s of {args.seconds:g}s, "
                      f"{format_count(calls)} calls, {format_count(int(calls * mult / el))} "
                      f"{word}/s")

    children.tick = tick
    interrupted = False
    messages: dict[int, tuple] = {}
    try:
        children.receive(deadline + args.timeout + STOP_GRACE, messages)
    except KeyboardInterrupt:  # results already received stay in messages
        interrupted = True
        children.stop.value = 1
        children.tick = lambda: None
        children.receive(time.monotonic() + args.timeout + STOP_GRACE, messages)
    progress.end_line()
    results, lost = [], []
    for i in range(args.clients):
        msg = messages.get(i)
        if msg is None or msg[0] != "result":
            lost.append(f"client {i}: " + ("no answer" if msg is None else f"exit code {msg[1]}"))
        else:
            results.append(msg[1])
    if not results:
        raise CliError(f"bench: no client gave a result ({'; '.join(lost)})", ERROR)
    doc = summarize(setup, results, start_at, interrupted)
    doc["lost_clients"] = lost
    return doc, interrupted
