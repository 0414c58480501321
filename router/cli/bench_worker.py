"""One client process of ``sievekv bench``: back-to-back calls through the router until a
common deadline, every call's latency recorded.

Protocol with the parent (router/cli/bench_cmd.py), over one duplex Pipe per child:

1. The parent starts the child with the "spawn" start method (never fork: gRPC Python does
   not survive a fork once a channel exists), before it creates any gRPC object itself.
2. The child ignores SIGINT (the parent alone handles Ctrl-C and tells it to stop), makes its
   own :class:`router.client.Client`, warms the connection with one ClusterInfo call and sends
   ``("ready", None)``, or ``("error", (status_name, details))`` and exits.
3. The parent sends ``("go", start_at, deadline)`` (``time.monotonic()`` instants, which are
   system-wide on Linux) or ``("quit",)``. The child sleeps until ``start_at`` and calls until a
   call would start at or after ``deadline`` or the shared ``stop`` flag is set, adding one to
   ``counters[index]`` per finished call (the parent's progress line reads them).
4. The child sends ``("result", ChildResult-as-dict)`` and exits.

A child whose parent dies (killed without a chance to stop it) notices within
``PARENT_CHECK_S`` and exits, instead of running on to the deadline as an orphan.

A failed call is counted under its gRPC status name and the loop goes on; its latency is not
recorded (percentiles are of successful calls). Latencies are exact (one double per call,
8 bytes): nothing is sampled, so the tail is not biased.
"""

from __future__ import annotations

import os
import random
import signal
import time
from array import array
from dataclasses import dataclass, field

KEY_FORMAT = b"bench:%010d"
MIXED_PUT_SHARE = 0.10  # --op mixed: 90% get, 10% put
PARENT_CHECK_S = 0.5  # how often a child checks that the bench command still runs


def bench_key(i: int) -> bytes:
    """The key of index ``i`` of the key space (``bench:0000000042``)."""
    return KEY_FORMAT % i


@dataclass
class Spec:
    """What every child runs (picklable; the parent builds it from the arguments)."""

    address: str
    op: str  # get | put | mget | mixed
    keys: int
    value_size: int
    batch: int
    sync: bool
    timeout: float
    max_value_bytes: int
    tls: dict = field(default_factory=dict)  # Client's tls_ca/tls_cert/tls_key (paths)


@dataclass
class OpStats:
    """One operation kind's numbers in one child."""

    latencies: array = field(default_factory=lambda: array("d"))  # seconds, successful calls
    keys: int = 0  # keys asked or written by successful calls
    found: int = 0  # keys found by successful reads
    errors: dict = field(default_factory=dict)  # status name -> count
    first_error: dict = field(default_factory=dict)  # status name -> details of its first

    def failed(self, code_name: str, details: str) -> None:
        self.errors[code_name] = self.errors.get(code_name, 0) + 1
        self.first_error.setdefault(code_name, details)


class _Values:
    """Random values of one size: slices of a random block at random offsets (a fresh
    ``os.urandom`` per put would cost as much as the put for large values)."""

    SPREAD = 4096

    def __init__(self, size: int, rnd: random.Random):
        self.size = size
        self.rnd = rnd
        self.block = rnd.randbytes(size + self.SPREAD)

    def next(self) -> bytes:
        off = self.rnd.randrange(self.SPREAD)
        return self.block[off:off + self.size]


def main(index: int, spec: Spec, conn, counters, stop) -> None:
    """Entry point of child ``index`` (see the module docstring for the protocol)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from ..client import Client
    from ..client_errors import ClientError

    try:
        client = Client(spec.address, timeout=spec.timeout, max_value_bytes=spec.max_value_bytes,
                        **spec.tls)
    except Exception as exc:  # a channel that cannot be made: report, do not hang the parent
        conn.send(("error", (type(exc).__name__, str(exc))))
        return
    try:
        try:
            client.cluster_info()
        except ClientError as exc:
            conn.send(("error", (exc.code.name, exc.details)))
            return
        conn.send(("ready", None))
        try:
            msg = conn.recv()
        except EOFError:  # the parent is gone
            return
        if msg[0] != "go":
            return
        _, start_at, deadline = msg
        stats = _run(index, spec, client, ClientError, counters, stop, start_at, deadline)
        conn.send(("result", stats))
    finally:
        client.close()


def _run(index, spec: Spec, client, ClientError, counters, stop, start_at, deadline) -> dict:
    """The measured loop. Returns ``{"ops": {op: OpStats}, "calls": n, "end": t}``."""
    rnd = random.Random(int.from_bytes(os.urandom(8), "little") ^ index)
    values = _Values(spec.value_size, rnd) if spec.op in ("put", "mixed") else None
    ops = {"get": OpStats(), "put": OpStats()} if spec.op == "mixed" else {spec.op: OpStats()}
    keys, batch, sync = spec.keys, spec.batch, True if spec.sync else None
    now = time.monotonic
    pause = start_at - now()
    if pause > 0:
        time.sleep(pause)
    calls = 0
    end = now()
    parent, next_check = os.getppid(), 0.0
    while not stop.value:
        if end >= next_check:  # the parent killed (SIGTERM/SIGKILL): stop, do not run on
            if os.getppid() != parent:  # to the deadline (up to an hour) as an orphan
                break
            next_check = end + PARENT_CHECK_S
        if spec.op == "mixed":
            op = "put" if rnd.random() < MIXED_PUT_SHARE else "get"
        else:
            op = spec.op
        st = ops[op]
        if op == "mget":
            request = [KEY_FORMAT % rnd.randrange(keys) for _ in range(batch)]
        else:
            request = KEY_FORMAT % rnd.randrange(keys)
        value = values.next() if op == "put" else None
        t0 = now()
        if t0 >= deadline:
            break
        try:
            if op == "get":
                got = client.get(request) is not None
            elif op == "put":
                client.put(request, value, sync=sync)
                got = 0
            else:
                got = sum(v is not None for v in client.multi_get(request, chunk=batch))
        except ClientError as exc:
            end = now()
            st.failed(exc.code.name, (exc.details or "").strip().split("\n")[0])
        else:
            end = now()
            st.latencies.append(end - t0)
            st.keys += batch if op == "mget" else 1
            st.found += got
        calls += 1
        counters[index] += 1
    return {"ops": {name: vars(s) for name, s in ops.items()}, "calls": calls, "end": end}
