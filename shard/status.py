"""Errors to gRPC status codes, and the guard that wraps every handler of a server.

No Python traceback ever reaches a client. The guard maps:

==============================  ===================  =======================================
raised in a handler             status code          details
==============================  ===================  =======================================
StatusError(code, message)      code                 message
AlreadyExistsError              ALREADY_EXISTS       the message, naming the path
InvalidArgumentError            INVALID_ARGUMENT     the message, naming the limit
CorruptionError                 DATA_LOSS            the message, naming the file (and offset)
ClosedError                     UNAVAILABLE          the message
LockedError                     FAILED_PRECONDITION  the message
ResultTooLargeError             RESOURCE_EXHAUSTED   the message (an answer over the limit)
WriteStalledError               RESOURCE_EXHAUSTED   the message (writes held past the call's
                                                     deadline; the write was not applied)
StorageIOError, ENOSPC/EDQUOT   RESOURCE_EXHAUSTED   the message (a full disk: gRPC's own example;
                                                     INTERNAL if the DB must be reopened)
StorageIOError / other Sieve..  INTERNAL             the message
any other exception             INTERNAL             one line; traceback logged server-side
==============================  ===================  =======================================

The guard also refuses every call with UNAVAILABLE while the server drains, and records
request metrics (:mod:`shard.metrics`) when the server has them.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from types import SimpleNamespace
from typing import Callable

import grpc

from engine.errors import (AlreadyExistsError, ClosedError, CorruptionError,
                           InvalidArgumentError, LockedError, ResultTooLargeError, SieveError,
                           StorageIOError, WriteStalledError)

log = logging.getLogger(__name__)

# A disk or quota that is full: gRPC's RESOURCE_EXHAUSTED ("perhaps the entire file system is
# out of space"), which tells a caller to retry later rather than that the server is broken.
FULL_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})

OK = grpc.StatusCode.OK
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
INTERNAL = grpc.StatusCode.INTERNAL


class StatusError(Exception):
    """Raised by handler code to end the call with ``code`` and ``message``."""

    def __init__(self, code: grpc.StatusCode, message: str,
                 trailers: tuple[tuple[str, bytes | str], ...] = ()):
        super().__init__(message)
        self.code = code
        self.message = message
        self.trailers = trailers


def one_line(text: str, limit: int = 500) -> str:
    """Collapse ``text`` to one line of at most ``limit`` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The (code, one-line details) a handler exception maps to (see the module table)."""
    if isinstance(exc, StatusError):
        return exc.code, one_line(exc.message)
    if isinstance(exc, AlreadyExistsError):
        return grpc.StatusCode.ALREADY_EXISTS, one_line(str(exc))
    if isinstance(exc, InvalidArgumentError):
        return grpc.StatusCode.INVALID_ARGUMENT, one_line(str(exc))
    if isinstance(exc, CorruptionError):
        return grpc.StatusCode.DATA_LOSS, one_line(str(exc))
    if isinstance(exc, ClosedError):
        return UNAVAILABLE, one_line(str(exc) or "closed")
    if isinstance(exc, LockedError):
        return grpc.StatusCode.FAILED_PRECONDITION, one_line(str(exc))
    if isinstance(exc, (ResultTooLargeError, WriteStalledError)):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, one_line(str(exc))
    if (isinstance(exc, StorageIOError) and exc.errno in FULL_DISK_ERRNOS
            and exc.retryable is not False):  # (a DB that must be reopened is INTERNAL)
        return grpc.StatusCode.RESOURCE_EXHAUSTED, one_line(str(exc))
    if isinstance(exc, SieveError):
        return INTERNAL, one_line(str(exc))
    return INTERNAL, one_line(f"internal error: {type(exc).__name__}: {exc}")


class Guard:
    """Wraps a servicer's methods: draining check, exception mapping, request metrics.

    Thread-safe: handlers run concurrently; ``draining`` is a plain attribute read per call
    (set once, never cleared); ``in_flight`` counts admitted calls not yet finished, under a
    lock, so a drain can wait for them.
    """

    def __init__(self, server_name: str, metrics=None):
        self.server_name = server_name
        self.metrics = metrics
        self.draining = False
        self.in_flight = 0
        self._lock = threading.Lock()

    def _enter(self) -> None:
        with self._lock:
            self.in_flight += 1

    def _exit(self) -> None:
        with self._lock:
            self.in_flight -= 1

    # -- wrapping ------------------------------------------------------------------------------
    def wrap(self, servicer, service_descriptor) -> SimpleNamespace:
        """An object with one guarded handler per method of ``service_descriptor``, suitable
        for the generated ``add_<Service>Servicer_to_server``."""
        handlers = {}
        for method in service_descriptor.methods:
            fn = getattr(servicer, method.name)
            if method.server_streaming:
                handlers[method.name] = self._stream(method.name, fn)
            else:
                handlers[method.name] = self._unary(method.name, fn)
        return SimpleNamespace(**handlers)

    def _refusal(self) -> str:
        return f"{self.server_name} is draining (shutting down); retry on another server"

    def _fail(self, context, exc: BaseException) -> tuple[grpc.StatusCode, str]:
        code, details = status_of(exc)
        if code is INTERNAL and not isinstance(exc, SieveError) and not isinstance(exc, StatusError):
            log.error("unexpected error in %s", self.server_name, exc_info=exc)
        if isinstance(exc, StatusError) and exc.trailers:
            context.set_trailing_metadata(exc.trailers)
        return code, details

    def _unary(self, name: str, fn: Callable):
        observe = self.metrics.observer(name) if self.metrics is not None else None
        guard = self

        def handler(request, context):
            t0 = time.perf_counter()
            guard._enter()  # before the draining check: a drain that misses this call waits for it
            try:
                if guard.draining:
                    raise StatusError(UNAVAILABLE, guard._refusal())
                response = fn(request, context)
            except Exception as exc:  # noqa: BLE001 - every failure becomes a status
                code, details = guard._fail(context, exc)
            else:
                if observe is not None:
                    observe(OK, time.perf_counter() - t0)
                return response
            finally:
                guard._exit()
            if observe is not None:
                observe(code, time.perf_counter() - t0)
            context.abort(code, details)

        handler.__name__ = name
        return handler

    def _stream(self, name: str, fn: Callable):
        observe = self.metrics.observer(name) if self.metrics is not None else None
        guard = self

        def handler(request, context):
            t0 = time.perf_counter()
            code = OK
            guard._enter()
            try:
                if guard.draining:
                    raise StatusError(UNAVAILABLE, guard._refusal())
                yield from fn(request, context)
            except GeneratorExit:
                code = grpc.StatusCode.CANCELLED
                raise
            except Exception as exc:  # noqa: BLE001 - every failure becomes a status
                code, details = guard._fail(context, exc)
            finally:
                guard._exit()
                if observe is not None:
                    observe(code, time.perf_counter() - t0)
            if code is not OK:
                context.abort(code, details)

        handler.__name__ = name
        return handler
