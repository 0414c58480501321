"""The shard's servicers in-process (create_server over a real engine.DB), one server per
module: every RPC, every bad input, health, reflection, admin, metrics, draining."""

import json

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client import CollectorRegistry

from shard.engine_metrics import EngineCollector
from shard.limits import MAX_KEY_BYTES, Limits
from shard.metrics import RequestMetrics
from shard.server import create_server
from shard.servicer import SCAN_BATCH_ENTRIES
from sievekv_proto import sievekv_pb2 as pb
from sievekv_proto import sievekv_pb2_grpc as pbg

from .conftest import open_test_db

MAX_VALUE = 64 * 1024  # small limits keep the oversized-message tests cheap


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    db = open_test_db(str(tmp_path_factory.mktemp("shard") / "db"), max_value_size=MAX_VALUE)
    registry = CollectorRegistry()
    registry.register(EngineCollector(db))
    serving, port = create_server(db, "127.0.0.1:0", name="t0", limits=Limits(max_value_bytes=MAX_VALUE),
                                  metrics=RequestMetrics(registry))
    serving.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", -1)])
    try:
        yield serving, channel, registry, port
    finally:
        channel.close()
        serving.stop(0)
        db.close()


@pytest.fixture
def kv(shard):
    return pbg.KVStub(shard[1])


@pytest.fixture
def admin(shard):
    return pbg.AdminStub(shard[1])


def code_of(call, *args, **kw):
    with pytest.raises(grpc.RpcError) as info:
        result = call(*args, **kw)
        if hasattr(result, "__iter__") and not isinstance(result, (bytes, pb.GetResponse)):
            list(result)
    return info.value.code(), info.value.details()


def test_put_get_delete(kv):
    assert kv.Get(pb.GetRequest(key=b"absent")) == pb.GetResponse(found=False)
    kv.Put(pb.PutRequest(key=b"a", value=b"1"))
    kv.Put(pb.PutRequest(key=b"e", value=b"", sync=True))
    assert kv.Get(pb.GetRequest(key=b"a")) == pb.GetResponse(found=True, value=b"1")
    assert kv.Get(pb.GetRequest(key=b"e")) == pb.GetResponse(found=True, value=b"")  # empty != absent
    kv.Delete(pb.DeleteRequest(key=b"a"))
    kv.Delete(pb.DeleteRequest(key=b"never-there"))
    assert not kv.Get(pb.GetRequest(key=b"a")).found


def test_multi_get_and_write(kv):
    w = kv.Write(pb.WriteRequest(mutations=[pb.Mutation(key=b"m1", value=b"x"), pb.Mutation(key=b"m2", value=b"y"),
                                            pb.Mutation(key=b"m1", is_delete=True)]))
    assert [(r.shard, r.applied, r.mutations) for r in w.shards] == [("t0", True, 3)]
    r = kv.MultiGet(pb.MultiGetRequest(keys=[b"m1", b"m2", b"nope", b"m2"]))
    assert list(r.found) == [False, True, False, True]
    assert list(r.values) == [b"", b"y", b"", b"y"]
    assert kv.MultiGet(pb.MultiGetRequest()) == pb.MultiGetResponse()
    assert kv.Write(pb.WriteRequest()).shards[0].mutations == 0


def test_scan_batches_bounds_and_limit(kv):
    n = SCAN_BATCH_ENTRIES * 2 + 7
    kv.Write(pb.WriteRequest(mutations=[pb.Mutation(key=b"s%05d" % i, value=b"v%d" % i) for i in range(n)]))
    batches = list(kv.Scan(pb.ScanRequest(start=b"s", end=b"t")))
    assert len(batches) == 3
    keys = [k for b in batches for k in b.keys]
    assert keys == [b"s%05d" % i for i in range(n)]
    assert [v for b in batches for v in b.values][:2] == [b"v0", b"v1"]
    got = [k for b in kv.Scan(pb.ScanRequest(start=b"s00010", end=b"s00020", limit=4)) for k in b.keys]
    assert got == [b"s%05d" % i for i in range(10, 14)]
    assert list(kv.Scan(pb.ScanRequest(start=b"s9", end=b"s0"))) == []


@pytest.mark.parametrize("call, message", [
    (lambda kv: kv.Get(pb.GetRequest(key=b"")), "key is empty"),
    (lambda kv: kv.Get(pb.GetRequest(key=b"k" * (MAX_KEY_BYTES + 1))), "over the key limit of 65536 bytes"),
    (lambda kv: kv.Put(pb.PutRequest(key=b"", value=b"v")), "key is empty"),
    (lambda kv: kv.Put(pb.PutRequest(key=b"k", value=b"v" * (MAX_VALUE + 1))), f"over the value limit of {MAX_VALUE} bytes"),
    (lambda kv: kv.Delete(pb.DeleteRequest(key=b"")), "key is empty"),
    (lambda kv: kv.MultiGet(pb.MultiGetRequest(keys=[b"ok", b""])), "key is empty"),
    (lambda kv: kv.Write(pb.WriteRequest(mutations=[pb.Mutation(key=b"w-ok", value=b"1"),
                                                   pb.Mutation(key=b"w", value=b"v" * (MAX_VALUE + 1))])),
     "over the value limit"),
    (lambda kv: list(kv.Scan(pb.ScanRequest(start=b"k" * (MAX_KEY_BYTES + 1)))), "scan start is 65537 bytes"),
])
def test_bad_input_is_invalid_argument_naming_the_limit(kv, call, message):
    code, details = code_of(call, kv)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message in details
    assert not kv.Get(pb.GetRequest(key=b"w-ok")).found  # a rejected Write applies nothing


