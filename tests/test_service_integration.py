"""Every RPC through a real router process in front of four real shard processes."""

import random

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from router import client_errors as errors
from router.client import Client
from router.cluster_map import load as load_map
from shard.limits import DEFAULT_MAX_VALUE_BYTES, MAX_KEY_BYTES, Limits
from sievekv_proto import sievekv_pb2 as pb
from sievekv_proto import sievekv_pb2_grpc as pbg


@pytest.fixture(scope="module")
def client(cluster4):
    with cluster4.client(retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def model(client):
    """Random keys put through the router, and the dict they must equal."""
    rng = random.Random(7)
    data = {}
    with client.batch(max_mutations=200) as b:
        for _ in range(1500):
            key = rng.randbytes(rng.randint(1, 12))
            value = rng.randbytes(rng.randint(0, 40))
            data[key] = value
            b.put(key, value)
    return data


def shard_clients(cluster4):
    return [Client(s.address, retries=0) for s in cluster4.shards]


def test_keys_spread_over_all_four_shards(cluster4, model):
    cmap = load_map(cluster4.map_path)
    per_shard = [0] * 4
    for key in model:
        per_shard[cmap.shard_index(key)] += 1
    assert min(per_shard) > 200
    # each shard holds exactly its keys (asked directly, not through the router)
    for i, c in enumerate(shard_clients(cluster4)):
        with c:
            got = dict(c.scan())
            assert got == {k: v for k, v in model.items() if cmap.shard_index(k) == i}


def test_get_put_delete(client):
    assert client.get(b"no such key") is None
    client.put(b"alpha", b"1")
    client.put(b"empty", b"", sync=True)
    assert client.get(b"alpha") == b"1"
    assert client.get(b"empty") == b""
    client.delete(b"alpha")
    assert client.get(b"alpha") is None


def test_multi_get_across_shards(client, model):
    keys = list(model)[:300] + [b"absent-1", b"absent-2"]
    random.Random(1).shuffle(keys)
    assert client.multi_get(keys, chunk=100) == [model.get(k) for k in keys]
    assert client.multi_get([]) == []


def test_write_spanning_shards_reports_every_shard(cluster4, client):
    muts = [(b"w%03d" % i, b"v%d" % i) for i in range(40)] + [(b"w000", None)]
    results = client.write(muts)
    assert sorted(r.shard for r in results) == ["s0", "s1", "s2", "s3"]
    assert all(r.applied and r.code == grpc.StatusCode.OK for r in results)
    assert sum(r.mutations for r in results) == 41
    assert client.get(b"w000") is None  # the delete in the same batch, same shard, came last
    assert client.get(b"w039") == b"v39"


def test_scan_across_four_shards_equals_sorted_model(client, model):
    expected = sorted(model.items())
    got = [kv for kv in client.scan() if kv[0] in model]
    assert got == expected
    lo, hi = expected[100][0], expected[900][0]
    want = [kv for kv in expected if lo <= kv[0] < hi]
    assert [kv for kv in client.scan(lo, hi) if kv[0] in model] == want


def test_scan_limit_stops_early(cluster4, client):
    everything = list(client.scan())
    assert list(client.scan(limit=7)) == everything[:7]
    start = everything[50][0]
    assert list(client.scan(start, limit=600)) == everything[50:650]
    # raw stream: the router sends no more than the limit
    with grpc.insecure_channel(cluster4.router.address) as ch:
        batches = list(pbg.KVStub(ch).Scan(pb.ScanRequest(limit=3)))
    assert sum(len(b.keys) for b in batches) == 3


def test_bad_inputs_get_their_status_codes(cluster4, client):
    big_key = b"k" * (MAX_KEY_BYTES + 1)
    cases = [
        (lambda: client.get(b""), errors.InvalidArgumentError, "key is empty"),
        (lambda: client.get(big_key), errors.InvalidArgumentError, "over the key limit of 65536 bytes"),
        (lambda: client.put(b"", b"v"), errors.InvalidArgumentError, "key is empty"),
        (lambda: client.put(big_key, b"v"), errors.InvalidArgumentError, "key limit"),
        (lambda: client.put(b"k", b"v" * (DEFAULT_MAX_VALUE_BYTES + 1)), errors.InvalidArgumentError,
         f"over the value limit of {DEFAULT_MAX_VALUE_BYTES} bytes"),
        (lambda: client.delete(b""), errors.InvalidArgumentError, "key is empty"),
        (lambda: client.multi_get([b"a", b""]), errors.InvalidArgumentError, "key is empty"),
        (lambda: client.write([(b"rejected-write", b"1"), (b"", b"2")]), errors.InvalidArgumentError,
         "key is empty"),
        (lambda: list(client.scan(big_key)), errors.InvalidArgumentError, "scan start"),
    ]
    for call, cls, text in cases:
        with pytest.raises(cls) as info:
            call()
        assert text in info.value.details
    assert client.get(b"rejected-write") is None  # the rejected write applied nothing anywhere
    # a message over the receive limit: RESOURCE_EXHAUSTED from the router
    too_big = Limits().max_message_bytes + 1
    with grpc.insecure_channel(cluster4.router.address, options=[("grpc.max_send_message_length", -1)]) as ch:
        with pytest.raises(grpc.RpcError) as info:
            pbg.KVStub(ch).Put(pb.PutRequest(key=b"k", value=b"v" * too_big))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_admin_fans_out_with_per_shard_sections(cluster4, client, model):
    stats = client.stats()
    assert sorted(stats["shards"]) == ["s0", "s1", "s2", "s3"] and stats["errors"] == {}
    from shard.metrics import NOT_SUMMED, RATIOS
    for name, value in stats["totals"].items():
        parts = [v for v in (_flat(stats["shards"][s]).get(name) for s in stats["shards"]) if v is not None]
        leaf = name.rsplit(".", 1)[-1]
        if leaf in NOT_SUMMED:  # an identifier every shard shares (levels.N.level)
            assert set(parts) == {value}
        elif leaf not in RATIOS:  # amounts add up; ratios are recomputed (test_review_observe)
            assert value == pytest.approx(sum(parts))
    report = client.filter_report()
    assert sorted(report["shards"]) == ["s0", "s1", "s2", "s3"]
    assert [(r.shard, r.ok) for r in client.flush()] == [(f"s{i}", True) for i in range(4)]
    assert [(r.shard, r.ok) for r in client.compact()] == [(f"s{i}", True) for i in range(4)]
    some = next(iter(model))
    assert client.get(some) == model[some]


def _flat(doc):
    from shard.metrics import flatten_numbers
    return flatten_numbers(doc)


def test_cluster_info(cluster4, client):
    info = client.cluster_info()
    assert info["role"] == "router" and info["slot_count"] == 16384
    assert info["slot_function"] == "mmh3.hash(key, seed=0, signed=False) % 16384"
    assert [(s["name"], s["address"], s["health"]) for s in info["shards"]] == \
        [(s.name, s.address, "SERVING") for s in cluster4.shards]
    slots = [r for s in info["shards"] for r in s["slots"]]
    assert slots[0][0] == 0 and slots[-1][1] == 16383
    assert all(a[1] + 1 == b[0] for a, b in zip(slots, slots[1:]))


def test_router_health_and_a_shard_served_directly(cluster4):
    with grpc.insecure_channel(cluster4.router.address) as ch:
        status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="sievekv.v1.KV"))
        assert status.status == health_pb2.HealthCheckResponse.SERVING
    with Client(cluster4.shards[0].address) as c:
        assert c.cluster_info()["role"] == "shard"
        assert list(c.stats()["shards"]) == ["s0"]
