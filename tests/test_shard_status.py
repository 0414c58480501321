"""Error -> status mapping and the handler guard (no traceback ever reaches a client)."""

import logging
from concurrent import futures

import grpc
import pytest

from engine.errors import (ClosedError, CorruptionError, InvalidArgumentError, LockedError,
                           StorageIOError)
from shard.serving import KV_SERVICE
from shard.status import Guard, StatusError, status_of
from sievekv_proto import sievekv_pb2 as pb
from sievekv_proto import sievekv_pb2_grpc as pbg

C = grpc.StatusCode


@pytest.mark.parametrize("exc, code, text", [
    (InvalidArgumentError("value is 9 bytes, over the value limit of 8 bytes"), C.INVALID_ARGUMENT, "value limit of 8"),
    (CorruptionError("bad block checksum", path="/d/000012.sst", offset=4096), C.DATA_LOSS, "/d/000012.sst at offset 4096"),
    (ClosedError("db is closed"), C.UNAVAILABLE, "db is closed"),
    (LockedError("locked by pid 7"), C.FAILED_PRECONDITION, "locked by pid 7"),
    (StorageIOError("fsync failed", path="/d/000003.log"), C.INTERNAL, "/d/000003.log"),
    (StatusError(C.UNAVAILABLE, "shard s1 at h:1 is unavailable"), C.UNAVAILABLE, "shard s1"),
    (KeyError("x\ny"), C.INTERNAL, "internal error: KeyError"),
])
def test_status_of(exc, code, text):
    got_code, details = status_of(exc)
    assert got_code == code
    assert text in details
    assert "\n" not in details


class Exploding:
    """A servicer whose handlers fail in the ways the guard must contain."""

    def Get(self, request, context):
        if request.key == b"corrupt":
            raise CorruptionError("bad block", path="/data/000007.sst", offset=12)
        raise RuntimeError("boom\nsecond line")

    def Scan(self, request, context):
        yield pb.ScanResponse(keys=[b"a"], values=[b"1"])
        raise ZeroDivisionError("mid-stream")

    Put = Delete = MultiGet = Write = Get


@pytest.fixture
def stub():
    guard = Guard("test server")
    server = grpc.server(futures.ThreadPoolExecutor(4))
    pbg.add_KVServicer_to_server(guard.wrap(Exploding(), KV_SERVICE), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield pbg.KVStub(channel), guard
    finally:
        channel.close()
        server.stop(0)


def test_unexpected_exception_is_internal_one_line_and_logged(stub, caplog):
    kv, guard = stub
    with caplog.at_level(logging.ERROR, logger="shard.status"):
        with pytest.raises(grpc.RpcError) as info:
            kv.Get(pb.GetRequest(key=b"k"))
    assert info.value.code() == C.INTERNAL
    assert info.value.details() == "internal error: RuntimeError: boom second line"
    assert "Traceback" not in info.value.details()
    assert any(r.exc_info for r in caplog.records)  # the traceback stays in the server log
    assert guard.in_flight == 0


def test_corruption_is_data_loss_naming_the_file(stub):
    kv, _ = stub
    with pytest.raises(grpc.RpcError) as info:
        kv.Get(pb.GetRequest(key=b"corrupt"))
    assert info.value.code() == C.DATA_LOSS
    assert "/data/000007.sst" in info.value.details()


def test_stream_failure_after_data_is_a_status(stub):
    kv, guard = stub
    stream = kv.Scan(pb.ScanRequest())
    assert list(next(stream).keys) == [b"a"]
    with pytest.raises(grpc.RpcError) as info:
        next(stream)
    assert info.value.code() == C.INTERNAL and "ZeroDivisionError" in info.value.details()
    assert guard.in_flight == 0
