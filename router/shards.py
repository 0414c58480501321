"""The router's connections to its shards: one long-lived channel per shard per process.

A channel reconnects by itself after a shard restarts; the reconnect backoff is capped at
``MAX_RECONNECT_BACKOFF_MS`` (gRPC's default grows to 120 s, far too long for a shard that
comes back after a restart). Calls never wait for a connection (no wait_for_ready): a shard
that cannot be reached fails its calls at once with UNAVAILABLE, naming the shard.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2_grpc

from shard.limits import Limits
from shard.status import StatusError
from sievekv_proto import sievekv_pb2_grpc as pbg

from .cluster_map import ShardSpec

INITIAL_RECONNECT_BACKOFF_MS = 100
MAX_RECONNECT_BACKOFF_MS = 2000


class ShardClient:
    """Stubs of one shard over one channel. Thread-safe (gRPC channels and stubs are)."""

    def __init__(self, spec: ShardSpec, limits: Limits):
        self.name = spec.name
        self.address = spec.address
        self.label = f"shard {spec.name} at {spec.address}"
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
