"""Adversarial review of session 4's router changes: per-shard call slots (router/shards.py,
router/call_slots.py), the deadline margin (router/deadlines.py), the client's scan resume and
timeout validation (router/client.py).

Real processes only (shards and routers from tests/conftest.py). Tests marked
``xfail(strict=True)`` show bugs found by the review; the others pin edge cases that were
checked and found correct and that no other test covered.
"""

from __future__ import annotations

import math
import os
import threading
import time

import grpc
import pytest

from router import client_errors as errors
from router.client import Client
from router.deadlines import MARGIN_MAX, shard_timeout
from shard.status import StatusError
from sievekv_proto import sievekv_pb2 as pb
from sievekv_proto import sievekv_pb2_grpc as pbg

from .conftest import start_router_process, start_shard_process, wait_until
from .test_service_failures import keys_by_shard, start_cluster


def small_router(procs, root, workers: int, max_calls: int, name: str):
    return start_router_process(procs, os.path.join(root, "cluster.toml"), name=name,
                                extra=("--workers", str(workers),
                                       "--max-calls-per-shard", str(max_calls)))


def load_big_values(address: str, n: int = 250, size: int = 100_000) -> None:
    """``n`` values of ``size`` bytes under b"big-...": a scan of them does not fit the HTTP/2
    flow-control windows, so a router Scan handler blocks on a client that does not read."""
    with Client(address, retries=0, timeout=120) as c:
        with c.batch(max_bytes=2 << 20, timeout=120) as b:
            for i in range(n):
                b.put(b"big-%06d" % i, b"v" * size)


def get_outcome(address: str, key: bytes):
    with Client(address, retries=0, timeout=30) as c:
        try:
            return c.get(key)
        except errors.ClientError as exc:
            return exc


# ---------------------------------------------------------------------------------------------
# Bugs (xfail strict)

def test_concurrent_cross_shard_writes_to_healthy_shards_all_apply(procs, tmp_path):
    # The router as shipped: 32 handler threads, 8 call slots per shard.
    shards, router, cmap = start_cluster(procs, str(tmp_path), 2)
    a, b = (g[0] for g in keys_by_shard(cmap, 2, per_shard=1))
    with Client(router.address, retries=0) as c:  # the router connects to both shards first
        c.write([(a, b"0"), (b, b"0")])
    failures: list[str] = []
    writes = [0]
    stop = time.monotonic() + 8.0

    def writer(i: int) -> None:
        order = [a, b] if i % 2 else [b, a]  # Write parts in both shard orders
        with Client(router.address, retries=0, timeout=60) as c:
            while time.monotonic() < stop and not failures:
                try:
                    c.write([(k, b"%d" % i) for k in order])
                    writes[0] += 1
                except errors.ClientError as exc:
                    failures.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(s.alive() for s in shards)
    assert writes[0] > 0
    assert failures == [], f"{len(failures)} failed after {writes[0]} writes: {failures[0]}"


def test_slow_scan_readers_do_not_lock_out_point_reads(procs, tmp_path):
    shards, _, cmap = start_cluster(procs, str(tmp_path), 2)
    router = small_router(procs, str(tmp_path), workers=8, max_calls=2, name="small")
    load_big_values(router.address)
    key = keys_by_shard(cmap, 2, per_shard=1)[1][0]
    with Client(router.address, retries=0) as c:
        c.put(key, b"ok")
    channel = grpc.insecure_channel(router.address)
    streams = []
    try:
        stub = pbg.KVStub(channel)
        for _ in range(2):  # two readers that are slow (here: stopped) consuming a big scan
            stream = stub.Scan(pb.ScanRequest(start=b"big-"), timeout=120)
            next(stream)  # the router's handler runs: it holds its thread from here on, while
            streams.append(stream)  # it sends and once blocked on the reader's window alike
        assert all(s.alive() for s in shards)  # both shards are healthy and idle
        assert get_outcome(router.address, key) == b"ok"
    finally:
        for s in streams:
            s.cancel()
        channel.close()


def test_an_infinite_client_timeout_is_refused_or_works(procs, tmp_path):
    shard = start_shard_process(procs, str(tmp_path / "s0"), name="s0")
    try:
        c = Client(shard.address, timeout=math.inf)
    except ValueError:
        return  # refused up front: fine
    with c:
        c.put(b"k", b"v")  # today: DeadlineExceededError at once
        assert c.get(b"k") == b"v"


# ---------------------------------------------------------------------------------------------
# Checked and found correct

class _Context:
    """The one method of grpc.ServicerContext that shard_timeout reads."""

    def __init__(self, remaining):
        self.remaining = remaining

    def time_remaining(self):
        return self.remaining


