"""engine.DB.scan of this checkout against another checkout's (--base), in one process, same data.

Builds two DBs of --keys random 16-byte keys with 100-byte values (seeded, no compression,
10 filter bits per key, as bench/db_bench.py) once under --dir and reuses them:

  settled  flushed and fully compacted (bench/settled_db.py): one level, so a scan reads one
           source (db_bench's seekrandom reads this shape)
  mixed    written with 8 MiB memtables and left as the background compactions had it, then
           30,000 more puts, some of which stay in the memtable: a scan merges the memtable,
           L0 and two levels. One delete per 7 puts (tombstones to hide).

Each engine opens its own copy of each DB (8 MiB block cache, compression none,
table_workers 0), both imported at once (the two ``engine`` packages under other names, their
imports are relative), and the workloads run interleaved: --chunks chunks, each run on both
engines back to back in alternating order, timed by the thread's CPU time. The figure printed
is the median over chunks of (base time / this checkout's time) with the range, and each
engine's median ns per entry returned; every chunk must return the same number of entries on
both, and a sample of each workload must return the same (key, value) pairs.

  seek limit N   DB.scan(k, limit=N) for random k (N = 1, 10, 100)
  seek islice    itertools.islice(DB.scan(start=k), 100)
  range 1%       DB.scan(lo, hi) over ~1% of the keys (~10,000 at 1M keys)
  full           DB.scan() of every key (a third as many chunks: one full scan each)

Run:  python3 bench/db_scan.py --base /path/to/other/checkout [--keys 1000000] [--dir D]
      [--only settled|mixed] [--chunks 10]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MiB = 1 << 20
OPTS = dict(block_cache_bytes=8 * MiB, compression="none", bits_per_key=10.0, table_workers=0)


def build(path: str, keys: int, shape: str) -> None:
    sys.path.insert(0, ROOT)
    import engine

    if shape == "settled":
        sys.path.insert(0, HERE)
        from settled_db import fill_settled

        fill_settled(path, keys, compression="none", bits_per_key=10.0)
        return
    rng = random.Random(3)
    with engine.DB.open(path, memtable_bytes=8 * MiB, compression="none",
                        bits_per_key=10.0) as db:
        for i in range(keys):
            db.put(rng.randbytes(16), rng.randbytes(100))
            if i % 7 == 0:
                db.delete(rng.randbytes(16))
        db.flush()
        db.wait_for_compactions(timeout=600)
        for _ in range(30_000):
            db.put(rng.randbytes(16), rng.randbytes(100))


def load_engines(base_root: str) -> dict:
    """Both checkouts' engine packages, as engine_base and engine_this."""
    d = tempfile.mkdtemp(prefix="db_scan_pkgs-")
    os.symlink(os.path.join(base_root, "engine"), os.path.join(d, "engine_base"))
    os.symlink(os.path.join(ROOT, "engine"), os.path.join(d, "engine_this"))
    sys.path.insert(0, d)
    import engine_base.db
    import engine_this.db

    return {"base": engine_base.db.DB, "this": engine_this.db.DB}


def workloads():
    rng = random.Random(7)
    seeks = [rng.randbytes(16) for _ in range(4000)]
    lo = bytes([0x40]) + bytes(15)
    hi = (0x40 * 256 + max(1, 65536 // 100)).to_bytes(2, "big") + bytes(14)  # ~1% of keys

    def seek(lim):
        def run(db, c):
            n = 0
            for k in seeks[c * 400:(c + 1) * 400]:
                for _ in db.scan(k, limit=lim):
                    n += 1
            return n
        return run

    def seek_islice(db, c):
        n = 0
        for k in seeks[c * 400:(c + 1) * 400]:
            for _ in itertools.islice(db.scan(start=k), 100):
                n += 1
        return n

    def ranged(db, c):
        return sum(1 for _ in db.scan(lo, hi))

    def full(db, c):
        return sum(1 for _ in db.scan())

    def sample(name):
        k = seeks[0]
        return {"seek limit 1": lambda db: list(db.scan(k, limit=1)),
                "seek limit 10": lambda db: list(db.scan(k, limit=10)),
                "seek limit 100": lambda db: list(db.scan(k, limit=100)),
                "seek islice 100": lambda db: list(itertools.islice(db.scan(start=k), 100)),
                "range 1%": lambda db: list(db.scan(lo, hi)),
                "full": lambda db: list(itertools.islice(db.scan(), 50_000))}[name]

    return [("seek limit 1", seek(1)), ("seek limit 10", seek(10)),
            ("seek limit 100", seek(100)), ("seek islice 100", seek_islice),
            ("range 1%", ranged), ("full", full)], sample


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="root of the checkout to compare against")
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "sievekv-db-scan"))
    ap.add_argument("--only", choices=["settled", "mixed"])
    ap.add_argument("--chunks", type=int, default=10)
    args = ap.parse_args()
    shapes = [args.only] if args.only else ["settled", "mixed"]
    for shape in shapes:
        src = os.path.join(args.dir, f"{shape}-{args.keys}")
        if not os.path.exists(os.path.join(src, "CURRENT")):
            shutil.rmtree(src, ignore_errors=True)
            t0 = time.perf_counter()
            build(src, args.keys, shape)
            print(f"built {shape} DB in {time.perf_counter() - t0:.1f} s: {src}", flush=True)
    classes = load_engines(os.path.abspath(args.base))
    print(f"base: {os.path.abspath(args.base)}  this: {ROOT}")
    for shape in shapes:
        src = os.path.join(args.dir, f"{shape}-{args.keys}")
        dbs = {}
        for name, cls in classes.items():
            copy = os.path.join(args.dir, f"copy-{shape}-{name}")
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(src, copy)
            dbs[name] = cls.open(copy, **OPTS)
        try:
            gc.collect()
            gc.freeze()
            work, sample = workloads()
            print(f"\n{shape} DB ({args.keys:,} keys); load average "
                  f"{' '.join(open('/proc/loadavg').read().split()[:3])}")
            for name, fn in work:
                if sample(name)(dbs["base"]) != sample(name)(dbs["this"]):
                    raise SystemExit(f"{shape} {name}: the engines returned other entries")
                chunks = max(1, args.chunks // 3) if name == "full" else args.chunks
                times = {"base": [], "this": []}
                counts = {"base": 0, "this": 0}
                for c in range(chunks):
                    for e in (("base", "this") if c % 2 == 0 else ("this", "base")):
                        c0 = time.thread_time()
                        counts[e] += fn(dbs[e], c)
                        times[e].append(time.thread_time() - c0)
                if counts["base"] != counts["this"]:
                    raise SystemExit(f"{shape} {name}: entry counts differ {counts}")
                ratios = [b / t for b, t in zip(times["base"], times["this"])]
                per = counts["this"] / chunks
                print(f"  {name:16s} {per:9,.0f} entries/chunk  base "
                      f"{statistics.median(times['base']) / per * 1e9:6.0f} ns/entry  this "
                      f"{statistics.median(times['this']) / per * 1e9:6.0f} ns/entry  "
                      f"speed-up {statistics.median(ratios):.2f}x "
                      f"({min(ratios):.2f}-{max(ratios):.2f})", flush=True)
        finally:
            for db in dbs.values():
                db.close()
            for name in classes:
                shutil.rmtree(os.path.join(args.dir, f"copy-{shape}-{name}"), ignore_errors=True)
    print(f"load average {' '.join(open('/proc/loadavg').read().split()[:3])}")


if __name__ == "__main__":
    main()
