"""Exit codes of the ``sievekv`` command, and the one exception every command raises.

=====  ===========  ==========================================================================
code   name         meaning
=====  ===========  ==========================================================================
0      OK           success
1      ERROR        any other failure (server error, data loss reported by a shard, I/O error)
2      USAGE        bad arguments, bad config file, bad input data, a key or value over a limit
3      UNREACHABLE  no cluster: no state file, supervisor or router not running or not answering
4      PARTIAL      some shards (or processes) failed while others succeeded
5      NOT_FOUND    ``get`` of a key that is absent
6      CONFLICT     already running: data directory locked, port in use
7      BUSY         a server is out of a resource for now: a full disk, a write stall past
                    the deadline (nothing applied), its limit of scans at once; the same
                    command may succeed later (RESOURCE_EXHAUSTED; one about
                    a message or answer over a size limit is USAGE instead: asking again fails)
130    INTERRUPTED  interrupted (Ctrl-C, SIGINT); ``load`` says how far it got
=====  ===========  ==========================================================================

A command reports failure by raising :class:`CliError`; ``main`` prints
``sievekv: error: <message>`` on stderr (one line) and exits with its code.
"""

from __future__ import annotations

import grpc

OK = 0
ERROR = 1
USAGE = 2
UNREACHABLE = 3
PARTIAL = 4
NOT_FOUND = 5
CONFLICT = 6
BUSY = 7
INTERRUPTED = 130  # 128 + SIGINT, as shells report it

TABLE = [
    (OK, "success"),
    (ERROR, "other failure (server error, data loss, I/O error)"),
    (USAGE, "usage error: bad arguments, config, input data, or a key/value over a limit"),
    (UNREACHABLE, "cluster unreachable: not started, not running, or not answering"),
    (PARTIAL, "partial failure: some shards or processes failed, others succeeded"),
    (NOT_FOUND, "not found: get of an absent key"),
    (CONFLICT, "conflict: cluster already running, data directory locked, port in use"),
    (BUSY, "busy: a server is out of a resource (full disk, write stall, too many scans); "
           "retry later"),
    (INTERRUPTED, "interrupted (Ctrl-C)"),
]


class CliError(Exception):
    """A failure to report as one line with an exit code."""

    def __init__(self, message: str, code: int = ERROR):
        super().__init__(message)
        self.code = code


_GRPC_CODES = {
    grpc.StatusCode.UNAVAILABLE: UNREACHABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: UNREACHABLE,
    grpc.StatusCode.INVALID_ARGUMENT: USAGE,
    grpc.StatusCode.OUT_OF_RANGE: USAGE,
    grpc.StatusCode.NOT_FOUND: NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION: CONFLICT,
}


# How a RESOURCE_EXHAUSTED about a size limit reads: gRPC's own ("Received message larger than
# max (N vs. M)", "Sent message larger than max"), the engine's ResultTooLargeError ("the
# values found exceed N bytes") and a MultiGet answer the shard or router refuses ("the values
# found exceed the message limit of N bytes", shard/limits.py). Any other (a full disk, a
# server's scan limit) is BUSY.
_SIZE_LIMIT_WORDS = ("larger than max", "values found exceed")  # not EDQUOT's "quota exceeded"


def code_for_grpc(status: grpc.StatusCode | None, details: str | None = None) -> int:
    """The exit code for a failed call with gRPC ``status`` and the server's ``details``."""
    if status == grpc.StatusCode.RESOURCE_EXHAUSTED:
        text = (details or "").lower()
        return USAGE if any(w in text for w in _SIZE_LIMIT_WORDS) else BUSY
    return _GRPC_CODES.get(status, ERROR)


def from_client_error(exc, what: str) -> CliError:
    """A CliError for a router.client_errors.ClientError: ``<what>: <STATUS>: <details>``."""
    details = (exc.details or "").strip().splitlines()
    first = details[0] if details else ""
    return CliError(f"{what}: {exc.code.name}: {first}" if first else f"{what}: {exc.code.name}",
                    code_for_grpc(exc.code, exc.details))


def from_rpc_error(exc: grpc.RpcError, what: str) -> CliError:
    """A CliError for a failed call: ``<what>: <STATUS>: <server's message>``."""
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    name = code.name if code is not None else "ERROR"
    first = (details or "").strip().splitlines()[0] if details else ""
    return CliError(f"{what}: {name}: {first}" if first else f"{what}: {name}",
                    code_for_grpc(code, details))


def epilog() -> str:
    """The exit-code table for ``--help``."""
    return "exit codes:\n" + "\n".join(f"  {c:>3}  {text}" for c, text in TABLE)
