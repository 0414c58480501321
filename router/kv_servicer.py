"""sievekv.v1.KV for the whole cluster: route each key to its shard by slot.

- Get/Put/Delete go to the key's shard.
- MultiGet and Write are split per shard and the parts are sent in parallel (call futures).
  A Write is atomic within each shard only; when some shard's part fails the call fails with
  that shard's code and the per-shard WriteResponse rides in trailing metadata
  ``sievekv-write-result-bin``: ``applied = true`` is confirmed, ``applied = false`` with
  UNAVAILABLE or DEADLINE_EXCEEDED means *not known* (the shard may have applied it).
- Scan asks every shard and merges the ordered streams (:mod:`router.merge`).
- Every shard call holds one of that shard's call slots (router/shards.py): when a shard has
  none free (it stopped answering), a call needing it fails at once with UNAVAILABLE naming it,
  so the handler threads stay free for the other shards; a Write part that got no slot is not
  sent.
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
        shard.acquire()
        try:
            return shard.kv.Get(request, timeout=shard_timeout(context, self.default_timeout))
        except grpc.RpcError as exc:
            raise shard.error(exc) from None
        finally:
            shard.release()

    def Put(self, request, context):
        shard = self._shard(request.key)
        self.limits.check_value(request.value)
        shard.acquire()
        try:
            return shard.kv.Put(request, timeout=shard_timeout(context, self.default_timeout))
        except grpc.RpcError as exc:
            raise shard.error(exc) from None
        finally:
            shard.release()

    def Delete(self, request, context):
        shard = self._shard(request.key)
        shard.acquire()
        try:
            return shard.kv.Delete(request, timeout=shard_timeout(context, self.default_timeout))
        except grpc.RpcError as exc:
            raise shard.error(exc) from None
        finally:
            shard.release()

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
        if len(groups) == 1:
            shard = self.shards[next(iter(groups))]
            shard.acquire()
            try:
                return shard.kv.MultiGet(request,
                                         timeout=shard_timeout(context, self.default_timeout))
            except grpc.RpcError as exc:
                raise shard.error(exc) from None
            finally:
                shard.release()
        taken = _acquire_all([self.shards[idx] for idx in groups])
        calls = []
        try:
            timeout = shard_timeout(context, self.default_timeout)
            for idx, positions in groups.items():
                shard = self.shards[idx]
                part = pb.MultiGetRequest(keys=[keys[i] for i in positions])
                calls.append((shard, positions, shard.kv.MultiGet.future(part, timeout=timeout)))
            found = [False] * len(keys)
            values = [b""] * len(keys)
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
            for shard in taken:
                shard.release()
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
        sync = _sync(request)
        parts = [(self.shards[idx], mutations) for idx, mutations in groups.items()]
        # A shard with no free call slot is not sent its part: certainly not applied.
        slotted = [shard.try_acquire() for shard, _ in parts]
        futures = [None] * len(parts)
        results = []
        failed = []
        try:
            timeout = shard_timeout(context, self.default_timeout)
            for i, (shard, mutations) in enumerate(parts):
                if slotted[i]:
                    part = request if len(parts) == 1 else pb.WriteRequest(mutations=mutations,
                                                                          sync=sync)
                    futures[i] = shard.kv.Write.future(part, timeout=timeout)
            for (shard, mutations), future in zip(parts, futures):
                n = len(mutations)
                if future is None:
                    code, details = grpc.StatusCode.UNAVAILABLE, shard.busy_details()
                else:
                    try:
                        future.result()
                    except grpc.RpcError as exc:
                        code, details = translate(shard.label, exc)
                    else:
                        results.append(pb.ShardWriteResult(shard=shard.name, applied=True,
                                                           mutations=n))
                        continue
                results.append(pb.ShardWriteResult(shard=shard.name, applied=False, mutations=n,
                                                   code=code.value[0], message=details))
                failed.append((code, details))
        finally:
            for (shard, _), took in zip(parts, slotted):
                if took:
                    shard.release()
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
        taken = _acquire_all(self.shards)
        try:
            timeout = shard_timeout(context, self.default_timeout)
            calls = [(shard, shard.kv.Scan(request, timeout=timeout)) for shard in self.shards]
            yield from merged_scan(calls, request.limit)
        finally:
            for shard in taken:
                shard.release()


def _acquire_all(shards) -> list:
    """A call slot of every shard in ``shards`` (router/shards.py), or UNAVAILABLE naming the
    first shard without a free one (the slots taken so far are given back)."""
    taken = []
    for shard in shards:
        if not shard.try_acquire():
            for t in taken:
                t.release()
            raise shard.busy_error()
        taken.append(shard)
    return taken
