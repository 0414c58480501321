"""What the cluster accepts, checked before a request is sent: key and value limits, and the
size a record takes in a gRPC message.

The limits are :class:`shard.limits.Limits`, the same object the client library sizes its
channel by and the router and shards check with: keys of 1..``max_key_bytes`` bytes, values of
at most ``max_value_bytes`` (the cluster's ``[limits] max_value_size``), messages of at most
``max_message_bytes`` = value limit + 1 MiB. :func:`cluster_limits` says where the CLI learns
the value limit (router/cli/target.py: the state file, else the config).

The byte counts (router/wire_sizes.py, shared with the client library; SYNC_FIELD_BYTES and
mutation_bytes are re-exported here) are the protobuf encoding of sievekv.v1 ``PutRequest`` /
``WriteRequest``, so a batch can be cut before it outgrows the message limit. Pure functions,
thread-safe.

>>> mutation_bytes(3, 5)  # a Mutation(key=3 bytes, value=5 bytes) inside a WriteRequest
14
"""

from __future__ import annotations

from engine.errors import InvalidArgumentError
from shard.limits import VALUE_LIMIT_SETTING, Limits

from ..wire_sizes import SYNC_FIELD_BYTES, mutation_bytes


def cluster_limits(args) -> Limits:
    """The limits of the cluster the command talks to (target.max_value_size)."""
    from . import target

    return Limits(max_value_bytes=target.max_value_size(args))


def value_over_limit(value_len: int, limits: Limits) -> str:
    """The message the servers give for a value over the limit (Limits.check_value), for a
    value the CLI could not send: it only knows its length."""
    return (f"value is {value_len} bytes, over the value limit of {limits.max_value_bytes} "
            f"bytes {VALUE_LIMIT_SETTING}")


def record_problem(key: bytes, value: bytes, limits: Limits,
                   sync: bool | None = None) -> str | None:
    """Why the put ``key -> value`` cannot be loaded, in the servers' words, or None.

    Checks the key and value limits and that a Write of this one record fits a message; a
    record that passes is accepted by a server with the same limits whatever batch it rides in
    (``load`` keeps batches of several records under 1 MiB, which any message limit admits).
    """
    try:
        limits.check_key(key)
        limits.check_value(value)
    except InvalidArgumentError as exc:
        problem = str(exc)
    else:
        problem = None
    size = mutation_bytes(len(key), len(value)) + (SYNC_FIELD_BYTES if sync is not None else 0)
    if size > limits.max_message_bytes:
        over = (f"as a Write the record is {size} bytes, over the gRPC message limit of "
                f"{limits.max_message_bytes} bytes")
        problem = over if problem is None else f"{problem}; {over}"
    return problem
