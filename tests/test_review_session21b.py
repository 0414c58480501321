"""Session 21b review: the router's merged-MultiGet size check, WriteBatcher's encoded size and
the closed WritableFile, with a real router in front of three real shard processes
(127.0.0.1, port 0), all started with ``--max-value-bytes 1024`` so that the message limit is
L = 1 MiB + 1 KiB = 1,049,600 bytes and reachable with a few MB of data.

Checked and holding (plain tests below):

- merged MultiGet at the boundary, through a stub with no receive limit (so only the router
  decides): values totalling L + 1 are refused by the router's own check (RESOURCE_EXHAUSTED,
  "the values found exceed the message limit of 1049600 bytes", CLI exit 2); values totalling
  exactly L pass that values-only check, but their encoded answer (framing: 1 found byte and
  3 bytes of tag/length per value) is over L, so gRPC refused the send: still
  RESOURCE_EXHAUSTED, its "Sent message larger than max" also CLI exit 2 (a third finding,
  reported as holding; since session 21 the router and the shard check the encoded size
  near the limit and refuse in their own words); an answer whose
  *encoding* is exactly L is sent whole, one byte more is RESOURCE_EXHAUSTED. In all four
  cases Client.multi_get returns the whole answer, in order (halving); the same for one
  shard's answer passed through (1025 x 1 KiB values = L: gRPC's refusal, the shard's own
  "values found exceed ... once encoded" since session 21; 1026: the engine's "values found
  exceed");
- a key repeated across the request counts once per position: distinct values under L but
  repetitions over it are refused, and Client.multi_get still answers every position;
- the router's cancellation of the parts still coming gives back their call slots: with
  ``--max-calls-per-shard 1``, 25 over-limit MultiGets in a row, then Gets and a MultiGet on
  every shard answer at once (a leaked slot would refuse them);
- which error wins when a shard is down and the other parts are over the limit: in session
  21 the router waited on the parts in shard order, so the key set fixed the outcome; since
  session 22 it takes them as they complete (tests/test_router_multiget_order.py), so the
  answer is the down shard's UNAVAILABLE (naming it) or the limit's RESOURCE_EXHAUSTED,
  whichever comes first, and never anything else; the cluster serves again after the shard
  is restarted;
- WriteBatcher: ``size`` equals ``pb.WriteRequest(mutations=pending).ByteSize()`` after every
  put/delete for 3,000 random keys/values (empty values, deletes, keys and values of
  127/128/16383/16384 bytes and around 2**21), every batch it sends is <= max_bytes unless
  it is a single mutation, and every write lands (compared with a dict model);
  a batch sized to exactly the message limit (sync unset) is accepted by the router;
- engine/vfs.py: after close, append and sync raise StorageIOError EBADF, start_writeback is
  silent, close is idempotent (also through FaultInjectionFS; that test is now part of
  tests/test_faultfs.py's closed-file test); a table build, a manifest
  switch and a DB close/reopen with a switch in between work as before (the writers they
  close are never used afterwards).

Findings (strict xfails at first; all fixed in session 21, now plain tests):

- WriteBatcher does not count the WriteRequest's ``sync`` field (2 bytes when sync is True or
  False): with ``sync=True`` and ``max_bytes`` set to the message limit (the use its commit
  names: "a caller sizing max_bytes to a server's receive limit"), a batch whose mutations
  encode to exactly max_bytes is sent as a max_bytes + 2 byte Write and refused with
  RESOURCE_EXHAUSTED ("Sent message larger than max"). router/cli/data_cmds.py's ``load``
  counts it (SYNC_FIELD_BYTES); router/client.py's WriteBatcher does not.
  (test_write_batcher_with_sync_stays_within_max_bytes)
- FaultInjectionFS: a sync of a closed file garbles the file on disk (and lists it in
  ``garbled``) before the real fsync fails with EBADF: the fault layer mutates a file the
  call never reached, as a real closed descriptor cannot.
  (test_faultfs_sync_of_a_closed_file_garbles_nothing)
- (fixed with them) at exactly L of values, the router and a shard passed the values-only
  check and gRPC refused the send: both now check the encoded size near the limit
  (shard/limits.py ``multi_get_answer_problem``).
"""

from __future__ import annotations

import os
import random

import grpc
import pytest

from engine.errors import StorageIOError
from engine.faultfs import FaultInjectionFS
from router import client_errors as errors
from router.cli.exit_codes import USAGE, code_for_grpc
from router.client import Client, _mutation
from router.cluster_map import load as load_map
from shard.limits import Limits
from sievekv_proto import sievekv_pb2 as pb

