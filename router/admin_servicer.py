"""sievekv.v1.Admin for the whole cluster: every call fans out to all shards in parallel.

- Stats/FilterReport succeed with one section per shard (``ok = false`` with the error for a
  shard that failed or could not be reached), totals over the answering shards (amounts
  summed, ratios recomputed from the sums: ``shard.metrics.sum_totals``), and
  the JSON ``{"shards": {name: report}, "totals": {...}, "errors": {name: message}}``.
- Flush/Compact/Verify/Checkpoint return one section per shard (Verify's and Checkpoint's with
  the shard's report as JSON);
  when any shard failed, the call fails with the
  first failure's code and the AdminResponse rides in trailing metadata
  ``sievekv-admin-result-bin``.
- ClusterInfo returns the cluster map with each shard's health (grpc.health.v1 Check, at most
  ``HEALTH_TIMEOUT`` seconds), or ``DUPLICATE of shard X`` for a map entry whose address
  reaches the same shard process as an earlier one (its own name and address, from the
  shard's ClusterInfo: ``127.0.0.1:P`` and ``localhost:P`` are not told apart by the map).
"""

from __future__ import annotations

import ipaddress
import json
import os

import grpc
from grpc_health.v1 import health_pb2

from shard.metrics import sum_totals
from shard.status import StatusError
from sievekv_proto import sievekv_pb2 as pb

from . import trailers
from .cluster_map import ClusterMap
from .deadlines import shard_timeout
from .shards import ShardClient, translate
from .slots import SLOT_COUNT, SLOT_FUNCTION

ADMIN_RESULT_TRAILER = "sievekv-admin-result-bin"


def _wildcard(host: str) -> bool:
    """Whether a listen host is the unspecified address (any spelling: 0.0.0.0, [::], [::0])."""
    host = host.strip("[]")
    if host in ("", "*"):
        return True
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False  # a name
HEALTH_TIMEOUT = 1.0