def test_deadline_margin_is_never_zero_negative_or_over_a_second():
    for remaining in (1e-9, 1e-4, 0.05, 1.0, 9.99, 10.0, 11.0, 600.0, 1e8):
        t = shard_timeout(_Context(remaining), 7.0)
        assert 0 < t < remaining
        assert remaining - t <= MARGIN_MAX + 1e-9
        assert t >= 0.9 * remaining - 1e-12
    assert shard_timeout(_Context(None), 7.0) == 7.0  # no client deadline
    assert shard_timeout(_Context(9.2e18), 7.0) == 7.0  # gRPC's "no deadline"
    for expired in (0.0, -1.0):
        with pytest.raises(StatusError) as info:
            shard_timeout(_Context(expired), 7.0)
        assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


def test_call_slots_come_back_after_cancelled_scans_failed_fan_outs_and_expired_deadlines(
        procs, tmp_path):
    """One slot per shard: a single leaked slot would refuse every later call for that shard."""
    shards, _, cmap = start_cluster(procs, str(tmp_path), 2)
    router = small_router(procs, str(tmp_path), workers=8, max_calls=1, name="one")
    load_big_values(router.address, n=80)
    g = keys_by_shard(cmap, 2, per_shard=3)
    with Client(router.address, retries=0) as c:
        c.write([(k, b"x") for keys in g for k in keys])
    ok_key = g[0][0]

    def serves() -> bool:
        return get_outcome(router.address, ok_key) == b"x"

    # Scans the client cancels mid-stream (the router's handler is blocked sending).
    channel = grpc.insecure_channel(router.address)
    try:
        stub = pbg.KVStub(channel)
        for _ in range(3):
            stream = stub.Scan(pb.ScanRequest(start=b"big-"), timeout=120)
            next(stream)
            stream.cancel()
            wait_until(serves, "the slots of a cancelled scan")
        # Client.scan abandoned after one entry (its generator closes the stream).
        with Client(router.address, retries=0, timeout=60) as c:
            it = c.scan(start=b"big-")
            next(it)
            it.close()
        wait_until(serves, "the slots of an abandoned Client.scan")
        # Calls whose deadline is already over or ends inside the router.
        with Client(router.address, retries=0) as c:
            for i in range(40):
                for call in (lambda: c.get(ok_key, timeout=1e-4 * (i % 4)),
                             lambda: c.multi_get([g[0][1], g[1][1]], timeout=1e-4 * (i % 4)),
                             lambda: c.write([(g[0][2], b"y"), (g[1][2], b"y")],
                                             timeout=1e-4 * (i % 4)),
                             lambda: list(c.scan(b"big-", limit=3, timeout=1e-4 * (i % 4)))):
                    try:
                        call()
                    except (errors.DeadlineExceededError, errors.PartialWriteError):
                        pass
        wait_until(serves, "the slots of calls with expired deadlines")
        # A fan-out whose other part fails: shard 1 is gone, shard 0's slot must come back.
        shards[1].kill()
        with Client(router.address, retries=0) as c:
            for _ in range(5):
                with pytest.raises(errors.UnavailableError):
                    c.multi_get([g[0][1], g[1][1]])
                with pytest.raises(errors.PartialWriteError):
                    c.write([(g[0][2], b"z"), (g[1][2], b"z")])
                with pytest.raises(errors.UnavailableError):
                    list(c.scan())
            assert c.get(ok_key) == b"x"
            assert c.get(g[0][2]) == b"z"  # shard 0's part of the Writes was applied
    finally:
        channel.close()


def test_resumed_scan_keeps_its_limit_when_the_last_key_was_deleted_meanwhile(procs, tmp_path):
    """The resumed stream starts *at* the last key yielded and asks one entry more to make up
    for skipping it; when that key was deleted between the attempts the extra entry must not
    be yielded (exactly ``limit`` entries, in order, no duplicates)."""
    from engine import DB

    data = str(tmp_path / "s0")
    shard = start_shard_process(procs, data, name="s0")
    keys = [b"key-%05d" % i for i in range(400)]
    with Client(shard.address) as c:
        with c.batch(max_bytes=2 << 20) as b:
            for k in keys:
                b.put(k, b"v" * 16_000)
    limit = 200
    # no BDP probing: the receive window stays small, so the stream is mid-way when the shard dies
    with Client(shard.address, timeout=120, retries=10, backoff=0.2, max_backoff=1.0,
                channel_options=[("grpc.http2.bdp_probe", 0)]) as c:
        it = c.scan(limit=limit)
        got = [next(it)[0]]
        shard.kill()
        db = DB.open(data, table_workers=0)
        try:
            for k in keys[1:151]:  # every key the client can have buffered, its last one too
                db.delete(k)
        finally:
            db.close()
        start_shard_process(procs, data, name="s0", port=shard.port)
        got += [k for k, _ in it]
    j = next(i for i in range(1, len(got)) if got[i] >= keys[151])  # first key after the resume
    assert 1 <= j < 151, got[:5]  # the stream broke while the deleted keys were being read
    assert got[:j] == keys[:j]
    assert got[j:] == keys[151:151 + limit - j]
    assert len(got) == limit
