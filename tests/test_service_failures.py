"""Failures with real processes: a killed shard, a SIGTERM drain, a multi-process router."""

import os
import signal
import threading
import time

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from router import client_errors as errors
from router.client import Client
from router.cluster_map import load as load_map
from sievekv_proto import sievekv_pb2 as pb
from sievekv_proto import sievekv_pb2_grpc as pbg

from .conftest import (free_port, sigstop, start_router_process, start_shard_process,
                       write_cluster_map)
from .test_service_metrics import scrape


def start_cluster(procs, root, n_shards, processes=1):
    shards = [start_shard_process(procs, os.path.join(root, f"s{i}"), name=f"s{i}", wait=False)
              for i in range(n_shards)]
    for s in shards:
        s.wait_ready()
    map_path = write_cluster_map(os.path.join(root, "cluster.toml"), shards)
    router = start_router_process(procs, map_path, processes=processes)
    return shards, router, load_map(map_path)


def keys_by_shard(cmap, n_shards, per_shard=20):
    out = [[] for _ in range(n_shards)]
    i = 0
    while min(len(k) for k in out) < per_shard:
        key = b"key-%05d" % i
        out[cmap.shard_index(key)].append(key)
        i += 1
    return [k[:per_shard] for k in out]


def test_killed_shard_is_unavailable_for_its_keys_only(procs, tmp_path):
    shards, router, cmap = start_cluster(procs, str(tmp_path), 3)
    groups = keys_by_shard(cmap, 3)
    with Client(router.address, retries=0) as c:
        c.write([(k, k) for g in groups for k in g])
        dead = shards[1]
        dead.kill()
        for key in groups[1][:3]:
            with pytest.raises(errors.UnavailableError) as info:
                c.get(key)
            assert f"shard s1 at {dead.address}" in info.value.details
        for key in groups[0] + groups[2]:
            assert c.get(key) == key
        assert c.multi_get(groups[0] + groups[2]) == groups[0] + groups[2]
        c.put(groups[2][0], b"new")
        assert c.get(groups[2][0]) == b"new"
        with pytest.raises(errors.UnavailableError, match="shard s1"):
            c.multi_get([groups[0][0], groups[1][0]])
        with pytest.raises(errors.UnavailableError, match="shard s1"):
            list(c.scan())

        with pytest.raises(errors.PartialWriteError) as info:
            c.write([(groups[0][1], b"w"), (groups[1][1], b"w"), (groups[2][1], b"w")])
        assert isinstance(info.value, errors.UnavailableError)
        applied = {r.shard: r.applied for r in info.value.results}
        assert applied == {"s0": True, "s1": False, "s2": True}
        assert c.get(groups[0][1]) == b"w"

        stats = c.stats()
        assert sorted(stats["shards"]) == ["s0", "s2"] and "s1" in stats["errors"]
        with pytest.raises(errors.PartialAdminError) as info:
            c.flush()
        assert {s.shard: s.ok for s in info.value.sections} == {"s0": True, "s1": False, "s2": True}
        health = {s["name"]: s["health"] for s in c.cluster_info()["shards"]}
        assert health == {"s0": "SERVING", "s1": "UNREACHABLE", "s2": "SERVING"}

    # the shard comes back on its port: the router reconnects by itself
    start_shard_process(procs, os.path.join(str(tmp_path), "s1"), name="s1", port=dead.port)
    with Client(router.address, retries=8, backoff=0.1, max_backoff=0.5) as c:
        assert c.get(groups[1][0]) == groups[1][0]


def test_sigterm_drains_without_losing_an_acknowledged_write(procs, tmp_path):
    shards, router, cmap = start_cluster(procs, str(tmp_path), 2)
    acked: list[bytes] = []
    failures: list[Exception] = []
    stop = threading.Event()

    def writer(prefix: bytes):
        with Client(router.address, retries=0) as c:
            i = 0
            while not stop.is_set():
                key = b"%s-%06d" % (prefix, i)
                i += 1
                try:
                    c.put(key, key)
                except errors.ClientError as exc:
                    failures.append(exc)
                    continue
                acked.append(key)

    threads = [threading.Thread(target=writer, args=(b"w%d" % t,)) for t in range(3)]
    for t in threads:
        t.start()
    try:
        while len(acked) < 300:
            time.sleep(0.01)
        shards[0].popen.send_signal(signal.SIGTERM)
        assert shards[0].popen.wait(30) == 0
        time.sleep(0.2)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert failures and all(isinstance(f, errors.UnavailableError) for f in failures)
    assert any(cmap.shard_index(k) == 1 for k in acked[-50:])  # the other shard kept working
    start_shard_process(procs, os.path.join(str(tmp_path), "s0"), name="s0", port=shards[0].port)
    with Client(router.address, retries=8, backoff=0.1, max_backoff=0.5) as c:
        got = c.multi_get(acked)
    missing = [k for k, v in zip(acked, got) if v != k]
    assert not missing, f"{len(missing)} acknowledged writes lost, e.g. {missing[:3]}"


