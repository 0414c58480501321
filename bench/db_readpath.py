"""Bench 6: what each read-path choice of engine.DB.get costs (readrandom's path).

Fills one DB with --keys random 16-byte keys and 100-byte values (table format 2, every data
block with a hash index) and one without the hash index (``data_block_hash_index=False``, the
layout of format 1), settles both (flush + full compaction), copies them so every variant has
its own directory, and then times random gets of existing keys, interleaved:

  A  pread + 8 MiB block cache, no hash index   (the read path before bench 6; baseline)
  B  pread, no block cache, no hash index
  C  mmap_reads, no hash index
  D  mmap_reads + hash index                     (the defaults: every get checks its block)
  E  D with verify_every_read=False               (a block's checksum is checked on its first
                                                   get per open table, later gets read the
                                                   entry in place; not the default: damage that
                                                   appears later can be returned as a value)

Each round runs one chunk of --chunk gets on every variant back to back (rotating which goes
first); the figure per variant is the median over rounds of process CPU time per get (robust
to the shared machine's load), and the speed-up is the median of per-round ratios against A.
The minimum over rounds is printed too (the least disturbed round).

Run: python3 bench/db_readpath.py [--keys 1000000] [--rounds 30] [--chunk 5000] [--dir D]
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import engine  # noqa: E402

MiB = 1 << 20
VARIANTS = [
    ("A", "pread + 8 MiB block cache, no hash index", False,
     dict(mmap_reads=False, block_cache_bytes=8 * MiB)),
    ("B", "pread, no block cache, no hash index", False,
     dict(mmap_reads=False, block_cache_bytes=0)),
    ("C", "mmap_reads, no hash index", False, dict(mmap_reads=True)),
    ("D", "mmap_reads + hash index (defaults)", True, dict(mmap_reads=True)),
    ("E", "D, verify_every_read=False (in place)", True,
     dict(mmap_reads=True, verify_every_read=False)),
]


def fill(path: str, keys: list[bytes], hash_index: bool, seed: int) -> float:
    rng = random.Random(seed)
    t0 = time.perf_counter()
    with engine.DB.open(path, memtable_bytes=64 * MiB, data_block_hash_index=hash_index) as db:
        for k in keys:
            db.put(k, rng.randbytes(100))
        db.flush()
        db.compact()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--chunk", type=int, default=5000)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)  # a --dir that does not exist yet is made
    root = tempfile.mkdtemp(prefix="sievekv-readpath-", dir=args.dir)
    try:
        rng = random.Random(1)
        keys = [rng.randbytes(16) for _ in range(args.keys)]
        plain, hashed = os.path.join(root, "plain"), os.path.join(root, "hashed")
        t_plain = fill(plain, keys, False, 2)
        t_hashed = fill(hashed, keys, True, 2)
        sizes = {p: sum(os.path.getsize(os.path.join(p, f)) for f in os.listdir(p)
                        if f.endswith(".sst")) for p in (plain, hashed)}
        dbs = []
        for name, what, hash_index, opts in VARIANTS:
            d = os.path.join(root, name)
            shutil.copytree(hashed if hash_index else plain, d)
            dbs.append((name, what, engine.DB.open(d, **opts)))
        sample = [rng.choice(keys) for _ in range(args.chunk * (args.rounds + 2))]
        for _, _, db in dbs:  # warm: page cache, filter pages, mappings
            for k in sample[: 2 * args.chunk]:
                db.get(k)
        per = {name: [] for name, _, _ in dbs}
        for r in range(args.rounds):
            ks = sample[(r + 2) * args.chunk: (r + 3) * args.chunk]
            order = dbs[r % len(dbs):] + dbs[: r % len(dbs)]
            for name, _, db in order:
                get = db.get
                t0 = time.process_time()
                for k in ks:
                    if get(k) is None:
                        raise SystemExit(f"variant {name}: a present key read as absent")
                per[name].append((time.process_time() - t0) / len(ks) * 1e6)
        for _, _, db in dbs:
            db.close()
        print(f"bench 6: engine.DB.get of present keys, {args.keys:,} keys (16 B random, 100 B "
              f"values), settled to one level; {args.rounds} interleaved rounds of "
              f"{args.chunk:,} gets per variant; process CPU time")
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
              f"{os.getloadavg()[0]:.1f}; fill+settle {t_plain:.0f} s (no hash index), "
              f"{t_hashed:.0f} s (hash index); table bytes {sizes[plain]:,} vs "
              f"{sizes[hashed]:,} (+{(sizes[hashed] / sizes[plain] - 1) * 100:.2f}%)")
        print()
        print(f"{'':3}{'variant':44}{'us/get':>9}{'min':>8}{'speed-up vs A':>15}")
        base = per["A"]
        for name, what, _ in dbs:
            ratios = [a / b for a, b in zip(base, per[name])]
            print(f"{name:3}{what:44}{statistics.median(per[name]):9.2f}"
                  f"{min(per[name]):8.2f}{statistics.median(ratios):14.2f}x"
                  f"  [{min(ratios):.2f}-{max(ratios):.2f}]")
        ratios = [d / e for d, e in zip(per["D"], per["E"])]
        print(f"\nin-place reads: E vs D {statistics.median(ratios):.2f}x faster per get "
              f"[{min(ratios):.2f}-{max(ratios):.2f}] (gets in the sample that found their "
              f"block not yet verified pay the check, as D does)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
