"""sievekv.v1.KV for the whole cluster: route each key to its shard by slot.

- Get/Put/Delete go to the key's shard.
- MultiGet and Write are split per shard and the parts are sent in parallel (call futures).
  A MultiGet takes its parts as they complete: the first part to fail (a shard down, values
  over the message limit) answers the call at once, whatever the shard order.
  A Write is atomic within each shard only; when some shard's part fails the call fails with
  that shard's code and the per-shard WriteResponse rides in trailing metadata
  ``sievekv-write-result-bin``: ``applied = true`` is confirmed, ``applied = false`` with
  UNAVAILABLE or DEADLINE_EXCEEDED means *not known* (the shard may have applied it).
- Scan asks every shard and merges the ordered streams (:mod:`router.merge`). A scan holds a
  handler thread while its client reads: at most ``max_scans`` run at once (more are refused
  with RESOURCE_EXHAUSTED) and they take no call slot.
- Every unary shard call holds one of that shard's call slots (router/shards.py); fan-outs
  take theirs in shard order. A call for a hung shard fails at once with UNAVAILABLE naming it,
  so the handler threads stay free for the other shards; a Write is sent to no shard unless it
  got a slot of every shard it touches.
Input is validated here, before any fan-out, with the same limits as the shards.
Thread-safe: handlers share only immutable state and thread-safe stubs.
"""

from __future__ import annotations

import queue
import threading

import grpc

from shard.limits import Limits
from shard.status import StatusError
from sievekv_proto import sievekv_pb2 as pb

from .cluster_map import ClusterMap
from .deadlines import NO_DEADLINE, shard_timeout
from . import trailers
from .merge import merged_scan
from .shards import ShardClient, translate
from .slots import slot_of

WRITE_RESULT_TRAILER = "sievekv-write-result-bin"


def _sync(request):
    return request.sync if request.HasField("sync") else None


def _fan_out_call(method, request, timeout: float, pool, context):
    """``method.future(request)`` for one shard's part of a fan-out, holding a slot of ``pool``
    (already taken) that is given back as soon as *this* part ends, not when the whole fan-out
    does: a stalled shard must not keep a healthy shard's slots, which would make that shard
    look hung and refuse its calls. A client that cancels cancels the part."""
    future = method.future(request, timeout=timeout)

    def settle(f):
        code = f.code()  # the call has ended: this does not block
        pool.release(code is not grpc.StatusCode.DEADLINE_EXCEEDED
                     and code is not grpc.StatusCode.CANCELLED)

    future.add_done_callback(settle)
    context.add_callback(future.cancel)
    return future


