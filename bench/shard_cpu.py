"""What one shard process spends per MultiGet, by backend: where the MultiGet gap comes from.

    python3 bench/shard_cpu.py [--rounds 16] [--seconds 0.5] [--keys 50000] [--batch 100]

One hop only (a raw gRPC stub straight at the shard, no router), one client process, the same
requests to every target, interleaved in rounds (the order alternates each round) so that the
machine's changing load hits them alike. Targets:

  echo    bench/echo_server.py: gRPC + protobuf, a fixed answer (the floor)
  dict    our shard server (shard.worker) over a plain dict: validation, guard, response
  rocks   our shard server over RocksDB (bench/rocks_shard.py)
  engine  our shard server over engine.DB (``python -m shard``)

Printed per target: calls/s and the shard process's CPU time per call (user + system, from
psutil), medians over the rounds, and the CPU above the dict shard: what the storage engine
costs inside a serving process. Also the engine's own ``multi_get`` of the same requests timed
in a loop in this process, for comparison with what it costs inside the shard.
Every process started here is stopped at the end.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "bench"))

VALUE_BYTES = 100


class DictBackend:
    """engine.DB's API over a dict (no storage): what the shard server costs by itself."""

    def __init__(self):
        self.d: dict = {}

    @classmethod
    def open(cls, path, **_options):
        return cls()

    def put(self, key, value, sync=None, timeout=None):  # timeout: not bounded here
        self.d[key] = value

    def get(self, key):
        return self.d.get(key)

    def delete(self, key, sync=None, timeout=None):
        self.d.pop(key, None)

    def write(self, batch, sync=None, timeout=None):
        for k, v in batch:
            if v is None:
                self.d.pop(k, None)
            else:
                self.d[k] = v

    def multi_get(self, keys, max_bytes=None):
        get = self.d.get
        return [get(k) for k in keys]

    def scan(self, start=None, end=None, limit=None):
        return iter(sorted(self.d.items())[:limit])

    def flush(self):
        pass

    def compact(self):
        pass

    def stats(self):
        return {}

    def filter_report(self):
        return {}

    def close(self):
        pass


def _requests(nkeys: int, batch: int) -> list[list[bytes]]:
    rng = random.Random(1)
    return [[b"key%08d" % rng.randrange(nkeys) for _ in range(batch)] for _ in range(256)]


def _client(addresses, nkeys, batch, go, results):
    import grpc

    from sievekv_proto import sievekv_pb2 as pb
    from sievekv_proto import sievekv_pb2_grpc as pbg

    stubs = [pbg.KVStub(grpc.insecure_channel(a)) for a in addresses]
    reqs = [pb.MultiGetRequest(keys=ks) for ks in _requests(nkeys, batch)]
    for stub in stubs:  # warm: connections, every block the requests touch
        for r in reqs:
            stub.MultiGet(r, timeout=30)
    results.put("ready")
    while True:
        cmd = go.get()
        if cmd is None:
            return
        i, seconds = cmd
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            stubs[i].MultiGet(reqs[n % len(reqs)], timeout=30)
            n += 1
        results.put((n, time.perf_counter() - t0))


def _preload(address: str, nkeys: int) -> None:
    from router.client import Client

    rng = random.Random(1)
    with Client(address, timeout=120) as c:
        with c.batch(max_mutations=2000) as b:
            for i in range(nkeys):
                b.put(b"key%08d" % i, rng.randbytes(VALUE_BYTES))
        c.flush()


