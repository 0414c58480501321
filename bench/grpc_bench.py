"""gRPC service benchmark: client -> router -> shard, beside the gRPC floor and RocksDB.

    python3 bench/grpc_bench.py [--seconds 0.5] [--rounds 10] [--keys 50000] [--clients 4]

Measured in one run, every process on 127.0.0.1, each number the median of ``--rounds``
interleaved runs of ``--seconds`` (the targets are interleaved so that background load on the
shared machine hits them alike):

- unary Get and Put calls/s and MultiGet (100 keys) keys/s with one client process, through
  1. the **echo floor**: bench/echo_server.py as router and as shard (same two hops, same
     server settings, no validation, no storage): what gRPC + protobuf cost here;
  2. **sievekv**: ``python -m router`` in front of ``python -m shard`` (engine.DB, compression
     "none"), called through the client library ``router.client.Client``;
  3. **RocksDB**: the same router in front of the same shard server serving rocksdict
     (bench/rocks_shard.py, compression off), through the same client library;
- hop isolation (Get, raw stubs): our router in front of the echo shard against the floor,
  and our shard server (with RocksDB, with engine.DB) alone against the echo shard alone;
- CPU time per call of client + router + shard together;
- Get calls/s with ``--clients`` client processes against 1 and 2 router processes
  (SO_REUSEPORT), for the echo floor and for sievekv;
- MultiGet keys/s when the router splits each batch over 4 shards (informational);
- bench/grpc_hops.py: each hop's own code timed in-process (where the CPU goes).

Targets: sievekv >= 0.9x the floor for Get/Put, >= 0.7x for MultiGet-100, >= 0.9x RocksDB.
Every process started here is stopped at the end (also on error or Ctrl-C).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "bench"))

from bench_deps import require  # noqa: E402

VALUE_BYTES = 100
MULTIGET_KEYS = 100


# ---------------------------------------------------------------------------------------------
# client worker processes (spawned before any gRPC object exists in this process)

def _client_worker(commands, results):
    import grpc

    from router.client import Client
    from sievekv_proto import sievekv_pb2 as pb
    from sievekv_proto import sievekv_pb2_grpc as pbg

    clients: dict = {}
    rng = random.Random(os.getpid())
    value = b"p" * VALUE_BYTES
    while True:
        cmd = commands.get()
        if cmd is None:
            break
        address, mode, op, seconds, start_at, nkeys, fresh = cmd
        warmup = 5
        if fresh and (address, mode) in clients:  # a new connection: SO_REUSEPORT picks anew
            clients.pop((address, mode))[1]()
        if (address, mode) not in clients:
            warmup = 50
            if mode == "raw":
                channel = grpc.insecure_channel(address)
                clients[(address, mode)] = (pbg.KVStub(channel), channel.close)
            else:
                client = Client(address, retries=0)
                clients[(address, mode)] = (client, client.close)
        c = clients[(address, mode)][0]
        keys = [b"key%08d" % rng.randrange(nkeys) for _ in range(4096)]
        batches = [keys[i:i + MULTIGET_KEYS] for i in range(0, 4096, MULTIGET_KEYS)][:40]
        if mode == "raw":
            get = lambda k: c.Get(pb.GetRequest(key=k), timeout=10)  # noqa: E731
            put = lambda k, v: c.Put(pb.PutRequest(key=k, value=v), timeout=10)  # noqa: E731
            mget = lambda ks: c.MultiGet(pb.MultiGetRequest(keys=ks), timeout=10)  # noqa: E731
        else:
            get, put, mget = c.get, c.put, c.multi_get
        prefix = b"put-%d-" % os.getpid()
        n = 0
        absent = [0]  # keys answered as absent: every key asked for was preloaded

        def one(i):
            if op == "get":
                r = get(keys[i & 4095])
                if r is None or (mode == "raw" and not r.found):
                    absent[0] += 1
                return 1
            if op == "put":
                put(prefix + b"%d" % i, value)
                return 1
            r = mget(batches[i % len(batches)])
            if mode == "raw":
                absent[0] += len(r.found) - sum(r.found)
            else:
                absent[0] += r.count(None)
            return MULTIGET_KEYS

        for i in range(warmup):  # warm the channel and the code paths
            one(i)
        absent[0] = 0
        while time.time() < start_at:
            time.sleep(0.001)
        t0 = time.perf_counter()
        c0 = time.process_time()
        end = t0 + seconds
        i = 0
        while time.perf_counter() < end:
            n += one(i)
            i += 1
        results.put((n / (time.perf_counter() - t0), i, time.process_time() - c0, absent[0]))


def _cpu(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


class Clients:
    def __init__(self, count: int):
        ctx = multiprocessing.get_context("spawn")
        self.results = ctx.Queue()
        self.queues = [ctx.Queue() for _ in range(count)]
        self.procs = [ctx.Process(target=_client_worker, args=(q, self.results), daemon=True)
                      for q in self.queues]
        for p in self.procs:
            p.start()

    def run(self, address: str, mode: str, op: str, seconds: float, nkeys: int, count: int = 1,
            server_pids: tuple[int, ...] = (), fresh: bool = False,
            split: list | None = None) -> tuple[float, float]:
        """(total rate, CPU seconds per call of clients + ``server_pids``) of ``count`` client
        processes running ``op`` for ``seconds``; ``fresh``: each client opens a new channel.
        ``split``: a list to which [clients, *server_pids] CPU seconds per call are appended."""
        start_at = time.time() + (0.3 + 0.1 * count if count > 1 else 0.0)
        for q in self.queues[:count]:
            q.put((address, mode, op, seconds, start_at, nkeys, fresh))
        before = [_cpu(pid) for pid in server_pids]
        got = [self.results.get(timeout=seconds + 120) for _ in range(count)]
        servers = [_cpu(pid) - b for pid, b in zip(server_pids, before)]
        absent = sum(g[3] for g in got)
        if absent:
            raise RuntimeError(f"{op} at {address}: {absent} preloaded keys answered as absent "
                               "(a wrong answer must not count as a call served)")
        calls = max(sum(g[1] for g in got), 1)
        client_cpu = sum(g[2] for g in got)
        if split is not None:
            split.append([client_cpu / calls, *(c / calls for c in servers)])
        return sum(g[0] for g in got), (sum(servers) + client_cpu) / calls

    def stop(self) -> None:
        for q in self.queues:
            q.put(None)
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.kill()


# ---------------------------------------------------------------------------------------------
# server processes

class Servers:
    def __init__(self, root: str):
        self.root = root
        self.procs: list[subprocess.Popen] = []
        self.pids: dict[str, int] = {}

    def start(self, name: str, argv: list[str]) -> int:
        port_file = os.path.join(self.root, f"{name}.port")
        log = open(os.path.join(self.root, f"{name}.log"), "ab")
        p = subprocess.Popen([*argv, "--port-file", port_file], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.procs.append(p)
        self.pids[name] = p.pid
        deadline = time.monotonic() + 60
        while not os.path.exists(port_file):
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start; see {self.root}/{name}.log")
            time.sleep(0.02)
        with open(port_file) as f:
            return int(f.read())

    def shard(self, name: str, rocks: bool = False) -> str:
        # engine.DB with compression "none" (its default is lz4), as RocksDB's is set off in
        # bench/rocks_backend.py: no compression anywhere, like for like (as in db_bench)
        exe = ([os.path.join(REPO, "bench", "rocks_shard.py")] if rocks
               else ["-m", "shard", "--engine-option", 'compression="none"'])
        port = self.start(name, [sys.executable, *exe, "--data-dir", os.path.join(self.root, name),
                                 "--name", name, "--log-level", "WARNING"])
        return f"127.0.0.1:{port}"

    def router(self, name: str, shards: list[tuple[str, str]], processes: int = 1) -> str:
        from router.cluster_map import ClusterMap

        map_path = os.path.join(self.root, f"{name}.toml")
        with open(map_path, "w") as f:
            f.write(ClusterMap.even(shards).to_toml())
        port = self.start(name, [sys.executable, "-m", "router", "--cluster-map", map_path,
                                 "--processes", str(processes), "--log-level", "WARNING"])
        return f"127.0.0.1:{port}"

    def echo(self, name: str, forward: str | None = None, port: int = 0, reuse_port: bool = False) -> str:
        argv = [sys.executable, os.path.join(REPO, "bench", "echo_server.py"), "--listen", f"127.0.0.1:{port}"]
        if forward:
            argv += ["--forward", forward]
        if reuse_port:
            argv.append("--reuse-port")
        return f"127.0.0.1:{self.start(name, argv)}"

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            p.wait()


def preload(address: str, nkeys: int) -> None:
    from router.client import Client

    rng = random.Random(1)
    with Client(address, timeout=120) as c:
        with c.batch(max_mutations=2000) as b:
            for i in range(nkeys):
                b.put(b"key%08d" % i, rng.randbytes(VALUE_BYTES))
        c.flush()  # reads then come from tables (and the block cache), not the memtable


# ---------------------------------------------------------------------------------------------

def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=0.5, help="length of one measurement")
    p.add_argument("--rounds", type=int, default=10, help="interleaved repetitions (median reported)")
    p.add_argument("--keys", type=int, default=50000, help="keys preloaded into sievekv and RocksDB")
    p.add_argument("--clients", type=int, default=4, help="client processes for the router-count runs")
    args = p.parse_args()
    require(["rocksdict"], "grpc_bench")  # RocksDB behind the same hops (bench/rocks_shard.py)

    t_start = time.monotonic()
    clients = Clients(max(args.clients, 1))  # spawned first: no gRPC object exists yet
    root = tempfile.mkdtemp(prefix="sievekv-grpc-bench-")
    servers = Servers(root)
    try:
        echo_shard = servers.echo("echo-shard")
        echo = servers.echo("echo-router", forward=echo_shard)
        s0 = servers.shard("s0")
        sievekv = servers.router("router", [("s0", s0)])
        r0 = servers.shard("rocks0", rocks=True)
        rocks = servers.router("rocks-router", [("rocks0", r0)])
        preload(sievekv, args.keys)
        preload(rocks, args.keys)

        pids = servers.pids
        targets = [("floor", echo, "raw", (pids["echo-router"], pids["echo-shard"])),
                   ("sievekv", sievekv, "client", (pids["router"], pids["s0"])),
                   ("rocksdb", rocks, "client", (pids["rocks-router"], pids["rocks0"]))]
        ops = ["get", "put", "mget"]
        rates = {(t[0], op): [] for t in targets for op in ops}
        cpus = {(t[0], op): [] for t in targets for op in ops}
        splits = {(t[0], op): [] for t in targets for op in ops}  # [client, router, shard]
        for rnd in range(args.rounds):
            for op in ops:
                # a new first target each round: who runs first (cold caches, the machine's
                # load at the start of a round) is not always the floor
                for name, address, mode, server_pids in _rotated(targets, rnd):
                    rate, cpu = clients.run(address, mode, op, args.seconds, args.keys,
                                            server_pids=server_pids, split=splits[(name, op)])
                    rates[(name, op)].append(rate)
                    cpus[(name, op)].append(cpu)
        med = {k: statistics.median(v) for k, v in rates.items()}
        med_cpu = {k: statistics.median(v) for k, v in cpus.items()}
        med_split = {k: [statistics.median(col) for col in zip(*v)] for k, v in splits.items()}

        # hop isolation: our router in front of the echo shard; each shard server alone (one hop)
        router_echo = servers.router("router-echo", [("echo", echo_shard)])
        iso_targets = [("floor", echo), ("router", router_echo), ("echo shard", echo_shard),
                       ("rocks shard", r0), ("engine shard", s0)]
        iso = {name: [] for name, _ in iso_targets}
        for rnd in range(args.rounds):
            for name, address in _rotated(iso_targets, rnd):
                iso[name].append(clients.run(address, "raw", "get", args.seconds, args.keys)[0])

        # router processes: several clients against 1 and 2 routers
        echo2_port = _free_port()
        servers.echo("echo-router2-a", forward=echo_shard, port=echo2_port, reuse_port=True)
        echo2 = servers.echo("echo-router2-b", forward=echo_shard, port=echo2_port, reuse_port=True)
        sievekv2 = servers.router("router2", [("s0", s0)], processes=2)
        import psutil

        router_procs = {
            "floor, 2 routers": [psutil.Process(pids["echo-router2-a"]), psutil.Process(pids["echo-router2-b"])],
            "sievekv, 2 routers": [c for c in psutil.Process(pids["router2"]).children()
                                   if "spawn_main" in " ".join(c.cmdline())]}
        scale, spreads = {}, {}
        psutil.cpu_percent()
        for rnd in range(max(1, args.rounds // 2)):
            for name, address, mode in _rotated([("floor, 1 router", echo, "raw"),
                                                 ("floor, 2 routers", echo2, "raw"),
                                                 ("sievekv, 1 router", sievekv, "client"),
                                                 ("sievekv, 2 routers", sievekv2, "client")], rnd):
                scale.setdefault(name, []).append(clients.run(
                    address, mode, "get", 2 * args.seconds, args.keys, count=args.clients, fresh=True)[0])
                if name in router_procs:  # the connections of this run are still open
                    port = int(address.rsplit(":", 1)[1])
                    spreads.setdefault(name, []).append("+".join(
                        str(sum(1 for c in p.net_connections() if c.status == "ESTABLISHED" and c.laddr.port == port))
                        for p in router_procs[name]))
        machine_busy = psutil.cpu_percent()

        # fan-out: MultiGet split over 4 shards
        fan_shards = [("s0", s0)] + [(f"f{i}", servers.shard(f"f{i}")) for i in range(1, 4)]
        fan = servers.router("router-fanout", fan_shards)
        preload(fan, args.keys)
        fan_rate = statistics.median(clients.run(fan, "client", "mget", args.seconds, args.keys)[0]
                                     for _ in range(args.rounds))
    finally:
        clients.stop()
        servers.stop()
        shutil.rmtree(root, ignore_errors=True)

    print(f"sievekv gRPC benchmark: client -> router -> shard on 127.0.0.1, {os.cpu_count()} CPUs; "
          f"{args.keys} keys of {VALUE_BYTES} B preloaded and flushed; median of {args.rounds} interleaved "
          f"runs of {args.seconds:g} s")
    print()
    print("one client process, one shard behind one router process; rates are medians, ratios are")
    print("medians of the per-round ratios (each round runs the three targets back to back, a different")
    print("one first each round), [min-max]; every Get/MultiGet answer checked found")
    print(f"{'operation':<22}{'echo floor':>11}{'sievekv':>10}{'RocksDB':>10}{'vs floor':>20}{'target':>7}"
          f"{'vs RocksDB':>20}{'target':>7}")
    rows = [("get", "Get calls/s", 0.9), ("put", "Put calls/s", 0.9), ("mget", "MultiGet-100 keys/s", 0.7)]
    for op, label, floor_target in rows:
        f, s, r = med[("floor", op)], med[("sievekv", op)], med[("rocksdb", op)]
        vs_floor = [a / b for a, b in zip(rates[("sievekv", op)], rates[("floor", op)])]
        vs_rocks = [a / b for a, b in zip(rates[("sievekv", op)], rates[("rocksdb", op)])]
        print(f"{label:<22}{f:>11,.0f}{s:>10,.0f}{r:>10,.0f}{_ratio(vs_floor):>20}{'>=' + str(floor_target):>7}"
              f"{_ratio(vs_rocks):>20}{'>=0.9':>7}")
    print()
    pair = lambda a, b: _ratio([x / y for x, y in zip(iso[a], iso[b])])  # noqa: E731
    print("hop isolation, Get calls/s with raw gRPC stubs (paired ratios as above)")
    print(f"  our router in front of the echo shard vs the echo floor (2 hops):     {pair('router', 'floor')}")
    print(f"  our shard server + RocksDB vs the echo shard (1 hop):                 {pair('rocks shard', 'echo shard')}")
    print(f"  our shard server + engine.DB vs the echo shard (1 hop):               {pair('engine shard', 'echo shard')}")
    print()
    print("CPU time per call, client + router + shard processes together (less sensitive to other load)")
    print(f"{'operation':<24}{'echo floor':>12}{'sievekv':>12}{'RocksDB':>12}{'sievekv - floor':>17}")
    for op, label, _ in rows:
        f, s, r = (med_cpu[(t, op)] * 1e6 for t in ("floor", "sievekv", "rocksdb"))
        print(f"{label.split()[0] + ' us/call':<24}{f:>12,.0f}{s:>12,.0f}{r:>12,.0f}{s - f:>17,.0f}")
    print("  the same, per process: client / router / shard (medians of the rounds)")
    for op, label, _ in rows:
        parts = "   ".join(f"{t} " + " / ".join(f"{c * 1e6:,.0f}" for c in med_split[(t, op)])
                           for t in ("floor", "sievekv", "rocksdb"))
        print(f"  {label.split()[0]:<14}{parts}")
    print()
    print(f"{args.clients} client processes, Get calls/s (median of {max(1, args.rounds // 2)} runs of "
          f"{2 * args.seconds:g} s; each run opens new connections, which SO_REUSEPORT spreads by hash,")
    print("so a run with 2 routers may still put most clients on one of them)")
    med_scale = {k: statistics.median(v) for k, v in scale.items()}
    for name, rate in med_scale.items():
        spread = f"   client connections per router process, by run: {' '.join(spreads[name])}" if name in spreads else ""
        print(f"  {name:<22}{rate:>10,.0f}{spread}")
    print(f"  machine CPU busy during these runs (all processes, ours and others'): {machine_busy:.0f}%")
    paired = lambda a, b: _ratio([x / y for x, y in zip(scale[a], scale[b])])  # noqa: E731
    print(f"  sievekv / floor, 1 router: {paired('sievekv, 1 router', 'floor, 1 router')}; "
          f"2 routers: {paired('sievekv, 2 routers', 'floor, 2 routers')}")
    print(f"  2 routers / 1 router: sievekv {paired('sievekv, 2 routers', 'sievekv, 1 router')}; "
          f"floor {paired('floor, 2 routers', 'floor, 1 router')}")
    print()
    print(f"MultiGet-100 split over 4 shards by one router: {fan_rate:,.0f} keys/s "
          f"({fan_rate / med[('sievekv', 'mget')]:.2f}x the one-shard figure)")
    print()
    from grpc_hops import print_hop_costs

    print_hop_costs(args.keys)
    print(f"total run time {time.monotonic() - t_start:.0f} s; all processes stopped")
    return 0


def _rotated(items: list, k: int) -> list:
    k %= len(items)
    return items[k:] + items[:k]


def _ratio(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x [{min(values):.2f}-{max(values):.2f}]"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())
