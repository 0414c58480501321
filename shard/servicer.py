"""The KV and Admin servicers of one shard, over a backend with engine.DB's API.

Handlers validate their input with :class:`shard.limits.Limits`, call the backend and build the
response; they never catch errors: :class:`shard.status.Guard` maps them to status codes.
Thread-safe as far as the backend is (engine.DB is).
"""

from __future__ import annotations

import json
import os
import threading

import grpc

from sievekv_proto import sievekv_pb2 as pb

from .limits import Limits
from .metrics import flatten_numbers, sum_totals
from .status import StatusError

SCAN_BATCH_ENTRIES = 512
"""Most entries per ScanResponse message."""
SCAN_BATCH_BYTES = 256 * 1024
"""A ScanResponse is sent once its keys and values reach this many bytes (one entry at least)."""
VERIFY_MESSAGE_CHARS = 440
"""A failed Verify names damaged files in its message up to about this length (shard/status.py
cuts messages at 500), then counts the rest."""

_NOT_FOUND = pb.GetResponse()  # immutable in practice: only ever serialized
_PUT_OK = pb.PutResponse()
_DELETE_OK = pb.DeleteResponse()


def _sync(request):
    return request.sync if request.HasField("sync") else None


NO_DEADLINE = 1e9
"""gRPC reports ~9.2e18 s remaining when the caller set no deadline."""
WRITE_MARGIN_FRACTION = 0.1
WRITE_MARGIN_MAX_S = 0.25


def write_timeout(context) -> float | None:
    """Seconds a write may wait for room while writes are held (a write stall): what is left
    of the call's deadline, less a margin (a tenth, at most WRITE_MARGIN_MAX_S) so that the
    answer, RESOURCE_EXHAUSTED with nothing applied, arrives before the caller gives up and
    the outcome is known. None without a deadline (the router always sets one)."""
    remaining = context.time_remaining()
    if remaining is None or remaining > NO_DEADLINE:
        return None
    return max(0.0, remaining - min(remaining * WRITE_MARGIN_FRACTION, WRITE_MARGIN_MAX_S))


class KVServicer:
    """sievekv.v1.KV for the shard's own data.

    ``max_scans``: Scan streams served at once. A stream holds a handler thread for as long as
    its client reads (a client that stops reading holds it until its deadline), so scans past
    the limit are refused with RESOURCE_EXHAUSTED instead of taking every thread from point
    calls (16 unread scans stalled every Get of a 16-thread shard)."""

    def __init__(self, db, limits: Limits, name: str, max_scans: int = 8):
        self.db = db
        self.limits = limits
        self.name = name
        self.max_scans = max_scans
        self._scans = threading.BoundedSemaphore(max_scans)

    def Get(self, request, context):
        key = request.key
        if not 0 < len(key) <= self.limits.max_key_bytes:
            self.limits.check_key(key)
        value = self.db.get(key)
        if value is None:
            return _NOT_FOUND
        return pb.GetResponse(found=True, value=value)

    def Put(self, request, context):
        key, value = request.key, request.value
        self.limits.check_key(key)
        self.limits.check_value(value)
        self.db.put(key, value, sync=_sync(request), timeout=write_timeout(context))
        return _PUT_OK

    def Delete(self, request, context):
        key = request.key
        self.limits.check_key(key)
        self.db.delete(key, sync=_sync(request), timeout=write_timeout(context))
        return _DELETE_OK

    def MultiGet(self, request, context):
        keys = list(request.keys)
        check, max_key = self.limits.check_key, self.limits.max_key_bytes
        for key in keys:
            if not 0 < len(key) <= max_key:
                check(key)
        # The values alone may not exceed the message limit: stop before building more.
        values = self.db.multi_get(keys, max_bytes=self.limits.max_message_bytes)
        found = [v is not None for v in values]
        values = [b"" if v is None else v for v in values]
        response = pb.MultiGetResponse(found=found, values=values)
        problem = self.limits.multi_get_answer_problem(response, sum(map(len, values)))
        if problem is not None:
            raise StatusError(grpc.StatusCode.RESOURCE_EXHAUSTED, problem)
        return response

    def Write(self, request, context):
        limits = self.limits
        batch = []
        for m in request.mutations:
            limits.check_key(m.key)
            if m.is_delete:
                batch.append((m.key, None))
            else:
                limits.check_value(m.value)
                batch.append((m.key, m.value))
        if batch:
            self.db.write(batch, sync=_sync(request), timeout=write_timeout(context))
        return pb.WriteResponse(shards=[pb.ShardWriteResult(
            shard=self.name, applied=True, mutations=len(batch))])

    def Scan(self, request, context):
        self.limits.check_bound(request.start, "scan start")
        self.limits.check_bound(request.end, "scan end")
        if not self._scans.acquire(blocking=False):
            raise StatusError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"shard {self.name} serves at most {self.max_scans} scans at once "
                              "(half its handler threads) and that many are open; retry later")
        try:
            it = self.db.scan(request.start or None, request.end or None, request.limit or None)
        except BaseException:
            self._scans.release()
            raise
        try:
            keys: list[bytes] = []
            values: list[bytes] = []
            size = 0
            for key, value in it:
                keys.append(key)
                values.append(value)
                size += len(key) + len(value)
                if len(keys) >= SCAN_BATCH_ENTRIES or size >= SCAN_BATCH_BYTES:
                    yield pb.ScanResponse(keys=keys, values=values)
                    keys, values, size = [], [], 0
            if keys:
                yield pb.ScanResponse(keys=keys, values=values)
        finally:
            self._scans.release()
            close = getattr(it, "close", None)
            if close is not None:
                close()


