"""What TLS costs on the data path: client -> router -> shard, plaintext vs TLS vs mTLS.

    python3 bench/tls_overhead.py [--seconds 1.0] [--rounds 7] [--keys 20000]

Three copies of the same setup run side by side on 127.0.0.1, each one ``python -m shard``
(engine.DB, ``--keys`` keys of 100 B preloaded and flushed) behind one ``python -m router``:

- **plaintext**: no TLS anywhere (the baseline);
- **TLS**: the shard and the router serve TLS, the router verifies the shard with the CA,
  the client verifies the router;
- **mTLS**: the same, and both servers require client certificates (the router presents
  one to the shard, the client to the router).

One client process (this one, ``router.client.Client``, one channel per setup, connected and
warmed before measuring) runs unary Get calls/s and MultiGet of 100 keys keys/s against each
setup for ``--seconds``, the setups interleaved in a new random order each round so that
background load on the shared machine hits them alike. Printed: the median of ``--rounds``
rounds per setup and op, and each setup's ratio to plaintext (the median of the per-round
ratios, and their range), and the CPU time per call of the client, the router and the shard
together (psutil), which a loaded machine disturbs less than the rates. TLS is set up once
per connection: with long-lived channels, what is measured is the
per-message cost (encryption, framing), not handshakes. Certificates are made at start
(tests/tls_certs.py, EC P-256). Every process started here is stopped at the end (also on
error or Ctrl-C).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "bench"))

from grpc_bench import MULTIGET_KEYS, VALUE_BYTES, Servers  # noqa: E402

SETUPS = ("plaintext", "TLS", "mTLS")


def start(servers: Servers, root: str, pki) -> dict[str, tuple[str, dict]]:
    """{setup: (router address, Client TLS keyword arguments)}."""
    from router.cluster_map import ClusterMap

    out = {}
    for setup in SETUPS:
        serve, to_shard, client = [], [], {}
        if setup != "plaintext":
            serve = ["--tls-cert", pki.node_cert, "--tls-key", pki.node_key]
            to_shard = ["--shard-tls-ca", pki.ca]
            client = {"tls_ca": pki.ca}
        if setup == "mTLS":
            serve += ["--tls-client-ca", pki.ca]
            to_shard += ["--shard-tls-cert", pki.node_cert, "--shard-tls-key", pki.node_key]
            client.update(tls_cert=pki.client_cert, tls_key=pki.client_key)
        shard = f"shard-{setup}"
        port = servers.start(shard, [sys.executable, "-m", "shard", "--data-dir",
                                     os.path.join(root, shard), "--name", shard,
                                     "--log-level", "WARNING", *serve])
        map_path = os.path.join(root, f"{setup}.toml")
        with open(map_path, "w") as f:
            f.write(ClusterMap.even([(shard, f"127.0.0.1:{port}")]).to_toml())
        port = servers.start(f"router-{setup}", [
            sys.executable, "-m", "router", "--cluster-map", map_path, "--log-level", "WARNING",
            *serve, *to_shard])
        out[setup] = (f"127.0.0.1:{port}", client)
    return out


def _cpu(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def measure(client, op: str, seconds: float, keys: list[bytes],
            pids: tuple[int, ...]) -> tuple[float, float]:
    """(calls/s (get) or keys/s (mget), CPU microseconds per call of this process and
    ``pids`` together) of ``op`` for ``seconds``."""
    batches = [keys[i:i + MULTIGET_KEYS] for i in range(0, len(keys), MULTIGET_KEYS)]
    n = i = 0
    cpu0 = time.process_time() + sum(_cpu(p) for p in pids)
    t0 = time.perf_counter()
    end = t0 + seconds
    while time.perf_counter() < end:
        if op == "get":
            client.get(keys[i % len(keys)])
            n += 1
        else:
            client.multi_get(batches[i % len(batches)])
            n += MULTIGET_KEYS
        i += 1
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() + sum(_cpu(p) for p in pids) - cpu0
    return n / elapsed, cpu / max(i, 1) * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=1.0, help="length of one measurement")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--keys", type=int, default=20000, help="keys preloaded into each shard")
    args = p.parse_args()

    from router.client import Client
    from tests.tls_certs import make_pki

    root = tempfile.mkdtemp(prefix="tls-overhead-")
    servers = Servers(root)
    clients: dict[str, Client] = {}
    load_before = os.getloadavg()
    try:
        pki = make_pki(os.path.join(root, "pki"))
        setups = start(servers, root, pki)
        for setup, (address, tls) in setups.items():
            preload(address, tls, args.keys)
            clients[setup] = Client(address, retries=0, timeout=30, **tls)
        rng = random.Random(7)
        keys = [b"key%08d" % rng.randrange(args.keys) for _ in range(4000)]
        for c in clients.values():  # connect (handshake) and warm the code paths
            for k in keys[:200]:
                c.get(k)
            c.multi_get(keys[:MULTIGET_KEYS])
        rates = {(s, op): [] for s in SETUPS for op in ("get", "mget")}
        cpus = {(s, op): [] for s in SETUPS for op in ("get", "mget")}
        pids = {s: (servers.pids[f"shard-{s}"], servers.pids[f"router-{s}"]) for s in SETUPS}
        for r in range(args.rounds):
            order = list(SETUPS)
            rng.shuffle(order)
            for op in ("get", "mget"):
                for setup in order:
                    rate, cpu = measure(clients[setup], op, args.seconds, keys, pids[setup])
                    rates[(setup, op)].append(rate)
                    cpus[(setup, op)].append(cpu)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    finally:
        for c in clients.values():
            c.close()
        servers.stop()
        shutil.rmtree(root, ignore_errors=True)
    load_after = os.getloadavg()

    print(f"client -> router -> shard on 127.0.0.1, one client process; {args.keys} keys of "
          f"100 B per shard, flushed; median of {args.rounds} interleaved rounds of "
          f"{args.seconds:g} s")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} "
          f"(1 min; {os.cpu_count()} CPUs, shared machine)")
    print(f"{'setup':<10} {'Get calls/s':>12} {'vs plain':>9} {'(rounds)':>12} "
          f"{'MultiGet-100 keys/s':>20} {'vs plain':>9} {'(rounds)':>12}")
    for setup in SETUPS:
        row = [f"{setup:<10}"]
        for op, width in (("get", 12), ("mget", 20)):
            mine = rates[(setup, op)]
            ratios = [m / b for m, b in zip(mine, rates[("plaintext", op)])]
            spread = f"{min(ratios):.2f}-{max(ratios):.2f}"
            row += [f"{statistics.median(mine):>{width},.0f}",
                    f"{statistics.median(ratios):>8.2f}x", f"{spread:>12}"]
        print(" ".join(row))
    print("CPU per call, client + router + shard (us; less sensitive to the machine's load than "
          "the rates)")
    print(f"{'setup':<10} {'Get':>8} {'vs plain':>9} {'MultiGet-100':>13} {'vs plain':>9}")
    for setup in SETUPS:
        row = [f"{setup:<10}"]
        for op, width in (("get", 8), ("mget", 13)):
            mine = cpus[(setup, op)]
            ratio = statistics.median(m / b for m, b in zip(mine, cpus[("plaintext", op)]))
            row += [f"{statistics.median(mine):>{width},.0f}", f"{ratio:>8.2f}x"]
        print(" ".join(row))
    return 0


def preload(address: str, tls: dict, nkeys: int) -> None:
    """grpc_bench.preload, over TLS when ``tls`` (Client keyword arguments) says so."""
    from router.client import Client

    rng = random.Random(1)
    with Client(address, timeout=120, **tls) as c:
        with c.batch(max_mutations=2000) as b:
            for i in range(nkeys):
                b.put(b"key%08d" % i, rng.randbytes(VALUE_BYTES))
        c.flush()


if __name__ == "__main__":
    sys.exit(main())
