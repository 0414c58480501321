"""A cluster map that names one shard process twice (``127.0.0.1:P`` and ``localhost:P``: the
map cannot tell them apart) used to double every key in scans through the router (500 entries
for 300 keys; found by the session-6 client/router review). The router now shows each key once
and ClusterInfo says which entry is the duplicate."""

from __future__ import annotations

import grpc

from router.client import Client
from router.cluster_map import ClusterMap
from sievekv_proto import sievekv_pb2 as pb
from sievekv_proto import sievekv_pb2_grpc as pbg

from .conftest import start_router_process, start_shard_process


def test_one_shard_named_twice_scans_each_key_once_and_is_reported(procs, tmp_path):
    s0 = start_shard_process(procs, str(tmp_path / "s0"), name="s0")
    s1 = start_shard_process(procs, str(tmp_path / "s1"), name="s1")
    map_path = tmp_path / "cluster.toml"
    map_path.write_text(ClusterMap.even([("s0", s0.address), ("s0-again", f"localhost:{s0.port}"),
                                         ("s1", s1.address)]).to_toml())
    router = start_router_process(procs, str(map_path))
    keys = [b"key-%04d" % i for i in range(300)]
    with Client(router.address, retries=0) as c:
        c.write([(k, k) for k in keys])
        health = {s["name"]: s["health"] for s in c.cluster_info()["shards"]}
        assert health == {"s0": "SERVING", "s0-again": "DUPLICATE of shard s0", "s1": "SERVING"}
        assert [k for k, _ in c.scan(limit=100)] == keys[:100]
    with grpc.insecure_channel(router.address) as channel:
        stub = pbg.KVStub(channel)
        raw = [(k, v) for b in stub.Scan(pb.ScanRequest(), timeout=60) for k, v in zip(b.keys, b.values)]
        limited = [k for b in stub.Scan(pb.ScanRequest(limit=100), timeout=60) for k in b.keys]
    assert raw == [(k, k) for k in keys]
    assert limited == keys[:100]