def test_message_over_the_receive_limit_is_resource_exhausted(kv):
    too_big = Limits(max_value_bytes=MAX_VALUE).max_message_bytes + 1
    code, details = code_of(kv.Put, pb.PutRequest(key=b"k", value=b"v" * too_big))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_health_and_reflection(shard):
    channel = shard[1]
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "sievekv.v1.KV", "sievekv.v1.Admin"):
        assert health.Check(health_pb2.HealthCheckRequest(service=service)).status == \
            health_pb2.HealthCheckResponse.SERVING
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = {s.name for r in responses for s in r.list_services_response.service}
    assert {"sievekv.v1.KV", "sievekv.v1.Admin", "grpc.health.v1.Health"} <= names


def test_admin(kv, admin, shard):
    kv.Put(pb.PutRequest(key=b"adm", value=b"1"))
    stats = admin.Stats(pb.StatsRequest())
    assert [(s.shard, s.ok) for s in stats.shards] == [("t0", True)]
    doc = json.loads(stats.json)
    assert set(doc) == {"shards", "totals", "errors"} and "t0" in doc["shards"]
    assert json.loads(stats.shards[0].json) == doc["shards"]["t0"]
    assert dict(stats.totals) == doc["totals"]
    report = admin.FilterReport(pb.FilterReportRequest())
    assert json.loads(report.shards[0].json) == json.loads(report.json)["shards"]["t0"]
    assert admin.Flush(pb.FlushRequest()).shards[0].ok
    assert admin.Compact(pb.CompactRequest()).shards[0].ok
    assert kv.Get(pb.GetRequest(key=b"adm")).value == b"1"
    info = admin.ClusterInfo(pb.ClusterInfoRequest())
    assert info.role == "shard"
    assert [(s.name, s.address, s.health) for s in info.shards] == [("t0", f"127.0.0.1:{shard[3]}", "SERVING")]


def _sum(registry, sample_name):
    return sum(s.value for m in registry.collect() for s in m.samples if s.name == sample_name)


def test_request_and_engine_metrics(kv, admin, shard):
    registry = shard[2]
    before = registry.get_sample_value("sievekv_requests_total", {"method": "Get", "code": "OK"}) or 0
    for _ in range(3):
        kv.Get(pb.GetRequest(key=b"metric"))
    code_of(kv.Get, pb.GetRequest(key=b""))
    assert registry.get_sample_value("sievekv_requests_total", {"method": "Get", "code": "OK"}) == before + 3
    assert registry.get_sample_value("sievekv_requests_total", {"method": "Get", "code": "INVALID_ARGUMENT"}) >= 1
    assert registry.get_sample_value("sievekv_request_duration_seconds_count", {"method": "Get"}) >= before + 4
    # engine counters, read from db.stats()/filter_report() at scrape time
    flushes = _sum(registry, "sievekv_engine_flushes_total")
    kv.Write(pb.WriteRequest(mutations=[pb.Mutation(key=b"em%03d" % i, value=b"v") for i in range(100)]))
    admin.Flush(pb.FlushRequest())
    assert _sum(registry, "sievekv_engine_flushes_total") == flushes + 1
    probes = _sum(registry, "sievekv_engine_filter_probes_total")
    for i in range(100):
        assert kv.Get(pb.GetRequest(key=b"em%03d" % i)).found
    assert _sum(registry, "sievekv_engine_filter_probes_total") >= probes + 100
    assert _sum(registry, "sievekv_engine_filter_resident_bytes") > 0
    assert registry.get_sample_value("sievekv_engine_scrape_errors_total") == 0


def test_draining_refuses_new_calls_with_unavailable(tmp_path):
    db = open_test_db(str(tmp_path / "db"))
    serving, port = create_server(db, "127.0.0.1:0", name="d0")
    serving.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        kv = pbg.KVStub(channel)
        kv.Put(pb.PutRequest(key=b"k", value=b"v"))
        for guard in serving.guards:
            guard.draining = True
        serving.health.enter_graceful_shutdown()
        code, details = code_of(kv.Get, pb.GetRequest(key=b"k"))
        assert code == grpc.StatusCode.UNAVAILABLE and "draining" in details
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.NOT_SERVING
        serving.drain(1.0)
    finally:
        channel.close()
        serving.stop(0)
        db.close()