def test_sigterm_lets_an_inflight_scan_finish_and_refuses_new_calls(procs, tmp_path):
    shard = start_shard_process(procs, str(tmp_path / "s0"), name="s0")
    value = b"v" * 4096
    with Client(shard.address) as c:
        with c.batch(max_mutations=100) as b:
            for i in range(1000):
                b.put(b"k%05d" % i, value)
    # no BDP probing: the receive window stays small, so the shard cannot send everything at once
    channel = grpc.insecure_channel(shard.address, options=[("grpc.http2.bdp_probe", 0)])
    try:
        kv = pbg.KVStub(channel)
        stream = kv.Scan(pb.ScanRequest())
        received = len(next(stream).keys)
        shard.popen.send_signal(signal.SIGTERM)
        health = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + 10
        while health.Check(health_pb2.HealthCheckRequest()).status != health_pb2.HealthCheckResponse.NOT_SERVING:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with pytest.raises(grpc.RpcError) as info:
            kv.Get(pb.GetRequest(key=b"k00001"))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE and "draining" in info.value.details()
        assert shard.alive()  # still draining: the scan is in flight
        for batch in stream:
            received += len(batch.keys)
        assert received == 1000
    finally:
        channel.close()
    assert shard.popen.wait(30) == 0


def router_workers(supervisor_pid: int) -> list[psutil.Process]:
    """Live router processes of a supervisor (not multiprocessing's resource tracker)."""
    out = []
    for p in psutil.Process(supervisor_pid).children():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "spawn_main" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def test_two_router_processes_share_one_port(procs, tmp_path):
    shards, router, cmap = start_cluster(procs, str(tmp_path), 2, processes=2)
    workers = router_workers(router.popen.pid)
    assert len(workers) == 2
    for i in range(6):  # separate channels: separate connections, spread by the kernel
        with Client(router.address, retries=0) as c:
            c.put(b"p%d" % i, b"%d" % i)
            assert c.get(b"p%d" % i) == b"%d" % i
    listeners = {conn.laddr.port for w in workers for conn in w.net_connections(kind="tcp")
                 if conn.status == psutil.CONN_LISTEN}
    assert listeners == {router.port}
    # a router process that dies is replaced; the others keep serving meanwhile
    workers[0].kill()
    with Client(router.address, retries=8, backoff=0.1, max_backoff=0.5) as c:
        assert c.get(b"p1") == b"1"
    deadline = time.monotonic() + 15
    while len(router_workers(router.popen.pid)) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert router.terminate() == 0
    for w in workers[1:]:
        assert not w.is_running() or w.status() == psutil.STATUS_ZOMBIE


def test_deadlines_reach_the_shards(procs, tmp_path):
    shards, _, cmap = start_cluster(procs, str(tmp_path), 2)
    stopped = shards[0]
    key = keys_by_shard(cmap, 2, per_shard=1)[0][0]
    metrics_port = free_port()
    short = start_router_process(procs, str(tmp_path / "cluster.toml"), name="short",
                                 extra=("--default-timeout", "0.5"))
    long = start_router_process(procs, str(tmp_path / "cluster.toml"), name="long",
                                extra=("--default-timeout", "120", "--metrics-port", str(metrics_port)))
    for router in (short, long):  # connect both routers to the shard first
        with Client(router.address) as c:
            assert c.get(key) is None
    sigstop(stopped.popen.pid)  # connected, but the shard never answers
    try:
        # no client deadline: the router applies its default and names the shard
        with grpc.insecure_channel(short.address) as ch:
            with pytest.raises(grpc.RpcError) as info:
                pbg.KVStub(ch).Get(pb.GetRequest(key=key))
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "shard s0" in info.value.details()
        # a client deadline: the router gives the shard only what is left of it (less its
        # margin), so its handler ends before the client's deadline, not after its own 120 s
        # default, and the client learns which shard did not answer
        with Client(long.address, retries=0) as c:
            with pytest.raises(errors.DeadlineExceededError) as late:
                c.get(key, timeout=4.0)
        assert "shard s0" in str(late.value), str(late.value)
        sample = ("sievekv_requests_total", (("code", "DEADLINE_EXCEEDED"), ("method", "Get")))
        deadline = time.monotonic() + 30
        while scrape(metrics_port).get(sample) != 1:
            assert time.monotonic() < deadline, "the router kept waiting for the shard"
            time.sleep(0.1)
    finally:
        os.kill(stopped.popen.pid, signal.SIGCONT)


