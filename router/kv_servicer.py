"""sievekv.v1.KV for the whole cluster: route each key to its shard by slot.

- Get/Put/Delete go to the key's shard.
- MultiGet and Write are split per shard and the parts are sent in parallel (call futures).
  A Write is atomic within each shard only; when some shard's part fails the call fails with
  that shard's code and the per-shard WriteResponse rides in trailing metadata
  ``sievekv-write-result-bin``: ``applied = true`` is confirmed, ``applied = false`` with
  UNAVAILABLE or DEADLINE_EXCEEDED means *not known* (the shard may have applied it).
- Scan asks every shard and merges the ordered streams (:mod:`router.merge`).
Input is validated here, before any fan-out, with the same limits as the shards.
Thread-safe: handlers share only immutable state and thread-safe stubs.
"""

from __future__ import annotations

import grpc

from shard.limits import Limits
from shard.status import StatusError
from sievekv_proto import sievekv_pb2 as pb

from .cluster_map import ClusterMap
from .deadlines import shard_timeout
from . import trailers
from .merge import merged_scan
from .shards import ShardClient, translate
from .slots import slot_of

WRITE_RESULT_TRAILER = "sievekv-write-result-bin"


def _sync(request):
    return request.sync if request.HasField("sync") else None


class RouterKV:
    def __init__(self, cluster_map: ClusterMap, shards: list[ShardClient], limits: Limits,
                 default_timeout: float):
        self.table = cluster_map.table
        self.shards = shards
        self.limits = limits
        self.max_key = limits.max_key_bytes
        self.default_timeout = default_timeout

    def _shard(self, key: bytes) -> ShardClient:
        if not 0 < len(key) <= self.max_key:
            self.limits.check_key(key)
        return self.shards[self.table[slot_of(key)]]

    def Get(self, request, context):
        shard = self._shard(request.key)
        try:
            return shard.kv.Get(request, timeout=shard_timeout(context, self.default_timeout))
        except grpc.RpcError as exc:
            raise shard.error(exc) from None

    def Put(self, request, context):
        shard = self._shard(request.key)
        self.limits.check_value(request.value)
        try:
            return shard.kv.Put(request, timeout=shard_timeout(context, self.default_timeout))
        except grpc.RpcError as exc:
            raise shard.error(exc) from None

    def Delete(self, request, context):
        shard = self._shard(request.key)
        try:
            return shard.kv.Delete(request, timeout=shard_timeout(context, self.default_timeout))
        except grpc.RpcError as exc:
            raise shard.error(exc) from None

    def _group(self, keys) -> dict[int, list[int]]:
        """Shard index -> positions in ``keys`` (validating every key)."""
        table, check, max_key = self.table, self.limits.check_key, self.max_key
        groups: dict[int, list[int]] = {}
        for i, key in enumerate(keys):
            if not 0 < len(key) <= max_key:
                check(key)
            idx = table[slot_of(key)]
            group = groups.get(idx)
            if group is None:
                groups[idx] = [i]
            else:
                group.append(i)
        return groups

    def MultiGet(self, request, context):
        keys = request.keys
        groups = self._group(keys)
        timeout = shard_timeout(context, self.default_timeout)
        if len(groups) == 1:
            shard = self.shards[next(iter(groups))]
            try:
                return shard.kv.MultiGet(request, timeout=timeout)
            except grpc.RpcError as exc:
                raise shard.error(exc) from None
        calls = []
        for idx, positions in groups.items():
            shard = self.shards[idx]
            part = pb.MultiGetRequest(keys=[keys[i] for i in positions])
            calls.append((shard, positions, shard.kv.MultiGet.future(part, timeout=timeout)))
        found = [False] * len(keys)
        values = [b""] * len(keys)
        try:
            for shard, positions, future in calls:
                try:
                    response = future.result()
                except grpc.RpcError as exc:
                    raise shard.error(exc) from None
                for i, f, v in zip(positions, response.found, response.values):
                    found[i] = f
                    values[i] = v
        finally:
            for _, _, future in calls:
                future.cancel()
        return pb.MultiGetResponse(found=found, values=values)

    def Write(self, request, context):
        limits = self.limits
        table = self.table
        groups: dict[int, list] = {}
        for m in request.mutations:
            limits.check_key(m.key)
            if not m.is_delete:
                limits.check_value(m.value)
            groups.setdefault(table[slot_of(m.key)], []).append(m)
        if not groups:
            return pb.WriteResponse()
        timeout = shard_timeout(context, self.default_timeout)
        sync = _sync(request)
        calls = []
        for idx, mutations in groups.items():
            shard = self.shards[idx]
            part = request if len(groups) == 1 else pb.WriteRequest(mutations=mutations, sync=sync)
            calls.append((shard, len(mutations), shard.kv.Write.future(part, timeout=timeout)))
        results = []
        failed = []
        for shard, n, future in calls:
            try:
                future.result()
            except grpc.RpcError as exc:
                code, details = translate(shard.label, exc)
                results.append(pb.ShardWriteResult(shard=shard.name, applied=False, mutations=n,
                                                   code=code.value[0], message=details))
                failed.append((code, details))
            else:
                results.append(pb.ShardWriteResult(shard=shard.name, applied=True, mutations=n))
        response = pb.WriteResponse(shards=results)
        if failed:
            applied = [r.shard for r in results if r.applied]
            code, details = failed[0]
            summary = (f"write failed on {len(failed)} of {len(results)} shard(s) "
                       f"(applied on: {', '.join(applied) or 'none'}): {details}")
            report = trailers.fit(response, response.shards, ("message",))
            if report is None:
                raise StatusError(code, summary + " (per-shard report too large to send)")
            raise StatusError(code, summary, trailers=((WRITE_RESULT_TRAILER, report),))
        return response

    def Scan(self, request, context):
        self.limits.check_bound(request.start, "scan start")
        self.limits.check_bound(request.end, "scan end")
        if request.end and request.start >= request.end:
            return  # empty range: no shard needs asking (nor to be up)
        timeout = shard_timeout(context, self.default_timeout)
        calls = [(shard, shard.kv.Scan(request, timeout=timeout)) for shard in self.shards]
        yield from merged_scan(calls, request.limit)