def _engine_loop(path: str, nkeys: int, batch: int, seconds: float = 2.0) -> float:
    """us per engine multi_get of the same requests, in a loop in this process (best of 3)."""
    import engine

    reqs = _requests(nkeys, batch)
    best = float("inf")
    with engine.DB.open(path) as db:
        for r in reqs:
            db.multi_get(r)
        for _ in range(3):
            n, t0 = 0, time.process_time()
            while time.process_time() - t0 < seconds / 3:
                db.multi_get(reqs[n % len(reqs)])
                n += 1
            best = min(best, (time.process_time() - t0) / n * 1e6)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=0.5)
    ap.add_argument("--keys", type=int, default=50000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--serve-dict", action="store_true", help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args()
    if args.serve_dict:  # child: our shard server over DictBackend
        from shard.worker import main as shard_main

        sys.argv = [sys.argv[0], *rest]
        return shard_main(open_backend=DictBackend.open, prog="bench/shard_cpu.py")

    import psutil

    root = tempfile.mkdtemp(prefix="sievekv-shardcpu-")
    py = sys.executable
    targets = [
        ("echo", [py, os.path.join(REPO, "bench", "echo_server.py"), "--listen", "127.0.0.1:0"]),
        ("dict", [py, os.path.abspath(__file__), "--serve-dict"]),
        ("rocks", [py, os.path.join(REPO, "bench", "rocks_shard.py")]),
        ("engine", [py, "-m", "shard"]),
    ]
    procs, addresses = [], []
    ctx = multiprocessing.get_context("spawn")
    client = None
    try:
        for name, argv in targets:
            port_file = os.path.join(root, f"{name}.port")
            if name != "echo":
                argv = [*argv, "--data-dir", os.path.join(root, name), "--listen", "127.0.0.1:0",
                        "--log-level", "WARNING"]
            p = subprocess.Popen([*argv, "--port-file", port_file], cwd=REPO,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
            procs.append(p)
            deadline = time.monotonic() + 60
            while not (os.path.exists(port_file) and open(port_file).read().strip()):
                if p.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"{name} did not start")
                time.sleep(0.02)
            addresses.append(f"127.0.0.1:{open(port_file).read().strip()}")
        for name, address in zip([t[0] for t in targets], addresses):
            if name != "echo":
                pre = ctx.Process(target=_preload, args=(address, args.keys))
                pre.start()
                pre.join()
        go, results = ctx.Queue(), ctx.Queue()
        client = ctx.Process(target=_client, args=(addresses, args.keys, args.batch, go, results))
        client.start()
        if results.get(timeout=300) != "ready":
            raise SystemExit("client failed")
        ps = [psutil.Process(p.pid) for p in procs]
        per: dict[int, list] = {i: [] for i in range(len(targets))}
        for r in range(args.rounds):
            order = list(range(len(targets)))
            if r % 2:
                order.reverse()
            for i in order:
                t0 = ps[i].cpu_times()
                go.put((i, args.seconds))
                n, wall = results.get(timeout=120)
                t1 = ps[i].cpu_times()
                cpu = (t1.user - t0.user) + (t1.system - t0.system)
                per[i].append((n / wall, cpu / n * 1e6))
        go.put(None)
        client.join(30)
        # The engine's own directory, read in a loop here once its shard has stopped.
        engine_index = [t[0] for t in targets].index("engine")
        procs[engine_index].send_signal(signal.SIGTERM)
        procs[engine_index].wait(30)
        loop_us = _engine_loop(os.path.join(root, "engine"), args.keys, args.batch)

        print(f"MultiGet-{args.batch} straight at one shard process (1 hop, 1 client), "
              f"{args.keys:,} keys of {VALUE_BYTES} B; medians of {args.rounds} interleaved "
              f"rounds of {args.seconds} s; {os.cpu_count()} CPUs, load average "
              f"{os.getloadavg()[0]:.1f}")
        print(f"{'target':10}{'calls/s':>10}{'shard CPU us/call':>20}{'above dict':>12}")
        cpu_med = {i: statistics.median(c for _, c in per[i]) for i in per}
        dict_cpu = cpu_med[1]
        for i, (name, _) in enumerate(targets):
            rate = statistics.median(r for r, _ in per[i])
            above = "" if name in ("echo", "dict") else f"{cpu_med[i] - dict_cpu:+,.0f}"
            print(f"{name:10}{rate:10,.0f}{cpu_med[i]:20,.0f}{above:>12}")
        print(f"engine.DB.multi_get of the same requests in a loop in one process: {loop_us:,.0f} "
              f"us per call (best of 3); inside the shard the engine costs "
              f"{cpu_med[engine_index] - dict_cpu:,.0f} us above the dict shard")
    finally:
        if client is not None and client.is_alive():
            client.kill()
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
