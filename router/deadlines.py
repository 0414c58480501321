"""The deadline a router gives its shard calls.

The router passes on what is left of the client's deadline (``context.time_remaining()``), so a
shard never works for a client that has given up; when the client set no deadline the router
applies a default (``--default-timeout``, and ``--admin-timeout`` for Flush/Compact).
"""

from __future__ import annotations

import grpc

from shard.status import StatusError

NO_DEADLINE = 1e9
"""gRPC reports ~9.2e18 s remaining when the client set no deadline."""


def shard_timeout(context, default: float) -> float:
    """Seconds the shard calls of this request may take. Raises DEADLINE_EXCEEDED when the
    client's deadline has already passed."""
    remaining = context.time_remaining()
    if remaining is None or remaining > NO_DEADLINE:
        return default
    if remaining <= 0:
        raise StatusError(grpc.StatusCode.DEADLINE_EXCEEDED,
                          "the deadline expired before the router could call a shard")
    return remaining
