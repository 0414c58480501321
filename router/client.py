"""The Python client library for applications: ``Client(address)`` talks to a router (the
whole cluster) or to one shard (its data only); both serve the same services.

    with Client("127.0.0.1:7000") as c:
        c.put(b"k", b"v")
        assert c.get(b"k") == b"v"
        with c.batch() as b:          # a WriteBatcher: sends Writes of bounded size
            b.put(b"a", b"1"); b.delete(b"b")
        for key, value in c.scan(b"a", b"z", limit=10): ...

Every method takes ``timeout`` (seconds, the call's whole budget including retries; default
``Client.timeout``, except scan, which has no deadline unless given: see :meth:`Client.scan`).
Reads (get, multi_get, scan, stats, filter_report, cluster_info) are retried on UNAVAILABLE,
and on a CANCELLED this client did not cause (a server stopping cancels the calls it had
received but not started), with exponential backoff (``retries`` times at most, delays
``backoff * 2**i`` capped at ``max_backoff``, never past the deadline; the defaults span
~1.3-2.6 s, longer than a channel's 2 s reconnect backoff, so a read outlives a process
restart); a scan that fails mid-way resumes after the last key it yielded; a multi_get
whose answer is over the message limit (large values) is asked again in halves. Writes are
not retried: the caller decides (a Put is idempotent, but a Write spanning shards may have
applied in part). Errors are :mod:`router.client_errors` classes. Thread-safe: one Client
may be shared by threads.

Arguments are checked before anything is sent: an address that is not HOST:PORT with a port
in 1..65535 (an IPv6 host in brackets, ``[::1]:50051``) raises ValueError, a key or value that is not ``bytes`` (a str,
None where a value is required: ``put(k, None)`` is not a delete) raises TypeError, a number
out of range (a negative ``limit``, ``timeout``, ``retries`` or ``backoff``) ValueError. A
call after :meth:`Client.close` raises :class:`~router.client_errors.ClosedError`.
"""

from __future__ import annotations

import functools
import json
import math
import os
import random
import time
from typing import Iterable, Iterator

import grpc

from shard.address import check_address
from shard.limits import Limits
from shard.tls import TlsError, client_tls, channel as open_channel
from sievekv_proto import sievekv_pb2 as pb
from sievekv_proto import sievekv_pb2_grpc as pbg

from . import client_errors as errors
from .admin_servicer import ADMIN_RESULT_TRAILER
from .kv_servicer import WRITE_RESULT_TRAILER
from .wire_sizes import SYNC_FIELD_BYTES, delete_bytes, mutation_bytes

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
RETRYABLE = (UNAVAILABLE, grpc.StatusCode.CANCELLED)
"""Codes a read is retried on. A blocking call is never cancelled by this client, and a scan
only once it has stopped reading, so a CANCELLED comes from the server's side."""


