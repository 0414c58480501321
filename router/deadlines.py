"""The deadline a router gives its shard calls.

The router passes on what is left of the client's deadline (``context.time_remaining()``), so a
shard never works for a client that has given up; when the client set no deadline the router
applies a default (``--default-timeout``, and ``--admin-timeout`` for the long calls: Scan
streams, Flush and Compact).

It keeps back a small margin of the client's deadline (:data:`MARGIN_FRACTION` of what is
left, at most :data:`MARGIN_MAX` seconds): a shard that does not answer then fails the shard
call *before* the client's own deadline, so the client receives the router's
DEADLINE_EXCEEDED naming the shard (and the Admin fan-outs their per-shard sections for the
shards that did answer) instead of an anonymous deadline of its own.
"""

from __future__ import annotations

import grpc

from shard.status import StatusError

NO_DEADLINE = 1e9
"""gRPC reports ~9.2e18 s remaining when the client set no deadline."""

MARGIN_FRACTION = 0.1
"""Part of the client's remaining deadline the router keeps back for answering."""

MARGIN_MAX = 1.0
"""Upper bound of that margin, in seconds."""


def shard_timeout(context, default: float) -> float:
    """Seconds the shard calls of this request may take: the client's remaining deadline less
    the router's margin, or ``default`` when the client set none. Raises DEADLINE_EXCEEDED
    when the client's deadline has already passed."""
    remaining = context.time_remaining()
    if remaining is None or remaining > NO_DEADLINE:
        return default
    if remaining <= 0:
        raise StatusError(grpc.StatusCode.DEADLINE_EXCEEDED,
                          "the deadline expired before the router could call a shard")
    return remaining - min(remaining * MARGIN_FRACTION, MARGIN_MAX)