class RouterKV:
    """``scan_timeout``: the deadline of a Scan stream whose client set none (a long scan is
    not a hung one: scans get the long-call default, not ``default_timeout``). ``max_scans``:
    Scan streams this process serves at once; a scan holds a handler thread for as long as its
    client reads, so more are refused (RESOURCE_EXHAUSTED) to keep threads for point calls."""

    def __init__(self, cluster_map: ClusterMap, shards: list[ShardClient], limits: Limits,
                 default_timeout: float, scan_timeout: float | None = None,
                 max_scans: int = 16):
        self.table = cluster_map.table
        self.shards = shards
        self.limits = limits
        self.max_key = limits.max_key_bytes
        self.default_timeout = default_timeout
        self.scan_timeout = default_timeout if scan_timeout is None else scan_timeout
        self.max_scans = max_scans
        self._scans = threading.BoundedSemaphore(max_scans)

    def _shard(self, key: bytes) -> ShardClient:
        if not 0 < len(key) <= self.max_key:
            self.limits.check_key(key)
        return self.shards[self.table[slot_of(key)]]

    def Get(self, request, context):
        shard = self._shard(request.key)
        return shard.call(shard.reads, shard.kv.Get, request, context, self.default_timeout)

    def Put(self, request, context):
        shard = self._shard(request.key)
        self.limits.check_value(request.value)
        return shard.call(shard.writes, shard.kv.Put, request, context, self.default_timeout)

    def Delete(self, request, context):
        shard = self._shard(request.key)
        return shard.call(shard.writes, shard.kv.Delete, request, context,
                          self.default_timeout)

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
            return shard.call(shard.reads, shard.kv.MultiGet, request, context,
                              self.default_timeout)
        order = sorted(groups)
        taken = self._acquire_all(order, context, write=False)
        calls = []
        try:
            timeout = shard_timeout(context, self.default_timeout)
            for idx in order:
                shard = self.shards[idx]
                positions = groups[idx]
                part = pb.MultiGetRequest(keys=[keys[i] for i in positions])
                calls.append((idx, positions, _fan_out_call(shard.kv.MultiGet, part, timeout,
                                                            shard.reads, context)))
            found = [False] * len(keys)
            values = [b""] * len(keys)
            # Each shard keeps its own part under the message limit; the merged answer's
            # values are counted here as parts arrive, so that an answer over it is refused
            # with the limit named (as a shard names it) and the parts still coming are
            # cancelled, instead of gathering them all for gRPC to refuse the send. Its
            # encoded size is checked once whole, near the limit (multi_get_answer_problem).
            limit = self.limits.max_message_bytes
            left = limit
            # Parts are taken as they complete, not in shard order, so that a shard that
            # fails fast (UNAVAILABLE, a part over the limit) is reported at once instead of
            # after a slower or stalled shard's deadline. Every part completes: each has the
            # call's deadline, and a cancelled one completes as cancelled.
            ended = queue.SimpleQueue()
            for n, (_, _, future) in enumerate(calls):
                future.add_done_callback(lambda _f, n=n: ended.put(n))
            for answered in range(1, len(calls) + 1):
                idx, positions, future = calls[ended.get()]
                try:
                    response = future.result()
                except grpc.RpcError as exc:
                    raise self.shards[idx].error(exc) from None
                except grpc.FutureCancelledError:
                    raise StatusError(grpc.StatusCode.CANCELLED, "cancelled by the client") from None
                left -= sum(map(len, response.values))
                if left < 0:
                    raise StatusError(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"the values found exceed the message limit of {limit} bytes "
                        f"({limit - left} bytes for {len(keys)} keys, from {answered} of "
                        f"{len(calls)} shards' parts); ask for fewer keys at a time")
                for i, f, v in zip(positions, response.found, response.values):
                    found[i] = f
                    values[i] = v
        finally:
            for _, _, future in calls:
                future.cancel()
            for idx in taken[len(calls):]:  # slots taken for calls never made
                self.shards[idx].reads.release(False)
        response = pb.MultiGetResponse(found=found, values=values)
        problem = self.limits.multi_get_answer_problem(response, limit - left)
        if problem is not None:
            raise StatusError(grpc.StatusCode.RESOURCE_EXHAUSTED, problem)
        return response

    def _acquire_all(self, order: list[int], context, write: bool) -> list[int]:
        """A call slot of each shard in ``order`` (ascending shard index, the same order in
        every handler, so two fan-outs never wait on each other's slots), or the StatusError of
        :meth:`ShardClient.take_slot` (the slots taken so far are given back)."""
        taken = []
        try:
            for idx in order:
                shard = self.shards[idx]
                shard.take_slot(shard.writes if write else shard.reads, context,
                                self.default_timeout)
                taken.append(idx)
        except BaseException:
            for t in taken:
                shard = self.shards[t]
                (shard.writes if write else shard.reads).release(False)
            raise
        return taken

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
        order = sorted(groups)
        try:
            taken = self._acquire_all(order, context, write=True)
        except StatusError as exc:
            # Nothing was sent: every part is certainly not applied (a retry is safe).
            results = [pb.ShardWriteResult(shard=self.shards[idx].name, applied=False,
                                           mutations=len(groups[idx]), code=exc.code.value[0],
                                           message=exc.message) for idx in order]
            response = pb.WriteResponse(shards=results)
            report = trailers.fit(response, response.shards, ("message",))
            summary = f"write not sent to any shard: {exc.message}"
            raise StatusError(exc.code, summary, trailers=(
                ((WRITE_RESULT_TRAILER, report),) if report is not None else ())) from None
        futures = {}
        results = []
        failed = []
        try:
            timeout = shard_timeout(context, self.default_timeout)
            for idx in order:
                part = request if len(order) == 1 else pb.WriteRequest(mutations=groups[idx],
                                                                      sync=sync)
                shard = self.shards[idx]
                futures[idx] = _fan_out_call(shard.kv.Write, part, timeout, shard.writes,
                                             context)
            for idx in order:
                shard = self.shards[idx]
                n = len(groups[idx])
                try:
                    futures[idx].result()
                except (grpc.RpcError, grpc.FutureCancelledError) as exc:
                    if isinstance(exc, grpc.RpcError):
                        code, details = translate(shard.label, exc)
                    else:  # the client cancelled: the shard may or may not have applied it
                        code, details = grpc.StatusCode.CANCELLED, "cancelled by the client"
                    results.append(pb.ShardWriteResult(shard=shard.name, applied=False,
                                                       mutations=n, code=code.value[0],
                                                       message=details))
                    failed.append((code, details))
                else:
                    results.append(pb.ShardWriteResult(shard=shard.name, applied=True,
                                                       mutations=n))
        finally:
            for idx in taken:
                if idx not in futures:  # slots taken for calls never made
                    self.shards[idx].writes.release(False)
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
        for shard in self.shards:
            shard.check_not_hung()
        remaining = context.time_remaining()
        defaulted = remaining is None or remaining > NO_DEADLINE  # the client set none
        timeout = shard_timeout(context, self.scan_timeout)
        if not self._scans.acquire(blocking=False):
            raise StatusError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"the router serves at most {self.max_scans} scans at once (half "
                              f"its handler threads) and that many are open; retry later")
        try:
            calls = [(shard, shard.kv.Scan(request, timeout=timeout)) for shard in self.shards]
            # A client that cancels must end the shard streams now: this thread may be blocked
            # reading one of them (a stalled shard), holding its scan slot until that deadline.
            context.add_callback(lambda: [call.cancel() for _, call in calls])
            yield from merged_scan(calls, request.limit)
        except StatusError as exc:
            if defaulted and exc.code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise StatusError(exc.code, f"scan stopped after {self.scan_timeout:g} s, the "
                                  "router's deadline for scans whose client sets none "
                                  "(--admin-timeout); set a longer deadline on the call") from None
            raise
        finally:
            self._scans.release()
