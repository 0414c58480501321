"""Block compression: none vs lz4 vs zstd on compressible and incompressible values, one run.

Two workloads of --keys random 16-byte keys put in random order:

  records  JSON-like records with repeated field names, 100-300 bytes (compressible)
  random   100-byte random values (db_bench's; incompressible: every block fails the 1/8 rule)

For each workload and each ``compression`` setting (engine defaults otherwise: its default
block cache unless --block-cache-mib sets one, mmap_reads, 2 table workers, 10 bits per key):

  fill      put every key, then flush (time until the last memtable is in a table), and the
            CPU seconds of the process and its table workers meanwhile
  settle    a full compaction (DB.compact), timed apart; then the bytes of the live tables
            (``table bytes``, and the data blocks' raw/stored ratio from stats())
  readrandom  --reads gets of present keys in random order, after close and reopen
  build     the write path alone: one TableBuilder fed the first --build-keys entries in key
            order, thread CPU seconds, --build-rounds rounds in rotating order (what a flush
            or compaction pays per table, without the DB's threads, workers and puts around it)
  seal      of that, the part the setting changes: sealing each data block (trial compression,
            the 1/8 test, CRC), thread CPU microseconds per block, 3x --build-rounds rounds

How it is measured (a shared 2-core machine; its load moves): after an untimed warm-up fill
per setting (table workers started, codecs imported), fills run --fill-rounds times
per setting, the settings in rotating order, and the median is kept. Reads hold the three DBs
of a workload open at once and run interleaved: the gets are cut into CHUNKS chunks and each
chunk runs on every setting back to back (rotating which goes first); the ratio printed is
the median over chunks of (setting / none), from wall time and from the reading thread's CPU
time. Every get's answer is compared with the value put (outside the timed loop, a sample).

Run:  python3 bench/compression.py [--keys N] [--reads N] [--fill-rounds R]
                                  [--build-rounds R] [--build-keys N] [--block-cache-mib M]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import psutil  # noqa: E402

import engine  # noqa: E402

SETTINGS = ("none", "lz4", "zstd")
WORKLOADS = ("records", "random")
CHUNKS = 10
MiB = 1 << 20


def record(rng: random.Random, i: int) -> bytes:
    """A JSON-like record, 100-300 bytes: repeated field names, some varying fields."""
    doc = {"id": i, "user": f"user{rng.randrange(10 ** 6):06d}",
           "email": f"u{rng.randrange(10 ** 6)}@example.com",
           "active": rng.random() < 0.5, "score": round(rng.random() * 1000, 2),
           "country": rng.choice(["DE", "FR", "US", "JP", "BR", "IN"]),
           "tags": rng.sample(["alpha", "beta", "gamma", "delta", "eps"], rng.randrange(4)),
           "note": "lorem ipsum dolor sit amet " * rng.randrange(5)}
    return json.dumps(doc).encode()[:300]


def make_data(workload: str, n: int, reads: int, seed: int = 11):
    rng = random.Random(seed)
    keys = [rng.randbytes(16) for _ in range(n)]
    if workload == "records":
        values = [record(rng, i) for i in range(n)]
    else:
        values = [rng.randbytes(100) for _ in range(n)]
    read_idx = [rng.randrange(n) for _ in range(reads)]
    return keys, values, read_idx


def cpu_seconds() -> float:
    """CPU seconds of this process and its children (the table workers, which live on)."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for c in me.children(recursive=True):
        try:
            total += sum(c.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def table_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
               if f.endswith(".sst"))


def fill(path: str, setting: str, keys, values, **opts) -> dict:
    shutil.rmtree(path, ignore_errors=True)
    c0, t0 = cpu_seconds(), time.perf_counter()
    with engine.DB.open(path, compression=setting, **opts) as db:
        put = db.put
        for k, v in zip(keys, values):
            put(k, v)
        db.flush()
        t1, c1 = time.perf_counter(), cpu_seconds()
        db.compact()
        t2 = time.perf_counter()
        st = db.stats()
    return {"fill_s": t1 - t0, "fill_cpu_s": c1 - c0, "settle_s": t2 - t1,
            "table_bytes": table_bytes(path), "ratio": st["compression"]["ratio"],
            "compressed_blocks": st["compression"]["compressed_data_blocks"],
            "blocks": st["compression"]["data_blocks"]}


