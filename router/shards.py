"""The router's connections to its shards: one long-lived channel per shard per process.

A channel reconnects by itself after a shard restarts; the reconnect backoff is capped at
``MAX_RECONNECT_BACKOFF_MS`` (gRPC's default grows to 120 s, far too long for a shard that
comes back after a restart). Calls never wait for a connection (no wait_for_ready): a shard
that cannot be reached fails its calls at once with UNAVAILABLE, naming the shard.

Call slots (a bulkhead): every call a router process makes to a shard holds one of that
shard's ``max_calls`` slots while it waits. A shard that stops answering (hung process, stalled
disk) would otherwise collect every handler thread of the router, one per waiting call, and
calls for the *other* shards would queue behind them until their deadlines: one sick shard
would take the whole cluster down. With the slots, once a shard has ``max_calls`` calls in
flight, a new call for it waits at most :data:`SLOT_WAIT` for a slot and is then refused with
UNAVAILABLE naming the shard, and the other threads stay free for the other shards. A healthy
shard answers in about a millisecond, so its slots free up long before the wait ends.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2_grpc

from shard.limits import Limits
from shard.status import StatusError
from sievekv_proto import sievekv_pb2_grpc as pbg

from .call_slots import CallSlots
from .cluster_map import ShardSpec

INITIAL_RECONNECT_BACKOFF_MS = 100
MAX_RECONNECT_BACKOFF_MS = 2000

SLOT_WAIT = 0.1
"""Seconds a call waits for one of its shard's call slots before it is refused."""


class ShardClient:
    """Stubs of one shard over one channel. Thread-safe (gRPC channels and stubs are)."""

    def __init__(self, spec: ShardSpec, limits: Limits, max_calls: int = 8):
        self.name = spec.name
        self.address = spec.address
        self.label = f"shard {spec.name} at {spec.address}"
        self.max_calls = max_calls
        self._slots = CallSlots(max_calls)
        self.channel = grpc.insecure_channel(spec.address, options=[
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

    def try_acquire(self) -> bool:
        """Take one of this shard's call slots, waiting at most :data:`SLOT_WAIT`; False if
        none freed up (see the module docstring). A True must be paired with :meth:`release`."""
        return self._slots.acquire(SLOT_WAIT)

    def acquire(self) -> None:
        """:meth:`try_acquire`, raising UNAVAILABLE (:meth:`busy_error`) when it fails."""
        if not self._slots.acquire(SLOT_WAIT):
            raise self.busy_error()

    def release(self) -> None:
        self._slots.release()

    def busy_details(self) -> str:
        return (f"{self.label} is not answering: {self.max_calls} calls from this router "
                f"process are waiting on it (hung or overloaded), so it gets no more")

    def busy_error(self) -> StatusError:
        return StatusError(grpc.StatusCode.UNAVAILABLE, self.busy_details())

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