def report_response(cls, name: str, address: str, report: dict):
    """A StatsResponse/FilterReportResponse holding one shard's ``report``."""
    text = json.dumps(report, sort_keys=True, default=str)
    totals = sum_totals([flatten_numbers(report)])  # the same totals a router gives
    return cls(shards=[pb.ShardSection(shard=name, address=address, ok=True, json=text)],
               totals=totals,
               json=json.dumps({"shards": {name: report}, "totals": totals, "errors": {}},
                               sort_keys=True, default=str))


class AdminServicer:
    """sievekv.v1.Admin for the shard itself. ``address`` is what the shard reports as its own
    (the listen address with the bound port)."""

    def __init__(self, db, name: str, address: str):
        self.db = db
        self.name = name
        self.address = address

    def _ok(self):
        return pb.AdminResponse(shards=[pb.ShardSection(shard=self.name, address=self.address, ok=True)])

    def Stats(self, request, context):
        return report_response(pb.StatsResponse, self.name, self.address, self.db.stats())

    def FilterReport(self, request, context):
        return report_response(pb.FilterReportResponse, self.name, self.address,
                               self.db.filter_report())

    def Flush(self, request, context):
        self.db.flush()
        return self._ok()

    def Compact(self, request, context):
        self.db.compact()
        return self._ok()

    def Verify(self, request, context):
        """Every table's checksums (DB.verify); damage is DATA_LOSS naming the damaged files
        and offsets (as many as fit VERIFY_MESSAGE_CHARS, then a count). A backend that cannot
        verify (bench/rocks_shard.py) answers UNIMPLEMENTED."""
        verify = getattr(self.db, "verify", None)
        if verify is None:
            raise StatusError(grpc.StatusCode.UNIMPLEMENTED,
                              f"shard {self.name}: its storage backend cannot verify")
        report = verify()
        damaged = report["damaged"]
        if damaged:
            text = f"{len(damaged)} of {report['tables']} tables damaged: "
            for i, d in enumerate(damaged):
                item = f"{'; ' if i else ''}{d['error']} (L{d['level']})"
                rest = len(damaged) - i
                if i and len(text) + len(item) > VERIFY_MESSAGE_CHARS:
                    text += f"; and {rest} more"
                    break
                text += item
            raise StatusError(grpc.StatusCode.DATA_LOSS, text)
        return pb.AdminResponse(shards=[pb.ShardSection(
            shard=self.name, address=self.address, ok=True,
            json=json.dumps(report, sort_keys=True))])

    def Checkpoint(self, request, context):
        """DB.checkpoint to ``request.dir`` on this host: absolute, not existing yet
        (the engine's AlreadyExistsError: ALREADY_EXISTS, also while another call writes it);
        missing parents are created. A backend without
        checkpoints answers UNIMPLEMENTED."""
        checkpoint = getattr(self.db, "checkpoint", None)
        if checkpoint is None:
            raise StatusError(grpc.StatusCode.UNIMPLEMENTED,
                              f"shard {self.name}: its storage backend cannot checkpoint")
        path = request.dir
        if not path or not os.path.isabs(path) or "\x00" in path:
            raise StatusError(grpc.StatusCode.INVALID_ARGUMENT,
                              "checkpoint directory must be an absolute "
                              f"path on the shard's host, got {path!r}")
        report = checkpoint(path, create_parents=True)  # via the router: <dir>/<shard name>
        return pb.AdminResponse(shards=[pb.ShardSection(
            shard=self.name, address=self.address, ok=True,
            json=json.dumps(report, sort_keys=True))])

    def ClusterInfo(self, request, context):
        return pb.ClusterInfoResponse(role="shard", shards=[pb.ShardInfo(
            name=self.name, address=self.address, health="SERVING")])