def build_rounds(base: str, keys, values, rounds: int, n: int) -> dict:
    """Thread CPU seconds of building one table of the first ``n`` entries (sorted by key)
    per setting, ``rounds`` times in rotating order."""
    from engine.sstable import TableBuilder, TableOptions
    from engine.vfs import FileSystem

    fs = FileSystem()
    entries = sorted(zip(keys[:n], values[:n]))
    out = {s: [] for s in SETTINGS}
    for r in range(rounds):
        for s in SETTINGS[r % 3:] + SETTINGS[:r % 3]:
            path = os.path.join(base, f"build-{s}.sst")
            if os.path.exists(path):
                os.remove(path)
            w = fs.open_writable(path)
            c0 = time.thread_time()
            b = TableBuilder(w, TableOptions(compression=s))
            for i, (k, v) in enumerate(entries):
                b.add(k, i + 1, 1, v)
            b.finish()
            out[s].append(time.thread_time() - c0)
            w.close()
    return out


def seal_rounds(keys, values, rounds: int, n: int) -> dict:
    """Thread CPU microseconds per data block of sealing (compress, 1/8 test, CRC) the blocks
    a builder makes of the first ``n`` entries, per setting, ``rounds`` times in rotating
    order: the part of ``build`` that the setting changes, without the rest of the builder."""
    from engine.format import COMPRESSION_CODES, KIND_VALUE
    from engine.sstable.block_builder import BlockBuilder
    from engine.sstable.compression import seal_data

    blocks, b = [], BlockBuilder(1, True)
    for i, (k, v) in enumerate(sorted(zip(keys[:n], values[:n]))):
        b.add(k, (i + 1 << 8 | KIND_VALUE).to_bytes(8, "little") + v)
        if b.current_size_estimate() >= 4096:
            blocks.append(b.finish())
            b.reset()
    out = {s: [] for s in SETTINGS}
    for r in range(rounds):
        for s in SETTINGS[r % 3:] + SETTINGS[:r % 3]:
            code = COMPRESSION_CODES[s]
            c0 = time.thread_time()
            for blk in blocks:
                seal_data(blk, code)
            out[s].append((time.thread_time() - c0) / len(blocks) * 1e6)
    return out


def read_chunks(dbs: dict, keys, values, read_idx) -> dict:
    """Interleaved timed gets; returns per setting the chunk times (wall, cpu) in seconds."""
    out = {s: [] for s in dbs}
    size = len(read_idx) // CHUNKS
    order = list(dbs)
    for c in range(CHUNKS):
        chunk = [keys[i] for i in read_idx[c * size:(c + 1) * size]]
        rot = order[c % len(order):] + order[:c % len(order)]
        for s in rot:
            get = dbs[s].get
            w0, c0 = time.perf_counter(), time.thread_time()
            misses = 0
            for k in chunk:
                if get(k) is None:
                    misses += 1
            out[s].append((time.perf_counter() - w0, time.thread_time() - c0, len(chunk)))
            if misses:
                raise SystemExit(f"{s}: {misses} present keys not found")
    for s, db in dbs.items():  # untimed: the answers are right
        for i in read_idx[:2000]:
            assert db.get(keys[i]) == values[i], s
    return out


def db_options(args) -> dict:
    """Options besides ``compression`` (the engine's defaults but what the flags set)."""
    if args.block_cache_mib is None:
        return {}
    return {"block_cache_bytes": int(args.block_cache_mib * MiB)}


