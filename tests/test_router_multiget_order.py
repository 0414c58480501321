"""The router takes a MultiGet's shard parts as they complete, not in shard order
(router/kv_servicer.py): a shard that fails fast is reported at once, even while a shard
before it in the cluster map has not answered. Until session 22 a stalled shard 0 held back
shard 1's UNAVAILABLE until the call's deadline, which then came back as DEADLINE_EXCEEDED."""

from __future__ import annotations

import os
import signal

import grpc
import pytest

from router.cluster_map import ClusterMap
from sievekv_proto import sievekv_pb2 as pb
from sievekv_proto import sievekv_pb2_grpc as pbg

from .conftest import sigstop, start_router_process, start_shard_process, write_cluster_map


def _keys_on(cmap: ClusterMap, shard: int, n: int) -> list[bytes]:
    out, i = [], 0
    while len(out) < n:
        key = b"order-%d" % i
        if cmap.shard_index(key) == shard:
            out.append(key)
        i += 1
    return out


def test_a_down_shard_is_reported_while_an_earlier_shard_is_stalled(procs, tmp_path):
    shards = [start_shard_process(procs, str(tmp_path / f"s{i}"), name=f"s{i}", wait=False)
              for i in range(2)]
    for s in shards:
        s.wait_ready()
    map_path = write_cluster_map(str(tmp_path / "map.toml"), shards)
    router = start_router_process(procs, map_path)
    cmap = ClusterMap.even([(s.name, s.address) for s in shards])
    keys = _keys_on(cmap, 0, 3) + _keys_on(cmap, 1, 3)
    with grpc.insecure_channel(router.address) as ch:
        stub = pbg.KVStub(ch)
        for k in keys:
            stub.Put(pb.PutRequest(key=k, value=b"v" + k), timeout=30)
        answer = stub.MultiGet(pb.MultiGetRequest(keys=keys), timeout=30)
        assert list(answer.values) == [b"v" + k for k in keys] and all(answer.found)

        shards[1].kill()  # refuses connections: UNAVAILABLE at once
        sigstop(shards[0].popen.pid)  # accepts nothing it answers: its part waits for the deadline
        try:
            with pytest.raises(grpc.RpcError) as info:
                stub.MultiGet(pb.MultiGetRequest(keys=keys), timeout=10)
        finally:
            os.kill(shards[0].popen.pid, signal.SIGCONT)
    err = info.value
    # In shard order this was DEADLINE_EXCEEDED after 10 s: shard 0's part first.
    assert err.code() == grpc.StatusCode.UNAVAILABLE, (err.code(), err.details())
    assert "s1" in err.details(), err.details()
