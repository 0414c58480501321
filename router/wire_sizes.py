"""Bytes a request takes in a gRPC message: the protobuf encoding of sievekv.v1 messages
(proto/sievekv.proto), so that a batch can be cut before it outgrows the message limit.

Each field is a tag byte (every field number here is below 16), then for ``bytes`` a varint
length and the payload; proto3 writes no empty ``bytes`` field and no false ``bool``, but an
``optional bool`` (``sync``) is written whenever it is set, true or false. Used by the client
library's WriteBatcher (router/client.py) and the CLI (router/cli/sizes.py). Pure functions,
thread-safe; tests compare them with ``ByteSize()`` of the messages.

>>> mutation_bytes(3, 5)  # a Mutation(key=3 bytes, value=5 bytes) inside a WriteRequest
14
>>> delete_bytes(3)       # a Mutation(key=3 bytes, is_delete=true) inside a WriteRequest
9
"""

from __future__ import annotations

# A WriteRequest's / PutRequest's optional ``sync`` flag: one tag byte and one value byte.
SYNC_FIELD_BYTES = 2
# Mutation.is_delete = true: one tag byte and one value byte.
_DELETE_FLAG_BYTES = 2


def varint_bytes(n: int) -> int:
    """Bytes of ``n`` (>= 0) as a protobuf varint."""
    size = 1
    while n >= 0x80:
        n >>= 7
        size += 1
    return size


def field_bytes(payload: int) -> int:
    """A length-delimited field (tag < 16) carrying ``payload`` bytes; 0 if empty."""
    return 1 + varint_bytes(payload) + payload if payload else 0


def mutation_bytes(key_len: int, value_len: int) -> int:
    """Bytes one put (``Mutation{key, value}``) adds to a ``WriteRequest``, framing included."""
    m = field_bytes(key_len) + field_bytes(value_len)
    return 1 + varint_bytes(m) + m


def delete_bytes(key_len: int) -> int:
    """Bytes one delete (``Mutation{key, is_delete: true}``) adds to a ``WriteRequest``."""
    m = field_bytes(key_len) + _DELETE_FLAG_BYTES
    return 1 + varint_bytes(m) + m


def put_request_bytes(key_len: int, value_len: int, sync: bool | None = None) -> int:
    """Bytes of ``PutRequest{key, value, sync}``."""
    return (field_bytes(key_len) + field_bytes(value_len)
            + (SYNC_FIELD_BYTES if sync is not None else 0))