class RouterAdmin:
    def __init__(self, cluster_map: ClusterMap, shards: list[ShardClient], default_timeout: float,
                 admin_timeout: float):
        self.cluster_map = cluster_map
        self.shards = shards
        self.default_timeout = default_timeout
        self.admin_timeout = admin_timeout

    def _fan_out(self, method: str, request, timeout: float):
        """[(shard, response or None, (code, details) or None)] in cluster-map order;
        ``request`` is the message, or a function of the shard giving each its own. A hung
        shard (router/shards.py) is not asked: its entry is UNAVAILABLE at once."""
        calls = [(s, None if s.reads.hung() else getattr(s.admin, method).future(
            request(s) if callable(request) else request, timeout=timeout)) for s in self.shards]
        out = []
        for shard, future in calls:
            if future is None:
                out.append((shard, None, (grpc.StatusCode.UNAVAILABLE,
                                          shard.busy_details(shard.reads))))
                continue
            try:
                out.append((shard, future.result(), None))
            except grpc.RpcError as exc:
                out.append((shard, None, translate(shard.label, exc)))
        return out

    def _report(self, method: str, request, response_cls, context):
        sections, parts, reports, errors = [], [], {}, {}
        for shard, response, failure in self._fan_out(
                method, request, shard_timeout(context, self.default_timeout)):
            if failure is not None:
                code, details = failure
                errors[shard.name] = details
                sections.append(pb.ShardSection(shard=shard.name, address=shard.address, ok=False,
                                                code=code.value[0], error=details))
                continue
            text = response.shards[0].json if response.shards else "{}"
            sections.append(pb.ShardSection(shard=shard.name, address=shard.address, ok=True,
                                            json=text))
            reports[shard.name] = json.loads(text)
            parts.append(response.totals)
        totals = sum_totals(parts)
        doc = {"shards": reports, "totals": totals, "errors": errors}
        return response_cls(shards=sections, totals=totals, json=json.dumps(doc, sort_keys=True))

    def Stats(self, request, context):
        return self._report("Stats", request, pb.StatsResponse, context)

    def FilterReport(self, request, context):
        return self._report("FilterReport", request, pb.FilterReportResponse, context)

    def _everywhere(self, method: str, request, context):
        sections, failed = [], []
        for shard, _response, failure in self._fan_out(
                method, request, shard_timeout(context, self.admin_timeout)):
            if failure is None:  # Verify's sections carry the shard's report
                text = _response.shards[0].json if _response.shards else ""
                sections.append(pb.ShardSection(shard=shard.name, address=shard.address, ok=True,
                                                json=text))
            else:
                code, details = failure
                failed.append(failure)
                sections.append(pb.ShardSection(shard=shard.name, address=shard.address, ok=False,
                                                code=code.value[0], error=details))
        response = pb.AdminResponse(shards=sections)
        if failed:
            # Data loss on any shard is what the caller must hear about, whatever failed first.
            code, details = next((f for f in failed if f[0] == grpc.StatusCode.DATA_LOSS),
                                 failed[0])
            summary = f"{method} failed on {len(failed)} of {len(sections)} shard(s): {details}"
            report = trailers.fit(response, response.shards, ("error", "address"))
            if report is None and any(s.json for s in response.shards):
                for s in response.shards:  # reports cannot be cut short (JSON): drop them first
                    s.json = ""
                report = trailers.fit(response, response.shards, ("error", "address"))
            if report is None:
                raise StatusError(code, summary + " (per-shard report too large to send)")
            raise StatusError(code, summary, trailers=((ADMIN_RESULT_TRAILER, report),))
        return response

    def Flush(self, request, context):
        return self._everywhere("Flush", request, context)

    def Compact(self, request, context):
        return self._everywhere("Compact", request, context)

    def Verify(self, request, context):
        return self._everywhere("Verify", request, context)

    def Checkpoint(self, request, context):
        """Each shard checkpoints to ``request.dir``/<shard name> on its own host."""
        base = request.dir
        if not base or not os.path.isabs(base) or "\x00" in base:
            raise StatusError(grpc.StatusCode.INVALID_ARGUMENT,
                              "checkpoint directory must be an absolute path (each shard "
                              f"writes <dir>/<shard name> on its own host), got {base!r}")
        for shard in self.shards:
            if shard.name in (".", "..") or os.path.basename(shard.name) != shard.name:
                raise StatusError(grpc.StatusCode.FAILED_PRECONDITION,
                                  f"shard name {shard.name!r} cannot name a checkpoint "
                                  "directory; give it a name without '/' in the cluster map")
        return self._everywhere("Checkpoint", lambda shard: pb.CheckpointRequest(
            dir=os.path.join(base, shard.name)), context)

    def ClusterInfo(self, request, context):
        timeout = min(HEALTH_TIMEOUT, shard_timeout(context, HEALTH_TIMEOUT))
        check = health_pb2.HealthCheckRequest(service="")
        calls = [(s, s.health.Check.future(check, timeout=timeout),
                  s.admin.ClusterInfo.future(pb.ClusterInfoRequest(), timeout=timeout))
                 for s in self.shards]
        infos = []
        seen: dict[tuple[str, str], str] = {}  # a shard process's own (name, address) -> map name
        for spec, (shard, future, who) in zip(self.cluster_map.shards, calls):
            try:
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(future.result().status)
            except grpc.RpcError:
                status = "UNREACHABLE"
            try:
                own = who.result().shards[0]
                identity = (own.name, own.address)
                if _wildcard(own.address.rpartition(":")[0]):
                    identity = None  # two hosts' shards may both say 0.0.0.0:P: no proof
            except (grpc.RpcError, IndexError):
                identity = None
            if identity is not None:
                if identity in seen:  # two map entries reach one process: scans would repeat
                    status = f"DUPLICATE of shard {seen[identity]}"
                else:
                    seen[identity] = spec.name
            infos.append(pb.ShardInfo(name=spec.name, address=spec.address, health=status,
                                      slots=[pb.SlotRange(start=a, end=b) for a, b in spec.slots]))
        return pb.ClusterInfoResponse(role="router", slot_count=SLOT_COUNT,
                                      slot_function=SLOT_FUNCTION, shards=infos)