from .conftest import (Cluster, ProcRegistry, open_test_db, start_router_process,
                       start_shard_process, wait_until, write_cluster_map)

N_SHARDS = 3
V = 1024
LIMIT = Limits(max_value_bytes=V).max_message_bytes  # 1,049,600
FILL_PER_SHARD = 560  # 560 KiB of 1 KiB values per shard: any two shards' parts exceed LIMIT


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    registry = ProcRegistry()
    try:
        root = str(tmp_path_factory.mktemp("c21b"))
        flags = ("--max-value-bytes", str(V))
        shards = [start_shard_process(registry, os.path.join(root, f"s{i}"), name=f"s{i}",
                                      extra=flags, wait=False) for i in range(N_SHARDS)]
        for s in shards:
            s.wait_ready()
        map_path = write_cluster_map(os.path.join(root, "cluster.toml"), shards)
        router = start_router_process(registry, map_path,
                                      extra=(*flags, "--max-calls-per-shard", "1"))
        c = Cluster(shards, router, map_path, root)
        c.registry = registry
        c.cmap = load_map(map_path)
        yield c
    finally:
        registry.kill_all()


def new_client(cluster, **kw) -> Client:
    kw.setdefault("retries", 0)
    kw.setdefault("timeout", 30)
    return Client(cluster.router.address, max_value_bytes=V, **kw)


@pytest.fixture(scope="module")
def client(cluster):
    with new_client(cluster) as c:
        yield c


@pytest.fixture(scope="module")
def stub(cluster):
    with cluster.unlimited_kv_stub() as stub:
        yield stub


def keys_on(cluster, shard: int, n: int, prefix: bytes) -> list[bytes]:
    out, i = [], 0
    while len(out) < n:
        key = prefix + b"%d" % i
        if cluster.cmap.shard_index(key) == shard:
            out.append(key)
        i += 1
    return out


