"""The errors :class:`router.client.Client` raises: one class per status code a caller may want
to handle, all under :class:`ClientError` (which carries ``code`` and ``details``).

=========================  ======================================================
status code                class
=========================  ======================================================
INVALID_ARGUMENT           InvalidArgumentError (empty/oversized key or value)
UNAVAILABLE                UnavailableError (a shard or the router cannot serve)
DATA_LOSS                  DataLossError (corruption; details name the file)
RESOURCE_EXHAUSTED         ResourceExhaustedError (a message over the size limit, a full disk,
                           a write stall past the deadline (the write was not applied), or a
                           server's limit of scans at once)
DEADLINE_EXCEEDED          DeadlineExceededError
INTERNAL, UNKNOWN          InternalError
any other                  ClientError
=========================  ======================================================

A TLS file given to the Client (``tls_ca``, ``tls_cert``, ``tls_key``) that cannot be used
(missing, empty, not PEM, a key that does not match its certificate, an expired own
certificate) raises :class:`TlsFileError` from the constructor, before any call: an
InvalidArgumentError (code INVALID_ARGUMENT, ``details`` name the file and what is wrong),
and also a :class:`shard.tls.TlsError` (a ValueError), as the servers raise for their files.

A call on a closed Client raises :class:`ClosedError` (CANCELLED; also a ValueError, as I/O
on a closed file is). Arguments are checked before anything is sent, as Python functions do:
a key or value that is not ``bytes`` raises TypeError, a number out of range (a negative
``limit``, timeout or backoff) ValueError; those are the caller's bugs, not failed calls, so
they are not ClientErrors. Sizes are the server's to check (InvalidArgumentError).

A Write through the router that applied on some shards only raises :class:`PartialWriteError`
(a subclass of the class of the failure's code, e.g. UnavailableError) whose ``results`` say
per shard whether it applied; a Flush/Compact that failed on some shards raises
:class:`PartialAdminError` with per-shard ``sections``.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from shard.tls import TlsError


class ClientError(Exception):
    """A failed call. ``code`` is the grpc.StatusCode, ``details`` the server's one line."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class InvalidArgumentError(ClientError):
    pass


class UnavailableError(ClientError):
    pass


class DataLossError(ClientError):
    pass


class ResourceExhaustedError(ClientError):
    pass


class DeadlineExceededError(ClientError):
    pass


class InternalError(ClientError):
    pass


class TlsFileError(InvalidArgumentError, TlsError):
    """A TLS file given to :class:`router.client.Client` cannot be used; ``details`` is one
    line naming it (shard.tls.TlsError's). Raised by the constructor; no call was made."""

    def __init__(self, details: str):
        super().__init__(grpc.StatusCode.INVALID_ARGUMENT, details)


class ClosedError(ClientError, ValueError):
    """A call on a :class:`router.client.Client` after its ``close()`` (or one it cut short)."""

    def __init__(self, address: str):
        super().__init__(grpc.StatusCode.CANCELLED, f"the client of {address} is closed")


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DATA_LOSS: DataLossError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.INTERNAL: InternalError,
    grpc.StatusCode.UNKNOWN: InternalError,
}


def class_for(code: grpc.StatusCode) -> type[ClientError]:
    return _BY_CODE.get(code, ClientError)


@dataclass(frozen=True)
class ShardWrite:
    """One shard's part of a Write: ``applied`` is confirmed when true; when false with
    UNAVAILABLE or DEADLINE_EXCEEDED it is unknown whether the shard applied it."""

    shard: str
    applied: bool
    mutations: int
    code: grpc.StatusCode
    message: str


@dataclass(frozen=True)
class ShardResult:
    """One shard's part of an admin call (Flush/Compact/Stats...)."""

    shard: str
    address: str
    ok: bool
    code: grpc.StatusCode
    error: str
    report: dict | None = None  # Verify: the shard's report (tables, data_blocks, bytes, ...)


class PartialWriteError(ClientError):
    """A Write applied on some shards only; ``results`` is one ShardWrite per shard."""

    def __init__(self, code: grpc.StatusCode, details: str, results: list[ShardWrite]):
        super().__init__(code, details)
        self.results = results


class PartialAdminError(ClientError):
    """A Flush/Compact failed on some shards; ``sections`` is one ShardResult per shard."""

    def __init__(self, code: grpc.StatusCode, details: str, sections: list[ShardResult]):
        super().__init__(code, details)
        self.sections = sections


_CODES = {c.value[0]: c for c in grpc.StatusCode}


def status_code(number: int) -> grpc.StatusCode:
    """grpc.StatusCode for its integer value (UNKNOWN for an unknown number)."""
    return _CODES.get(number, grpc.StatusCode.UNKNOWN)
