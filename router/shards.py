"""The router's connections to its shards: one long-lived channel per shard per process.

A channel reconnects by itself after a shard restarts; the reconnect backoff is capped at
``MAX_RECONNECT_BACKOFF_MS`` (gRPC's default grows to 120 s, far too long for a shard that
comes back after a restart). Calls never wait for a connection (no wait_for_ready): a shard
that cannot be reached fails its calls at once with UNAVAILABLE, naming the shard.

Call slots (a bulkhead, router/call_slots.py): every unary call a router process makes to a
shard holds one of that shard's ``max_calls`` read slots (Get, MultiGet) or write slots (Put,
Delete, Write) while it waits on it. A shard that stops
answering (a hung process, a stalled disk) would otherwise collect every handler thread of the
router, one per waiting call, and the calls for the *other* shards would queue behind them until
their deadlines: one sick shard would take the whole cluster down. With the slots, callers
beyond ``max_calls`` wait their turn while the shard answers; once it has answered none of its
calls for :data:`HUNG_AFTER` seconds they are refused at once with UNAVAILABLE naming it, and
the other threads stay free for the other shards. Scans and Admin calls take no slot (a scan
also waits on its client, a compaction for minutes) but are refused the same way while the
shard is hung.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2_grpc

from shard.limits import Limits
from shard.status import StatusError
from shard.tls import ClientTls, channel
from sievekv_proto import sievekv_pb2_grpc as pbg

from .call_slots import CallSlots
from .cluster_map import ShardSpec
from .deadlines import shard_timeout

INITIAL_RECONNECT_BACKOFF_MS = 100
MAX_RECONNECT_BACKOFF_MS = 2000

HUNG_AFTER = 2.0
"""Seconds a shard with every call slot taken may answer nothing before it is treated as hung."""


class ShardClient:
    """Stubs of one shard over one channel. Thread-safe (gRPC channels and stubs are)."""

    def __init__(self, spec: ShardSpec, limits: Limits, max_calls: int = 8,
                 tls: ClientTls | None = None):
        """``tls``: connect over TLS with these credentials (the router's ``--shard-tls-*``),
        else plaintext; the shard's health checks use the same channel."""
        self.name = spec.name
        self.address = spec.address
        self.label = f"shard {spec.name} at {spec.address}"
        # Reads and writes wait in separate pools: a write stall (writers held until a
        # compaction catches up) must not take the slots of reads, which it does not slow.
        self.reads = CallSlots(max_calls, HUNG_AFTER)
        self.writes = CallSlots(max_calls, HUNG_AFTER)
        self.channel = channel(spec.address, tls=tls, options=[
            *limits.grpc_options(),
            ("grpc.initial_reconnect_backoff_ms", INITIAL_RECONNECT_BACKOFF_MS),
            ("grpc.min_reconnect_backoff_ms", INITIAL_RECONNECT_BACKOFF_MS),
            ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
            # one channel per shard and process: never share a subchannel with other channels
            ("grpc.use_local_subchannel_pool", 1),
        ])
        self.kv = pbg.KVStub(self.channel)
        self.admin = pbg.AdminStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def call(self, pool: CallSlots, method, request, context, default_timeout: float):
        """``method(request)`` (a unary stub method of this shard) holding a slot of ``pool``
        (``self.reads`` or ``self.writes``), with the client's remaining deadline (less the
        router's margin) or ``default_timeout``. Raises the StatusError to send the client
        (:meth:`take_slot`'s, or the shard's own failure, named)."""
        self.take_slot(pool, context, default_timeout)
        answered = False
        try:
            response = method(request, timeout=shard_timeout(context, default_timeout))
            answered = True
            return response
        except grpc.RpcError as exc:
            answered = exc.code() is not grpc.StatusCode.DEADLINE_EXCEEDED
            raise self.error(exc) from None
        finally:
            pool.release(answered)

    def take_slot(self, pool: CallSlots, context, default_timeout: float) -> None:
        """Take a slot of ``pool``, waiting for one at most until the call's deadline (less the
        router's margin). Raises UNAVAILABLE (:meth:`busy_error`) if the shard is hung, or
        DEADLINE_EXCEEDED if the deadline came first. Pair with ``pool.release``. A write is
        refused too while the shard's reads are hung (the process answers nothing); reads are
        not refused for a write stall."""
        if pool is self.writes and self.reads.hung():
            raise self.busy_error(self.reads)
        if pool.acquire(shard_timeout(context, default_timeout)):
            return
        if pool.hung():
            raise self.busy_error(pool)
        raise StatusError(grpc.StatusCode.DEADLINE_EXCEEDED,
                          f"{self.label}: the deadline passed while waiting for one of its "
                          f"{pool.capacity} call slots (all busy)")

    def check_not_hung(self) -> None:
        """Raise UNAVAILABLE (:meth:`busy_error`) if the shard's reads are hung (for calls that
        take no slot: scans, Admin)."""
        if self.reads.hung():
            raise self.busy_error(self.reads)

    def busy_details(self, pool: CallSlots) -> str:
        what = "reads" if pool is self.reads else "writes"
        return (f"{self.label} is not answering: none of the {pool.capacity} {what} this router "
                f"process has waiting on it got an answer for {HUNG_AFTER:g} s (hung, or "
                f"{'stalled' if what == 'reads' else 'a write stall'}), so it gets no more for now")

    def busy_error(self, pool: CallSlots) -> StatusError:
        return StatusError(grpc.StatusCode.UNAVAILABLE, self.busy_details(pool))

    def error(self, exc: grpc.RpcError) -> StatusError:
        """The StatusError to send the client for a failed call to this shard: same code,
        details prefixed with the shard's name and address."""
        return StatusError(*translate(self.label, exc))

    def close(self) -> None:
        self.channel.close()


def translate(label: str, exc: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    """(code, details) of a failed shard call, the details naming the shard."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = (exc.details() if hasattr(exc, "details") else None) or str(code.name)
    if code == grpc.StatusCode.UNAVAILABLE:
        return code, f"{label} is unavailable: {details}"
    if code == grpc.StatusCode.CANCELLED:
        # Not our cancellation (a cancelled client call ends the handler before this): the
        # shard stopped while the call was queued, as at the end of a drain.
        return grpc.StatusCode.UNAVAILABLE, f"{label} cancelled the call (shutting down?)"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return code, f"{label} did not answer before the deadline"
    return code, f"{label}: {details}"