@pytest.fixture(scope="module")
def fill(cluster, client):
    """shard -> FILL_PER_SHARD keys holding distinct 1 KiB values; also key -> value."""
    per_shard = {s: keys_on(cluster, s, FILL_PER_SHARD, b"f%d/" % s) for s in range(N_SHARDS)}
    data = {}
    with client.batch(max_mutations=500) as b:
        for s, keys in per_shard.items():
            for k in keys:
                data[k] = (k + b"=") * (V // len(k)) + b"#" * (V % len(k))
                data[k] = data[k][:V]
                assert len(data[k]) == V
                b.put(k, data[k])
    return per_shard, data


def adjusters(cluster, client, total_rest: int, tag: bytes) -> list[tuple[bytes, bytes]]:
    """Put keys (spread over the shards) whose values add up to ``total_rest`` bytes, each
    128..V bytes (a 2-byte length varint, so one more byte of value is one more byte of
    answer)."""
    n = max(1, -(-total_rest // V))
    if total_rest < 128 * n:
        raise AssertionError(f"cannot split {total_rest} into {n} values of 128..{V} bytes")
    sizes = [total_rest // n] * n
    for i in range(total_rest - sum(sizes)):
        sizes[i] += 1
    out = []
    for i, size in enumerate(sizes):
        key = keys_on(cluster, i % N_SHARDS, 1, b"adj-%s-%d-" % (tag, i))[0]
        value = bytes([65 + i % 26]) * size
        client.put(key, value)
        out.append((key, value))
    return out


def request_with_values_total(cluster, client, fill, total: int, tag: bytes):
    """(keys, expected values) across all three shards whose values add up to ``total``."""
    per_shard, data = fill
    base = [k for s in range(N_SHARDS) for k in per_shard[s][:330]]  # 990 KiB, 330 per shard
    rest = total - len(base) * V
    adj = adjusters(cluster, client, rest, tag)
    keys = base + [k for k, _ in adj]
    want = [data[k] for k in base] + [v for _, v in adj]
    assert sum(map(len, want)) == total
    return keys, want


def encoded(values) -> int:
    return pb.MultiGetResponse(found=[True] * len(values), values=values).ByteSize()


def refused(stub, keys) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as ei:
        stub.MultiGet(pb.MultiGetRequest(keys=keys), timeout=60)
    return ei.value


# -- MultiGet at the message limit ----------------------------------------------------------------
def test_merged_values_one_byte_over_the_limit_are_refused_by_the_router(cluster, client,
                                                                         stub, fill):
    keys, want = request_with_values_total(cluster, client, fill, LIMIT + 1, b"over")
    exc = refused(stub, keys)
    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"the values found exceed the message limit of {LIMIT} bytes" in exc.details()
    assert f"({LIMIT + 1} bytes for" in exc.details(), exc.details()
    assert code_for_grpc(exc.code(), exc.details()) == USAGE
    assert client.multi_get(keys) == want


def test_merged_values_exactly_at_the_limit_encode_over_it_and_the_router_says_so(
        cluster, client, stub, fill):
    """Values of exactly L pass the router's values-only check as parts arrive, but their
    framing does not fit: found at the end (ByteSize near the limit; session 21, after this
    review), the router's own refusal, not gRPC's "Sent message larger than max"."""
    keys, want = request_with_values_total(cluster, client, fill, LIMIT, b"at")
    assert encoded(want) > LIMIT
    exc = refused(stub, keys)
    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc.details()
    assert exc.details().startswith(
        f"the values found exceed the message limit of {LIMIT} bytes once encoded"), exc.details()
    assert code_for_grpc(exc.code(), exc.details()) == USAGE
    assert client.multi_get(keys) == want


@pytest.mark.parametrize("extra", [0, 1])
def test_merged_answer_encoded_at_the_limit_is_sent_and_one_more_byte_is_refused(
        cluster, client, stub, fill, extra):
    per_shard, data = fill
    base = [k for s in range(N_SHARDS) for k in per_shard[s][:330]]
    n_adj = 50  # enough keys' framing to absorb: pick the values' total so the encoding is L
    framing = encoded([data[k] for k in base] + [b"\x00" * 200] * n_adj) - \
        (len(base) * V + 200 * n_adj)
    rest = LIMIT + extra - framing - len(base) * V
    assert 128 * n_adj <= rest <= V * n_adj
    sizes = [rest // n_adj] * n_adj
    for i in range(rest - sum(sizes)):
        sizes[i] += 1
    adj = []
    for i, size in enumerate(sizes):
        key = keys_on(cluster, i % N_SHARDS, 1, b"enc-%d-%d-" % (extra, i))[0]
        value = bytes([97 + i % 26]) * size
        client.put(key, value)
        adj.append((key, value))
    keys = base + [k for k, _ in adj]
    want = [data[k] for k in base] + [v for _, v in adj]
    assert encoded(want) == LIMIT + extra
    assert sum(map(len, want)) < LIMIT  # the router's values-only check passes both
    if extra == 0:
        r = stub.MultiGet(pb.MultiGetRequest(keys=keys), timeout=60)
        assert list(r.values) == want and all(r.found)
    else:
        exc = refused(stub, keys)
        assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc.details()
        assert code_for_grpc(exc.code(), exc.details()) == USAGE
    assert client.multi_get(keys) == want


@pytest.mark.parametrize("n", [1025, 1026])
def test_one_shards_answer_at_and_over_the_limit(cluster, client, stub, fill, n):
    """All keys on one shard (the router passes the call through): values of exactly L
    (1025 x 1 KiB, a key repeated) pass the engine's values-only check and, encoded, fail the
    shard's size check (gRPC's send until session 21); one more value fails the engine's. Both RESOURCE_EXHAUSTED, exit 2, and
    Client.multi_get answers every position."""
    per_shard, data = fill
    keys = (per_shard[0] * 2)[:n]
    exc = refused(stub, keys)
    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc.details()
    assert code_for_grpc(exc.code(), exc.details()) == USAGE, exc.details()
    # 1025: the values fit, their encoding not: the shard's own refusal since session 21
    # (was gRPC's "Sent message larger than max"); 1026: the engine's values-only check.
    assert "values found exceed" in exc.details(), exc.details()
    assert client.multi_get(keys) == [data[k] for k in keys]


def test_a_key_repeated_across_the_request_counts_once_per_position(cluster, client, stub,
                                                                     fill):
    per_shard, data = fill
    distinct = per_shard[0][:100] + per_shard[1][:100] + per_shard[2][:100]  # 300 KiB
    keys = distinct * 4  # 1.2 MiB of values, 300 KiB of them distinct
    exc = refused(stub, keys)
    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "values found exceed the message limit" in exc.details()
    assert client.multi_get(keys) == [data[k] for k in keys]
    # Under it: every position answered, in order.
    keys = distinct * 3
    r = stub.MultiGet(pb.MultiGetRequest(keys=keys), timeout=60)
    assert list(r.values) == [data[k] for k in keys]


def test_cancelled_parts_give_their_call_slots_back(cluster, client, stub, fill):
    """The router runs with --max-calls-per-shard 1: a slot kept by a part it cancelled would
    leave a shard with none."""
    per_shard, data = fill
    keys = per_shard[0][:400] + per_shard[1][:400] + per_shard[2][:400]  # 1.2 MiB
    for _ in range(25):
        exc = refused(stub, keys)
        assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    with new_client(cluster, timeout=5) as c:
        for s in range(N_SHARDS):
            k = per_shard[s][-1]
            assert c.get(k) == data[k]
        small = [per_shard[s][i] for s in range(N_SHARDS) for i in range(500, 510)]
        assert c.multi_get(small) == [data[k] for k in small]


# -- which error wins --------------------------------------------------------------------------
def restart_shard(cluster, i: int) -> None:
    old = cluster.shards[i]
    old.kill()
    new = start_shard_process(cluster.registry, os.path.join(cluster.root, old.name),
                              name=old.name, port=old.port, extra=("--max-value-bytes", str(V)))
    cluster.shards[i] = new
    probe = keys_on(cluster, i, 1, b"probe-")[0]

    def reachable():
        try:
            with new_client(cluster, timeout=2) as c:
                c.get(probe)
            return True
        except (errors.UnavailableError, errors.DeadlineExceededError):
            return False
    wait_until(reachable, f"the router to reach the restarted shard {old.name}", timeout=30)


def _down_or_over(exc, down: str) -> bool:
    """The two right answers when shard ``down`` is down and the other parts are over the
    limit: its UNAVAILABLE naming it, or the router's size refusal (whichever part came first)."""
    if exc.code() == grpc.StatusCode.UNAVAILABLE:
        return down in exc.details()
    return (exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            and "values found exceed" in exc.details())


def test_a_down_shard_and_an_over_limit_total_give_one_of_their_errors(cluster, stub, fill):
    per_shard, data = fill
    over_without_1 = per_shard[0][:300] + per_shard[1][:5] + per_shard[2][:560]  # 0+2 > L
    over_before_2 = per_shard[0][:560] + per_shard[1][:560] + per_shard[2][:5]   # 0+1 > L
    try:
        cluster.shards[1].kill()
        for _ in range(6):
            exc = refused(stub, over_without_1)
            assert _down_or_over(exc, "s1"), (exc.code(), exc.details())
    finally:
        restart_shard(cluster, 1)
    try:
        cluster.shards[2].kill()
        for _ in range(6):
            exc = refused(stub, over_before_2)
            assert _down_or_over(exc, "s2"), (exc.code(), exc.details())
    finally:
        restart_shard(cluster, 2)
    with new_client(cluster) as c:
        keys = per_shard[0][:5] + per_shard[1][:5] + per_shard[2][:5]
        assert c.multi_get(keys) == [data[k] for k in keys]


# -- WriteBatcher ------------------------------------------------------------------------------
def wire(pending, sync=None) -> int:
    return pb.WriteRequest(mutations=[_mutation(m) for m in pending], sync=sync).ByteSize()


def test_write_batcher_counts_the_encoded_request_exactly(cluster, client):
    rng = random.Random(21)
    sizes = [0, 1, 2, 126, 127, 128, 129, 1000, 1024]
    key_sizes = [1, 2, 126, 127, 128, 129, 16382, 16383, 16384, 16385, 65535, 65536]
    model = {}
    sent = []
    max_bytes = 150_000
    b = client.batch(max_mutations=10_000, max_bytes=max_bytes)
    orig_flush = b.flush

    def observed_flush():  # record what each Write carries (the batcher itself is unchanged)
        if b.pending:
            sent.append(wire(b.pending))
            assert b.size == sent[-1]
            assert sent[-1] <= max_bytes or len(b.pending) == 1
        orig_flush()
    b.flush = observed_flush
    with b:
        for i in range(3000):
            r = rng.random()
            if r < 0.2:
                ks = rng.choice(key_sizes)
            else:
                ks = rng.randint(1, 40)
            key = (b"wb%d/" % i + rng.randbytes(ks))[:ks] if ks > 8 else b"w%d" % rng.randint(0, 999)
            if rng.random() < 0.2:
                b.delete(key)
                model[key] = None
            else:
                value = rng.randbytes(rng.choice(sizes) if rng.random() < 0.7
                                      else rng.randint(0, V))
                b.put(key, value)
                model[key] = value
            assert b.size == wire(b.pending)
    assert len(sent) > 5
    keys = sorted(model)
    assert client.multi_get(keys) == [model[k] for k in keys]


def fill_to_exactly(b, prefix: bytes, target: int) -> list[tuple[bytes, bytes]]:
    """Put into WriteBatcher ``b`` until its mutations encode to exactly ``target`` bytes
    (without it flushing); returns the pairs put."""
    full = wire([(prefix + b"%06d" % 0, b"x" * V)])
    put = []
    i = 0
    while target - b.size > 2 * full + 64:
        key = prefix + b"%06d" % i
        b.put(key, b"x" * V)
        put.append((key, b"x" * V))
        i += 1
    k1, k2 = prefix + b"last-1", prefix + b"last-2"
    by_size = {wire([(k2, b"z" * n)]): n for n in range(V + 1)}
    left = target - b.size
    for n1 in range(V, -1, -1):
        rest = left - wire([(k1, b"y" * n1)])
        if rest in by_size:
            for key, value in ((k1, b"y" * n1), (k2, b"z" * by_size[rest])):
                b.put(key, value)
                put.append((key, value))
            break
    assert b.size == wire(b.pending) == target
    return put


def test_write_batcher_at_exactly_the_message_limit_is_accepted(cluster, client):
    """max_bytes = the router's receive limit, sync unset: a batch of exactly that many
    encoded bytes is one Write, accepted."""
    b = client.batch(max_mutations=100_000, max_bytes=LIMIT)
    put = fill_to_exactly(b, b"lim/", LIMIT)
    b.flush()
    assert len(b.results) == N_SHARDS and all(r.applied for r in b.results)
    keys = [k for k, _ in put]
    assert client.multi_get(keys) == [v for _, v in put]


# Fixed in session 21 (was a strict xfail): the batcher counts the sync field.
def test_write_batcher_with_sync_stays_within_max_bytes(cluster, client):
    # Mutations that encode to exactly max_bytes (chosen with a batcher that sends nothing).
    put = fill_to_exactly(client.batch(max_mutations=100_000, max_bytes=LIMIT), b"syn/", LIMIT)
    b = client.batch(max_mutations=100_000, max_bytes=LIMIT, sync=True)
    try:
        with b:
            for key, value in put:
                b.put(key, value)
    except errors.ResourceExhaustedError as exc:
        pytest.fail(f"the batcher sent a {wire(put, True)}-byte Write with max_bytes={LIMIT}: "
                    f"{exc}")
    keys = [k for k, _ in put]
    assert client.multi_get(keys) == [v for _, v in put]


# -- engine/vfs.py: a closed WritableFile ----------------------------------------------------
# (append and sync after close raise EBADF, close is idempotent, write-back advice is silent:
# tests/test_faultfs.py, test_a_closed_writable_file_never_reaches_the_file_that_reuses_...)


# Fixed in session 21 (was a strict xfail): a closed file's sync reaches no fault.
def test_faultfs_sync_of_a_closed_file_garbles_nothing(tmp_path):
    fs = FaultInjectionFS(seed=4)
    path = str(tmp_path / "t")
    f = fs.open_writable(path)
    f.append(b"0123456789")
    f.close()
    fs.garble_on_sync(lambda p: p == path)
    with pytest.raises(StorageIOError):
        f.sync()
    with open(path, "rb") as fh:
        assert fh.read() == b"0123456789"
    assert fs.garbled == []


def test_engine_writers_closed_by_switches_flushes_and_close_are_not_used_again(tmp_path):
    """Memtable switches (tiny write buffer), flushes, compactions, manifest switches and
    close/reopen: no EBADF reaches the DB, nothing is lost."""
    path = str(tmp_path / "db")
    model = {}
    rng = random.Random(5)
    for round_ in range(3):
        db = open_test_db(path, memtable_bytes=16 * 1024)
        try:
            for i in range(1500):
                k = b"k%04d" % rng.randint(0, 999)
                if rng.random() < 0.1:
                    db.delete(k, sync=rng.random() < 0.05)
                    model.pop(k, None)
                else:
                    v = rng.randbytes(rng.randint(0, 200))
                    db.put(k, v, sync=rng.random() < 0.05)
                    model[k] = v
            db.flush()
            if round_ == 1:
                db.compact()
            assert db.counters.log_errors == 0
            for k in (b"k%04d" % i for i in range(1000)):
                assert db.get(k) == model.get(k)
        finally:
            db.close()
    db = open_test_db(path)
    try:
        assert dict(db.scan()) == model
    finally:
        db.close()