def test_corruption_in_a_shard_is_data_loss_naming_the_file(procs, tmp_path):
    shards, router, cmap = start_cluster(procs, str(tmp_path), 2)
    groups = keys_by_shard(cmap, 2, per_shard=200)
    with Client(router.address, retries=0) as c:
        c.write([(k, k * 20) for g in groups for k in g])
        c.flush()
    assert shards[0].terminate() == 0
    data_dir = tmp_path / "s0"
    tables = sorted(p for p in os.listdir(data_dir) if p.endswith(".sst"))
    assert tables
    with open(data_dir / tables[0], "r+b") as f:  # flip a byte inside the first data block
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    start_shard_process(procs, str(data_dir), name="s0", port=shards[0].port)
    with Client(router.address, retries=8, backoff=0.1, max_backoff=0.5) as c:
        with pytest.raises(errors.DataLossError) as info:
            c.get(groups[0][0])
        assert tables[0] in info.value.details and "shard s0" in info.value.details
        assert c.multi_get(groups[1]) == [k * 20 for k in groups[1]]  # the other shard is fine


def test_startup_errors_exit_1_with_one_line(procs, tmp_path):
    first = start_shard_process(procs, str(tmp_path / "s0"), name="s0")
    # the same data directory again: the engine's lock refuses it
    again = start_shard_process(procs, str(tmp_path / "s0"), name="s0b", wait=False)
    assert again.popen.wait(30) == 1
    assert "cannot open" in again.log() and "Traceback" not in again.log()
    # the same port again: no SO_REUSEPORT on shards, so the bind fails
    busy = start_shard_process(procs, str(tmp_path / "s1"), name="s1", port=first.port, wait=False)
    assert busy.popen.wait(30) == 1
    assert f"cannot listen on 127.0.0.1:{first.port}" in busy.log() and "Traceback" not in busy.log()
    # an invalid cluster map: the router names the problem
    bad_map = tmp_path / "bad.toml"
    bad_map.write_text('[[shards]]\nname = "a"\naddress = "127.0.0.1:1"\nslots = [[0, 100]]\n')
    router = start_router_process(procs, str(bad_map), wait=False)
    assert router.popen.wait(30) == 1
    assert "slots 101-16383 are not assigned to any shard" in router.log()
    supervisor = start_router_process(procs, str(bad_map), name="router2", processes=2, wait=False)
    assert supervisor.popen.wait(30) == 1
    assert "slots 101-16383" in supervisor.log()


def test_a_hung_shard_leaves_the_router_threads_to_the_others(procs, tmp_path):
    """A shard that stops answering holds at most its call slots of the router's handler
    threads (router/shards.py): once it has answered nothing for HUNG_AFTER seconds, the calls
    waiting for a slot give up and new ones fail at once, with UNAVAILABLE naming it, and the
    other shard keeps being served. Before the slots, 12 waiting calls took all 8 threads and
    the other shard's keys timed out too."""
    shards, _, cmap = start_cluster(procs, str(tmp_path), 2)
    router = start_router_process(procs, str(tmp_path / "cluster.toml"), name="small",
                                  extra=("--workers", "8", "--max-calls-per-shard", "2"))
    groups = keys_by_shard(cmap, 2, per_shard=1)
    hung_key, ok_key = groups[0][0], groups[1][0]
    with Client(router.address, retries=0) as c:  # the router connects to both shards first
        c.put(hung_key, b"h")
        c.put(ok_key, b"o")
    sigstop(shards[0].popen.pid)
    outcomes = []

    def wait_on_the_hung_shard():
        try:
            outcomes.append(c.get(hung_key, timeout=120))
        except errors.ClientError as exc:
            outcomes.append(exc)

    c = Client(router.address, retries=0, timeout=60)
    waiting = [threading.Thread(target=wait_on_the_hung_shard) for _ in range(12)]
    try:
        for t in waiting:
            t.start()
        deadline = time.monotonic() + 60
        while len(outcomes) < 10:  # two calls hold the slots; the rest are refused
            assert time.monotonic() < deadline, outcomes
            time.sleep(0.05)
        assert all(isinstance(o, errors.UnavailableError) for o in outcomes), outcomes
        assert "shard s0" in str(outcomes[0]) and "not answering" in str(outcomes[0])
        assert c.get(ok_key, timeout=30) == b"o"  # the other shard still has threads
        started = time.monotonic()
        with pytest.raises(errors.UnavailableError) as refused:
            c.get(hung_key, timeout=60)
        assert time.monotonic() - started < 30  # refused, not left to wait for its deadline
        assert "not answering" in str(refused.value)
        # A Write touching the hung shard is sent to no shard: certainly applied nowhere.
        with pytest.raises(errors.PartialWriteError) as info:
            c.write([(hung_key, b"x"), (ok_key, b"y")], timeout=30)
        assert {r.shard: r.applied for r in info.value.results} == {"s0": False, "s1": False}
        assert "not sent" in str(info.value)
        assert c.get(ok_key) == b"o"
        c.put(ok_key, b"y")
    finally:
        os.kill(shards[0].popen.pid, signal.SIGCONT)
        for t in waiting:
            t.join(150)
        c.close()
    assert outcomes.count(b"h") == 2  # the two that held the slots are answered once it resumes
    with Client(router.address, retries=0) as c2:
        assert c2.get(hung_key) == b"h"  # the part refused for lack of a slot was never sent