def to_client_error(exc: grpc.RpcError) -> errors.ClientError:
    """The ClientError for a failed call (PartialWriteError/PartialAdminError when the router
    attached per-shard results)."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = (exc.details() if hasattr(exc, "details") else None) or code.name
    trailers = dict(exc.trailing_metadata() or ()) if hasattr(exc, "trailing_metadata") else {}
    if WRITE_RESULT_TRAILER in trailers:
        response = pb.WriteResponse.FromString(trailers[WRITE_RESULT_TRAILER])
        cls = _partial(errors.PartialWriteError, errors.class_for(code))
        return cls(code, details, [_shard_write(r) for r in response.shards])
    if ADMIN_RESULT_TRAILER in trailers:
        response = pb.AdminResponse.FromString(trailers[ADMIN_RESULT_TRAILER])
        cls = _partial(errors.PartialAdminError, errors.class_for(code))
        return cls(code, details, [_section(s) for s in response.shards])
    return errors.class_for(code)(code, details)


@functools.lru_cache(maxsize=None)
def _partial(partial: type, by_code: type) -> type:
    """A Partial*Error that is also the class of its status code (e.g. UnavailableError)."""
    if issubclass(partial, by_code):
        return partial
    return type(partial.__name__, (partial, by_code), {})


def _shard_write(r) -> errors.ShardWrite:
    return errors.ShardWrite(r.shard, r.applied, r.mutations, errors.status_code(r.code), r.message)


def _section(s) -> errors.ShardResult:
    return errors.ShardResult(s.shard, s.address, s.ok, errors.status_code(s.code), s.error,
                              json.loads(s.json) if s.json else None)


def _mutation(m) -> pb.Mutation:
    """The Mutation for a ``(key, value)`` pair of Client.write (value None: a delete)."""
    try:
        key, value = m
    except (TypeError, ValueError):
        raise TypeError(f"each mutation must be a (key, value) pair, got {m!r:.60}") from None
    if value is None:
        return pb.Mutation(key=_check_bytes(key, "each key"), is_delete=True)
    return pb.Mutation(key=_check_bytes(key, "each key"),
                       value=_check_bytes(value, "each value (None to delete)"))


MAX_TIMEOUT = 1e6
"""Longest timeout accepted, in seconds: gRPC deadlines overflow near 9.2e9 s (every call then
fails at once with DEADLINE_EXCEEDED)."""


def _check_timeout(timeout, least: str = "> 0") -> float:
    """``timeout`` if it is a number of seconds up to MAX_TIMEOUT and ``least`` ("> 0", or
    ">= 0" for one call: 0 is a deadline already passed), else ValueError."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not (0 < timeout if least == "> 0" else 0 <= timeout) or not timeout <= MAX_TIMEOUT:
        raise ValueError(f"timeout must be a number of seconds {least} and at most "
                         f"{MAX_TIMEOUT:.0f}, got {timeout!r}")
    return timeout


def _check_bytes(value, what: str) -> bytes:
    """``value`` if it is bytes, else TypeError naming ``what``."""
    if isinstance(value, bytes):
        return value
    hint = " (encode it, e.g. with .encode())" if isinstance(value, str) else ""
    raise TypeError(f"{what} must be bytes, got {type(value).__name__}{hint}")


def _time_left(deadline: float, now: float) -> float:
    """Seconds until ``deadline``; DeadlineExceededError, before anything is sent, once it
    has passed. gRPC enforces deadlines only to about a millisecond: a call sent with 0 s
    left was often applied, and its caller told OK or DEADLINE_EXCEEDED at random (session 20
    review: 18 of 20 ``put(timeout=0)`` applied)."""
    left = deadline - now
    if left <= 0:
        raise errors.DeadlineExceededError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                           "the call's deadline passed before it was sent")
    return left


def _check_int(value, what: str, least: int, most: int = 2 ** 64 - 1) -> int:
    """``value`` if it is an int in ``least..most``, else TypeError/ValueError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an integer, got {type(value).__name__}")
    if value < least:
        raise ValueError(f"{what} must be at least {least}, got {value}")
    if value > most:
        raise ValueError(f"{what} must be at most {most}, got {value}")
    return value


def _check_seconds(value, what: str) -> float:
    """``value`` if it is a finite number of seconds >= 0, else TypeError/ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, got {type(value).__name__}")
    if not (0 <= value and math.isfinite(value)):
        raise ValueError(f"{what} must be a finite number of seconds >= 0, got {value!r}")
    return value


def _check_sync(sync) -> bool | None:
    if sync is not None and not isinstance(sync, bool):
        raise TypeError(f"sync must be True, False or None, got {type(sync).__name__}")
    return sync


