"""A write with a timeout gives up during a write stall, with nothing applied.

``DB.put/delete/write(..., timeout=s)`` wait at most ``s`` seconds for room while writes are
held (L0 at ``l0_stop_trigger`` with the memtable full, writes held to
``delayed_write_rate``, or queued behind a write that is held), then raise WriteStalledError;
nothing of the write reaches the log. The shard passes what is left of a call's deadline, so
a Put during a long stall answers RESOURCE_EXHAUSTED ("not applied") before the caller's
deadline, instead of DEADLINE_EXCEEDED with the write applied later, or not.

Stalls are made by holding the DB's compaction lock (no compaction can bring L0 down), as
tests/test_review_session16.py does. Nothing here asserts speed: only lower bounds on how long a
write waited, and generous upper bounds that catch a write waiting for ever.
"""

from __future__ import annotations

import contextlib
import threading
import time

import grpc
import pytest

from engine import DB
from engine.errors import InvalidArgumentError, WriteStalledError
from shard.server import create_server
from sievekv_proto import sievekv_pb2 as pb
from sievekv_proto import sievekv_pb2_grpc as pbg

from .conftest import poll_until
from .test_review_session16 import _at_slowdown

VALUE = b"v" * 1000


@contextlib.contextmanager
def _stopped(path, **kw):
    """A DB whose L0 holds 2 tables (= l0_stop_trigger) with compactions held off, and a
    memtable filled until a write stops. Yields (db, keys written, release)."""
    with _at_slowdown(path, **{"memtable_bytes": 64 * 1024, "l0_stop_trigger": 2,
                               **kw}) as (db, release):
        written = []
        for i in range(10_000):  # ~55 fill the memtable; the next one stops
            key = b"fill%05d" % i
            try:
                db.put(key, VALUE, timeout=0.2)
            except WriteStalledError:
                break
            written.append(key)
        else:
            pytest.fail("no write ever stopped")
        yield db, written, release


def test_a_stopped_write_gives_up_at_its_timeout_and_is_not_applied(tmp_path):
    path = tmp_path / "db"
    with _stopped(path) as (db, written, release):
        t0 = time.monotonic()
        with pytest.raises(WriteStalledError) as info:
            db.put(b"late", VALUE, timeout=0.3)
        waited = time.monotonic() - t0
        assert 0.3 <= waited < 30
        msg = str(info.value)
        assert "write not applied" in msg and "L0 holds 2 tables, at l0_stop_trigger (2)" in msg
        assert "timeout of 0.3 s" in msg
        with pytest.raises(WriteStalledError):
            db.write([(b"batch-a", VALUE), (b"batch-b", None)], timeout=0)
        with pytest.raises(WriteStalledError):
            db.delete(written[0], timeout=0.01)
        st = db.stats()["write_stall"]
        assert st["timeouts"] == 4  # the fill's last put, and these three
        assert db.get(b"late") is None and db.get(b"batch-a") is None
        assert db.get(written[0]) == VALUE
        release()  # the compaction brings L0 down: writes go on
        db.put(b"after", VALUE, timeout=30)
        assert db.get(b"after") == VALUE
    with DB.open(path) as db:  # nothing of a refused write was logged
        assert db.get(b"late") is None and db.get(b"batch-a") is None
        assert all(db.get(k) == VALUE for k in written)
        assert db.get(b"after") == VALUE


def test_a_queued_write_withdraws_at_its_deadline_behind_a_held_leader(tmp_path):
    """A write without a timeout waits in the stall (it leads the queue); one with a timeout
    queued behind it leaves the queue at its deadline, unwritten; the leader is written once
    L0 comes down."""
    with _stopped(tmp_path / "db") as (db, _written, release):
        done = threading.Event()

        def lead():
            db.put(b"leader", VALUE)  # no timeout: waits for room
            done.set()

        t = threading.Thread(target=lead)
        t.start()
        try:
            assert poll_until(lambda: db._gc.pending() >= 1, 10.0)
            with pytest.raises(WriteStalledError, match="write not applied"):
                db.put(b"follower", VALUE, timeout=0.2)
            assert not done.is_set()  # the leader still waits
            release()
            assert done.wait(30)
        finally:
            release()
            t.join(30)
        assert db.get(b"leader") == VALUE and db.get(b"follower") is None


def test_a_slowed_write_that_would_sleep_past_its_timeout_fails_at_once(tmp_path):
    """At l0_slowdown_trigger a write sleeps bytes / delayed_write_rate; a 100 KB write at
    10 kB/s would sleep ~10 s: with a 1 s timeout it fails without sleeping."""
    opts = dict(l0_compaction_trigger=2, l0_slowdown_trigger=2, l0_stop_trigger=100,
                delayed_write_rate=10_000, table_workers=0)
    with DB.open(tmp_path / "db", **opts) as db:
        db._compaction_lock.acquire()
        try:
            for i in range(2):
                db.put(b"base%d" % i, b"v")
                db.flush()
            t0 = time.monotonic()
            with pytest.raises(WriteStalledError, match="writes are held to"):
                db.put(b"big", b"x" * 100_000, timeout=1.0)
            assert time.monotonic() - t0 < 1.0  # it did not sleep to its deadline first
            assert db.get(b"big") is None
        finally:
            db._compaction_lock.release()


@pytest.mark.parametrize("bad", [-1, float("nan"), "1", True])
def test_a_bad_timeout_is_refused(tmp_path, bad):
    with DB.open(tmp_path / "db", table_workers=0) as db:
        with pytest.raises(InvalidArgumentError, match="timeout"):
            db.put(b"k", b"v", timeout=bad)
        assert db.get(b"k") is None


def test_a_shard_answers_resource_exhausted_before_the_deadline(tmp_path):
    """Through a shard server: a Put with a 1.5 s deadline during a stop answers
    RESOURCE_EXHAUSTED naming the stall (nothing applied) instead of DEADLINE_EXCEEDED."""
    with _stopped(tmp_path / "db") as (db, _written, release):
        serving, port = create_server(db, "127.0.0.1:0", name="t0")
        serving.start()
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        try:
            kv = pbg.KVStub(channel)
            with pytest.raises(grpc.RpcError) as info:
                kv.Put(pb.PutRequest(key=b"rpc", value=VALUE), timeout=1.5)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value.details()
            assert "write not applied" in info.value.details()
            release()
            kv.Put(pb.PutRequest(key=b"rpc2", value=VALUE), timeout=30)
            assert db.get(b"rpc") is None and db.get(b"rpc2") == VALUE
        finally:
            channel.close()
            serving.stop(0)