def run_workload(workload: str, args, base: str) -> dict:
    keys, values, read_idx = make_data(workload, args.keys, args.reads)
    raw = sum(map(len, keys)) + sum(map(len, values))
    paths = {s: os.path.join(base, f"{workload}-{s}") for s in SETTINGS}
    fills = {s: [] for s in SETTINGS}
    opts = db_options(args)
    for s in SETTINGS:  # untimed warm-up: table workers started, codecs imported
        fill(paths[s], s, keys[:5000], values[:5000], **opts)
    for r in range(args.fill_rounds):
        order = SETTINGS[r % 3:] + SETTINGS[:r % 3]
        for s in order:
            fills[s].append(fill(paths[s], s, keys, values, **opts))
            print(f"  {workload} round {r} {s}: fill {fills[s][-1]['fill_s']:.1f}s", flush=True)
    builds = build_rounds(base, keys, values, args.build_rounds, min(args.build_keys, args.keys))
    seals = seal_rounds(keys, values, 3 * args.build_rounds, min(args.build_keys, args.keys))
    dbs = {s: engine.DB.open(paths[s], compression=s, **opts) for s in SETTINGS}
    try:
        chunks = read_chunks(dbs, keys, values, read_idx)
        cache = {s: db.stats()["block_cache"] for s, db in dbs.items()}
    finally:
        for db in dbs.values():
            db.close()
    res = {"workload": workload, "raw_bytes": raw, "settings": {}}
    for s in SETTINGS:
        f = fills[s]
        med = {k: statistics.median(x[k] for x in f) for k in ("fill_s", "fill_cpu_s", "settle_s")}
        res["settings"][s] = dict(
            med, table_bytes=f[-1]["table_bytes"], ratio=f[-1]["ratio"],
            compressed_blocks=f[-1]["compressed_blocks"], blocks=f[-1]["blocks"],
            us_per_get=statistics.median(w / n * 1e6 for w, _, n in chunks[s]),
            get_ratio=statistics.median(a[0] / b[0] for a, b in zip(chunks[s], chunks["none"])),
            get_cpu_ratio=statistics.median(a[1] / b[1]
                                            for a, b in zip(chunks[s], chunks["none"])),
            fill_ratio=statistics.median(a["fill_s"] / b["fill_s"]
                                         for a, b in zip(f, fills["none"])),
            fill_cpu_ratio=statistics.median(a["fill_cpu_s"] / b["fill_cpu_s"]
                                             for a, b in zip(f, fills["none"])),
            build_cpu_s=statistics.median(builds[s]),
            seal_us=statistics.median(seals[s]),
            build_ratio=statistics.median(a / b for a, b in zip(builds[s], builds["none"])),
            build_ratio_range=(min(a / b for a, b in zip(builds[s], builds["none"])),
                               max(a / b for a, b in zip(builds[s], builds["none"]))),
            cache_hit=(cache[s]["hits"] / (cache[s]["hits"] + cache[s]["misses"])
                       if cache[s]["hits"] + cache[s]["misses"] else None))
    return res


def report(res: dict) -> None:
    none = res["settings"]["none"]
    print(f"\n{res['workload']}: {res['raw_bytes'] / MiB:.1f} MiB of keys and values")
    print(f"{'setting':8} {'tables MiB':>10} {'x none':>7} {'blocks':>9} {'fill s':>7} "
          f"{'x none':>7} {'fill CPU':>9} {'x none':>7} {'settle s':>8} {'us/get':>7} "
          f"{'x none':>7} {'CPU x':>6} {'cache hit':>9} {'build CPU s':>11} {'x none':>7} "
          f"{'range':>11} {'seal us':>8}")
    for s, r in res["settings"].items():
        hit = "-" if r["cache_hit"] is None else f"{100 * r['cache_hit']:.0f}%"
        print(f"{s:8} {r['table_bytes'] / MiB:10.1f} {r['table_bytes'] / none['table_bytes']:7.2f} "
              f"{r['compressed_blocks']:>4}/{r['blocks']:<4} {r['fill_s']:7.1f} "
              f"{r['fill_ratio']:7.2f} {r['fill_cpu_s']:9.1f} {r['fill_cpu_ratio']:7.2f} "
              f"{r['settle_s']:8.1f} {r['us_per_get']:7.1f} {r['get_ratio']:7.2f} "
              f"{r['get_cpu_ratio']:6.2f} {hit:>9} {r['build_cpu_s']:11.3f} "
              f"{r['build_ratio']:7.3f} {r['build_ratio_range'][0]:5.2f}-"
              f"{r['build_ratio_range'][1]:.2f} {r['seal_us']:8.1f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=200_000)
    p.add_argument("--reads", type=int, default=100_000)
    p.add_argument("--fill-rounds", type=int, default=3)
    p.add_argument("--build-rounds", type=int, default=9)
    p.add_argument("--build-keys", type=int, default=100_000)
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--block-cache-mib", type=float, default=None,
                   help="block_cache_bytes in MiB (default: the engine's default)")
    p.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    p.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = p.parse_args(argv)
    base = tempfile.mkdtemp(prefix="sievekv-compression-", dir=args.dir)
    cache = db_options(args).get("block_cache_bytes", engine.Options().block_cache_bytes)
    print(f"bench/compression.py --keys {args.keys} --reads {args.reads} "
          f"--fill-rounds {args.fill_rounds} --build-rounds {args.build_rounds} "
          f"--build-keys {args.build_keys}"
          + (f" --block-cache-mib {args.block_cache_mib:g}" if args.block_cache_mib is not None
             else "")
          + f": engine defaults but compression ({cache / MiB:g} MiB block cache, "
          f"mmap_reads, 2 table workers); load {os.getloadavg()[0]:.1f}")
    try:
        results = []
        for w in args.workloads.split(","):
            results.append(run_workload(w, args, base))
            report(results[-1])
        if args.json:
            print(json.dumps(results, indent=1))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"load at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
