"""Where a call's CPU goes outside gRPC: each hop's own code timed in-process (no network).

    python3 bench/grpc_hops.py [--keys 50000]

Times, per call, with the real engine.DB holding ``--keys`` flushed keys of 100 bytes:
the engine alone; the shard's guarded handler (validation, engine, response); the router's
guarded handler with the shard call replaced by a function returning the request's answer
(validation, slot hashing, grouping, deadline, merge); the client library's wrapper with the
RPC replaced likewise; protobuf encode/decode of the messages. Run by bench/grpc_bench.py at
the end so that its numbers can be read against the per-call totals it measures. Each figure
is the best of three short runs (the least disturbed by other load on the machine).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _Context:
    def time_remaining(self):
        return 9.2e18  # what gRPC reports when the client set no deadline


def _time(fn, seconds: float = 0.15, repeats: int = 3) -> float:
    """Best of ``repeats`` runs of ``seconds`` (the least disturbed by other load), us per call."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            fn()
            n += 1
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def hop_costs(nkeys: int = 50000) -> list[tuple[str, float, float]]:
    """[(part, us per Get, us per MultiGet-100)]."""
    from engine import DB
    from router.client import Client
    from router.cluster_map import ClusterMap
    from router.kv_servicer import RouterKV
    from router.shards import ShardClient
    from shard.limits import Limits
    from shard.serving import KV_SERVICE
    from shard.servicer import KVServicer
    from shard.status import Guard
    from sievekv_proto import sievekv_pb2 as pb

    root = tempfile.mkdtemp(prefix="sievekv-hops-")
    db = DB.open(os.path.join(root, "db"))
    try:
        rng = random.Random(1)
        for i in range(0, nkeys, 5000):
            db.write([(b"key%08d" % j, rng.randbytes(100)) for j in range(i, min(i + 5000, nkeys))])
        db.flush()
        keys = [b"key%08d" % rng.randrange(nkeys) for _ in range(100)]
        get_req = pb.GetRequest(key=keys[0])
        mget_req = pb.MultiGetRequest(keys=keys)
        ctx = _Context()
        shard = Guard("shard").wrap(KVServicer(db, Limits(), "s0"), KV_SERVICE)
        get_resp = shard.Get(get_req, ctx)
        mget_resp = shard.MultiGet(mget_req, ctx)

        class Answer:  # stands in for the shard stub: returns the shard's answer at once
            def Get(self, request, timeout=None):
                return get_resp

            def MultiGet(self, request, timeout=None):
                return mget_resp

        cmap = ClusterMap.even([("s0", "127.0.0.1:1")])
        conn = ShardClient(cmap.shards[0], Limits())  # the real one (call slots included),
        conn.kv = Answer()  # its stub answered at once; its channel never connects
        router = Guard("router").wrap(RouterKV(cmap, [conn], Limits(), 10.0), KV_SERVICE)
        client = Client("127.0.0.1:1")
        client._kv = Answer()
        rows = [
            ("engine (db.get / db.multi_get)", _time(lambda: db.get(keys[0])), _time(lambda: db.multi_get(keys))),
            ("shard handler, engine included", _time(lambda: shard.Get(get_req, ctx)),
             _time(lambda: shard.MultiGet(mget_req, ctx))),
            ("router handler, no RPC", _time(lambda: router.Get(get_req, ctx)),
             _time(lambda: router.MultiGet(mget_req, ctx))),
            ("client library, no RPC", _time(lambda: client.get(keys[0])), _time(lambda: client.multi_get(keys))),
            ("protobuf: request+response encode+decode",
             _time(lambda: (pb.GetRequest.FromString(get_req.SerializeToString()),
                            pb.GetResponse.FromString(get_resp.SerializeToString()))),
             _time(lambda: (pb.MultiGetRequest.FromString(mget_req.SerializeToString()),
                            pb.MultiGetResponse.FromString(mget_resp.SerializeToString())))),
        ]
        client.close()
        conn.close()
        return rows
    finally:
        db.close()
        shutil.rmtree(root, ignore_errors=True)


def print_hop_costs(nkeys: int) -> None:
    print("where sievekv's own code spends a call (in-process, no network, us per call)")
    print(f"{'part':<44}{'Get':>10}{'MultiGet-100':>14}")
    for part, get_us, mget_us in hop_costs(nkeys):
        print(f"{part:<44}{get_us:>10.1f}{mget_us:>14.1f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=50000)
    print_hop_costs(p.parse_args().keys)
