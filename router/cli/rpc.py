"""Direct Admin calls to one server (a shard or the router) for the CLI's reports.

``cluster status`` asks each shard itself (the router may be the process that is down);
``filters`` and ``stats`` ask the router, which fans out. Each call opens and closes its own
channel; a failure raises grpc.RpcError for the caller to map (exit_codes.from_rpc_error).
"""

from __future__ import annotations

import json

import grpc

from sievekv_proto import sievekv_pb2 as pb
from sievekv_proto import sievekv_pb2_grpc as pb_grpc

MAX_MESSAGE = 64 << 20  # reports of many tables can be large
_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE), ("grpc.enable_retries", 0)]

_REQUESTS = {
    "Stats": pb.StatsRequest,
    "FilterReport": pb.FilterReportRequest,
    "Flush": pb.FlushRequest,
    "Compact": pb.CompactRequest,
    "Verify": pb.VerifyRequest,
    "Checkpoint": pb.CheckpointRequest,
    "ClusterInfo": pb.ClusterInfoRequest,
}


def admin_call(address: str, method: str, timeout: float, request=None):
    """Call Admin.<method> on ``address`` (with ``request``, else an empty one); returns
    (response, trailing_metadata)."""
    channel = grpc.insecure_channel(address, options=_OPTIONS)
    try:
        stub = pb_grpc.AdminStub(channel)
        rpc = getattr(stub, method)
        resp, call = rpc.with_call(request if request is not None else _REQUESTS[method](),
                                  timeout=timeout)
        return resp, call.trailing_metadata()
    finally:
        channel.close()


def report_json(address: str, method: str, timeout: float) -> dict:
    """Stats or FilterReport as the server's combined JSON:
    ``{"shards": {name: report}, "totals": {...}, "errors": {name: message}}``, with
    ``"sections"`` added: per shard ``{"address", "ok", "code", "error"}``."""
    resp, _ = admin_call(address, method, timeout)
    doc = json.loads(resp.json) if resp.json else {"shards": {}, "totals": {}, "errors": {}}
    doc["sections"] = {s.shard: {"address": s.address, "ok": s.ok, "code": s.code,
                                 "error": s.error} for s in resp.shards}
    for s in resp.shards:
        if s.ok and s.shard not in doc.get("shards", {}) and s.json:
            doc.setdefault("shards", {})[s.shard] = json.loads(s.json)
    return doc