class Client:
    """A connection (one gRPC channel) to a router or a shard. See the module docstring.

    TLS: ``tls_ca`` (path of a PEM CA certificate) connects over TLS and verifies the server
    with that CA; ``tls=True`` without ``tls_ca`` verifies it with the system's roots.
    ``tls_cert`` and ``tls_key`` (paths, both or neither) are the client certificate that a
    server started with ``--tls-client-ca`` (mutual TLS) requires; giving them also turns TLS
    on. The server's certificate must name the host of ``address`` (an IP address needs an IP
    subjectAltName). The files are read and checked here: one that cannot be used raises
    :class:`~router.client_errors.TlsFileError` naming it (an InvalidArgumentError, so a
    ClientError; also a shard.tls.TlsError and a ValueError). A TLS mismatch (wrong CA, TLS
    against a plaintext server or the reverse, a refused client certificate) fails calls with
    UnavailableError, as an unreachable server does.

        with Client("shard-0.example:7000", tls_ca="ca.pem",
                    tls_cert="client.pem", tls_key="client-key.pem") as c: ...
    """

    def __init__(self, address: str, *, timeout: float = 10.0, retries: int = 6,
                 backoff: float = 0.05, max_backoff: float = 1.0,
                 max_value_bytes: int = Limits().max_value_bytes, channel_options=(),
                 tls_ca: str | None = None, tls_cert: str | None = None,
                 tls_key: str | None = None, tls: bool = False):
        self.address = check_address(address)  # HOST:PORT, port 1..65535 (shard/address.py)
        self.timeout = _check_timeout(timeout)
        self.retries = _check_int(retries, "retries", 0)
        self.backoff = _check_seconds(backoff, "backoff")
        self.max_backoff = _check_seconds(max_backoff, "max_backoff")
        self.limits = Limits(max_value_bytes=max_value_bytes)
        try:
            credentials = client_tls(tls_ca, tls_cert, tls_key, enabled=tls,
                                     flags=("tls_ca", "tls_cert", "tls_key"))
        except TlsError as exc:
            raise errors.TlsFileError(str(exc)) from None
        self.tls = credentials is not None
        self._closed = False
        self._channel = open_channel(address, [
            *self.limits.grpc_options(), ("grpc.max_reconnect_backoff_ms", 2000),
            *channel_options], credentials)
        self._kv = pbg.KVStub(self._channel)
        self._admin = pbg.AdminStub(self._channel)

    # -- plumbing ------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the channel. Calls in flight, and any later call, raise ClosedError.
        Idempotent."""
        self._closed = True
        self._channel.close()

    def _check_open(self) -> None:
        if self._closed:
            raise errors.ClosedError(self.address)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _deadline(self, timeout: float | None) -> float:
        return time.monotonic() + (self.timeout if timeout is None else _check_timeout(timeout, ">= 0"))

    def _delays(self, deadline: float, last_try: list | None = None) -> Iterator[None]:
        """Sleep before each retry; stop when out of retries or when the next sleep would
        pass ``deadline`` or, with ``last_try`` (a one-item list: the seconds the failed try
        took), leave less time than that try took: a retry that cannot finish in time only
        turns the server's error (UNAVAILABLE, naming the shard) into DEADLINE_EXCEEDED."""
        delay = self.backoff
        for _ in range(self.retries):
            pause = min(delay, self.max_backoff) * (0.5 + random.random() / 2)
            if time.monotonic() + pause + (last_try[0] if last_try else 0.0) >= deadline:
                return
            time.sleep(pause)
            yield
            delay *= 2

    def _call(self, method, request, timeout: float | None, *, retry: bool):
        deadline = self._deadline(timeout)
        last_try = [0.0]
        delays = self._delays(deadline, last_try) if retry else iter(())
        while True:
            self._check_open()
            t0 = time.monotonic()
            left = _time_left(deadline, t0)
            try:
                return method(request, timeout=left)
            except grpc.RpcError as exc:
                last_try[0] = time.monotonic() - t0
                if self._closed:  # close() cancels calls in flight: not the server's doing
                    raise errors.ClosedError(self.address) from None
                if exc.code() in RETRYABLE and next(delays, False) is None:
                    continue
                raise to_client_error(exc) from None
            except ValueError:  # gRPC's "Cannot invoke RPC on closed channel!"
                if self._closed:
                    raise errors.ClosedError(self.address) from None
                raise

    # -- KV ------------------------------------------------------------------------------------
    def get(self, key: bytes, *, timeout: float | None = None) -> bytes | None:
        """The value of ``key``, or None when absent."""
        request = pb.GetRequest(key=_check_bytes(key, "key"))
        r = self._call(self._kv.Get, request, timeout, retry=True)
        return r.value if r.found else None

    def put(self, key: bytes, value: bytes, *, sync: bool | None = None,
            timeout: float | None = None) -> None:
        """Set ``key`` to ``value`` (bytes; None is refused: delete with :meth:`delete`)."""
        request = pb.PutRequest(key=_check_bytes(key, "key"), value=_check_bytes(value, "value"),
                                sync=_check_sync(sync))
        self._call(self._kv.Put, request, timeout, retry=False)

    def delete(self, key: bytes, *, sync: bool | None = None, timeout: float | None = None) -> None:
        request = pb.DeleteRequest(key=_check_bytes(key, "key"), sync=_check_sync(sync))
        self._call(self._kv.Delete, request, timeout, retry=False)

    def multi_get(self, keys: Iterable[bytes], *, chunk: int = 1000,
                  timeout: float | None = None) -> list[bytes | None]:
        """Values of ``keys`` in order (None = absent), asked ``chunk`` keys per call. A call
        whose answer is over the message limit (RESOURCE_EXHAUSTED: large values) is asked
        again as two halves, down to one key per call. Each call reads each shard's keys at
        one moment (proto/sievekv.proto, MultiGet); separate calls, shards and halves are
        read at separate moments."""
        keys = [_check_bytes(k, "each key") for k in keys]
        _check_int(chunk, "chunk", 1)
        out: list[bytes | None] = []
        deadline = self._deadline(timeout)
        for i in range(0, len(keys), chunk) if keys else ():
            self._multi_get_part(keys[i:i + chunk], deadline, out)
        return out

    def _multi_get_part(self, keys: list, deadline: float, out: list) -> None:
        try:
            r = self._call(self._kv.MultiGet, pb.MultiGetRequest(keys=keys),
                           max(deadline - time.monotonic(), 0.0), retry=True)
        except errors.ResourceExhaustedError:
            if len(keys) == 1:
                raise
            half = len(keys) // 2
            self._multi_get_part(keys[:half], deadline, out)
            self._multi_get_part(keys[half:], deadline, out)
            return
        out.extend(v if f else None for f, v in zip(r.found, r.values))

    def write(self, mutations: Iterable[tuple[bytes, bytes | None]], *, sync: bool | None = None,
              timeout: float | None = None) -> list[errors.ShardWrite]:
        """Apply ``(key, value)`` pairs (value None = delete) in one Write: atomic per shard.
        Returns one ShardWrite per shard touched; raises PartialWriteError when some shard's
        part failed."""
        request = pb.WriteRequest(mutations=[_mutation(m) for m in mutations],
                                  sync=_check_sync(sync))
        r = self._call(self._kv.Write, request, timeout, retry=False)
        return [_shard_write(s) for s in r.shards]

    def scan(self, start: bytes | None = None, end: bytes | None = None, limit: int | None = None,
             *, timeout: float | None = None) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` with start <= key < end in key order, at most ``limit`` (None or 0:
        no limit). Resumes after the last yielded key when the stream fails with UNAVAILABLE
        or CANCELLED (within retries): the resumed scan starts *at* that key (its successor
        ``key + b"\\x00"`` would be over the key limit after a maximal key) and skips it.
        Each shard reads its part at one moment (proto/sievekv.proto, Scan); a resumed scan
        reads the rest at a later one.

        Deadline: unlike the other methods, a scan has none of the client's unless
        ``timeout`` is given, because its time includes the caller's own between entries (a
        consumer that works on each entry as it arrives may take minutes). Without one, a
        router applies its own long default to the streams it opens (``--admin-timeout``,
        600 s) and a shard none; with one, ``timeout`` bounds the whole iteration from the
        first ``next()``, retries and the caller's time included. The arguments are checked
        at once; nothing is sent before the first ``next()``."""
        start = b"" if start is None else _check_bytes(start, "start")
        end = b"" if end is None else _check_bytes(end, "end")
        limit = 0 if limit is None else _check_int(limit, "limit", 0, 2 ** 64 - 2)
        if timeout is not None:
            _check_timeout(timeout, ">= 0")
        self._check_open()
        return self._scan(start, end, limit, timeout)

    def _scan(self, start: bytes, end: bytes, limit: int,
              timeout: float | None) -> Iterator[tuple[bytes, bytes]]:
        deadline = math.inf if timeout is None else self._deadline(timeout)
        delays = self._delays(deadline)
        left = limit
        last = None  # the last key yielded: a resumed stream starts at it and skips it
        while True:
            self._check_open()
            request = pb.ScanRequest(start=start, end=end,
                                     limit=left + 1 if left and last is not None else left)
            left_s = None if deadline == math.inf else _time_left(deadline, time.monotonic())
            try:
                stream = self._kv.Scan(request, timeout=left_s)
            except ValueError:  # gRPC's "Cannot invoke RPC on closed channel!"
                if self._closed:
                    raise errors.ClosedError(self.address) from None
                raise
            try:
                for batch in stream:
                    for key, value in zip(batch.keys, batch.values):
                        if key == last:
                            continue
                        yield key, value
                        start = last = key
                        if left:
                            left -= 1
                            if left == 0:
                                return
                return
            except grpc.RpcError as exc:
                if self._closed:
                    raise errors.ClosedError(self.address) from None
                if exc.code() in RETRYABLE and next(delays, False) is None:
                    continue
                raise to_client_error(exc) from None
            finally:
                stream.cancel()

    def batch(self, *, max_mutations: int = 1000, max_bytes: int = 1 << 20,
              sync: bool | None = None, timeout: float | None = None) -> "WriteBatcher":
        """A :class:`WriteBatcher` sending Writes of at most ``max_mutations`` mutations and
        ``max_bytes`` bytes as an encoded WriteRequest (keys, values, protobuf framing and the
        sync flag: router/wire_sizes.py; a single mutation larger than that is sent alone)."""
        _check_int(max_mutations, "max_mutations", 1)
        _check_int(max_bytes, "max_bytes", 1)
        if timeout is not None:
            _check_timeout(timeout, ">= 0")
        return WriteBatcher(self, max_mutations, max_bytes, _check_sync(sync), timeout)

    # -- Admin ---------------------------------------------------------------------------------
    def _report(self, method, request, timeout) -> dict:
        r = self._call(method, request, timeout, retry=True)
        return json.loads(r.json)

    def stats(self, *, timeout: float | None = None) -> dict:
        """``{"shards": {name: stats}, "totals": {...}, "errors": {name: message}}``."""
        return self._report(self._admin.Stats, pb.StatsRequest(), timeout)

    def filter_report(self, *, timeout: float | None = None) -> dict:
        return self._report(self._admin.FilterReport, pb.FilterReportRequest(), timeout)

    def flush(self, *, timeout: float | None = None) -> list[errors.ShardResult]:
        r = self._call(self._admin.Flush, pb.FlushRequest(), timeout, retry=False)
        return [_section(s) for s in r.shards]

    def compact(self, *, timeout: float | None = 600.0) -> list[errors.ShardResult]:
        r = self._call(self._admin.Compact, pb.CompactRequest(), timeout, retry=False)
        return [_section(s) for s in r.shards]

    def verify(self, *, timeout: float | None = 600.0) -> list[errors.ShardResult]:
        """Check every checksum of every table on every shard (Admin.Verify; as long as
        ``compact``'s, a large shard's files are all read); each result's ``report`` holds what
        its shard checked. Damage on a shard raises
        :class:`~router.client_errors.PartialAdminError` with code DATA_LOSS, naming the files,
        and every shard's result in ``sections``."""
        r = self._call(self._admin.Verify, pb.VerifyRequest(), timeout, retry=False)
        return [_section(s) for s in r.shards]

    def checkpoint(self, dir: str, *, timeout: float | None = 600.0) -> list[errors.ShardResult]:
        """Each shard writes a consistent copy of its data to ``dir``/<shard name> on its own
        host (Admin.Checkpoint; ``dir`` absolute, made absolute here if relative; the shard's
        directory must not exist yet). Each result's ``report`` holds ``path``, ``tables``,
        ``bytes``, ``linked``, ``copied``, ``last_sequence`` and ``seconds``. Any shard failing
        raises :class:`~router.client_errors.PartialAdminError` with every shard's result in
        ``sections``. Against one shard's address, ``dir`` is that shard's directory itself."""
        if not isinstance(dir, (str, os.PathLike)) or isinstance(dir, bytes):
            raise TypeError(f"dir must be a path, got {dir!r:.60}")
        r = self._call(self._admin.Checkpoint,
                       pb.CheckpointRequest(dir=os.path.abspath(os.fspath(dir))), timeout,
                       retry=False)
        return [_section(s) for s in r.shards]

    def cluster_info(self, *, timeout: float | None = None) -> dict:
        """``{"role", "slot_count", "slot_function", "shards": [{"name", "address", "health",
        "slots": [[first, last], ...]}]}``."""
        r = self._call(self._admin.ClusterInfo, pb.ClusterInfoRequest(), timeout, retry=True)
        return {"role": r.role, "slot_count": r.slot_count, "slot_function": r.slot_function,
                "shards": [{"name": s.name, "address": s.address, "health": s.health,
                            "slots": [[x.start, x.end] for x in s.slots]} for s in r.shards]}


class WriteBatcher:
    """Collects puts and deletes and sends them as Writes of bounded size (each Write atomic
    per shard; successive Writes are independent). Use as a context manager: leftovers are
    sent on a clean exit and dropped when the block raised. Not thread-safe."""

    def __init__(self, client: Client, max_mutations: int, max_bytes: int,
                 sync: bool | None, timeout: float | None):
        self.client = client
        self.max_mutations = max_mutations
        self.max_bytes = max_bytes
        self.sync = sync
        self.timeout = timeout
        self.pending: list[tuple[bytes, bytes | None]] = []
        self.size = 0  # encoded bytes of the pending mutations
        # What every Write adds besides its mutations: the sync flag, when set.
        self._fixed = SYNC_FIELD_BYTES if sync is not None else 0
        self.results: list[errors.ShardWrite] = []

    def put(self, key: bytes, value: bytes) -> None:
        """Queue a put (``value`` bytes; None is refused, use :meth:`delete`)."""
        _check_bytes(key, "key")
        _check_bytes(value, "value")
        self._add(key, value, mutation_bytes(len(key), len(value)))

    def delete(self, key: bytes) -> None:
        self._add(_check_bytes(key, "key"), None, delete_bytes(len(key)))

    def _add(self, key, value, size) -> None:
        if self.pending and (len(self.pending) >= self.max_mutations
                             or self._fixed + self.size + size > self.max_bytes):
            self.flush()
        self.pending.append((key, value))
        self.size += size

    def flush(self) -> None:
        """Send what is pending as one Write (no-op when empty)."""
        if not self.pending:
            return
        pending, self.pending, self.size = self.pending, [], 0
        self.results.extend(self.client.write(pending, sync=self.sync, timeout=self.timeout))

    def __enter__(self) -> "WriteBatcher":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.flush()
