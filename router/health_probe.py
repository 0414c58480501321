"""Ask a process for its gRPC health (grpc.health.v1), with a short deadline.

Used by the supervisor (is a freshly started shard SERVING yet?) and by `cluster status`.
Never raises for an unreachable or misbehaving server: the answer is a string.
Thread-safe; each call opens and closes its own channel (TLS with ``tls``: a TLS server
asked in plaintext, or with credentials it refuses, reads UNREACHABLE).
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from shard.tls import ClientTls, channel as open_channel

SERVING = "SERVING"
NOT_SERVING = "NOT_SERVING"
UNREACHABLE = "UNREACHABLE"
UNKNOWN = "UNKNOWN"

_NAMES = {
    health_pb2.HealthCheckResponse.SERVING: SERVING,
    health_pb2.HealthCheckResponse.NOT_SERVING: NOT_SERVING,
    health_pb2.HealthCheckResponse.UNKNOWN: UNKNOWN,
    health_pb2.HealthCheckResponse.SERVICE_UNKNOWN: UNKNOWN,
}


def probe(address: str, timeout: float = 1.0, service: str = "",
          tls: ClientTls | None = None) -> str:
    """Return SERVING, NOT_SERVING, UNKNOWN or UNREACHABLE for the server at ``address``."""
    channel = open_channel(address, [("grpc.enable_retries", 0)], tls)
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        return _NAMES.get(resp.status, UNKNOWN)
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        if code == grpc.StatusCode.NOT_FOUND:
            return UNKNOWN
        return UNREACHABLE
    finally:
        channel.close()
