"""Bench 8: where a present-key engine.DB.get spends its time (readrandom's path), step by step.

Fills and settles one DB (bench/settled_db.py: --keys random 16-byte keys with 100-byte values,
the default options), reads every key once (so every filter partition is resident and every
block's checksum is known, as in a long-running shard), then times each step of
``Table.get`` on its own, over keys whose table, filter partition and block were found
beforehand:

  cold: a fresh random sample of keys each round: each step finds its data where a random get
        finds it, mostly out of the CPU caches (the 4 KiB block of every get passes through)
  warm: --warm-keys keys cycled over and over (their blocks, keys and filter lines stay in
        the CPU caches): what the interpreter costs alone

cold - warm is the time that step waits for memory. Steps, in the order a get takes them:

  range      the table's smallest/largest check
  partition  bisect of the filter partitions' separators
  probe      the filter partition's probe (a positive: all k bits tested)
  index      bisect of the index over the partition's data blocks
  copy       the block's slice out of the mapping (4 KiB + the type byte)
  crc        copy, then CRC32C of it (the check of every read)
  find       copy, CRC, then the block's hash-index lookup and the value's slice

"find - crc" is the lookup on a block just copied (in cache), as a get runs it. DB.get adds
the memtable lookup, the level's bisect and the counters to Table.get.

--block-sizes B,B,...: also fill DBs of the same keys with those ``block_size`` values and
time DB.get (and a seek + 100 next) on each, interleaved, against the default 4096.

Run: python3 bench/get_parts.py [--keys 1000000] [--rounds 12] [--sample 20000]
     [--block-sizes 2048,1024] [--dir D]
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
from bisect import bisect_left

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import engine  # noqa: E402
from engine.sstable import reader as table_reader  # noqa: E402
from engine.sstable.block import find_hashed  # noqa: E402
from settled_db import fill_settled  # noqa: E402

_crc = table_reader._crc_value


def _keys(n: int) -> list[bytes]:
    """The keys fill_settled writes (same seed, same draws)."""
    rng = random.Random(1)
    out = []
    for _ in range(n):
        out.append(rng.randbytes(16))
        rng.randbytes(100)
    return out


def _located(db, keys: list[bytes]) -> list[tuple]:
    """Per key: (key, table, filter, partition, block, block start, block end, mapping)."""
    rs = db._rs
    if len(rs.lookup) != 1 or rs.l0 or rs.frozen:
        raise SystemExit("the DB is not settled to one level")
    largests, _smallests, _gets = rs.lookup[0]
    tables = rs.levels[0][3]
    out = []
    for k in keys:
        t = tables[bisect_left(largests, k)]
        f = t._filter
        p = bisect_left(f.separators, k)
        i = bisect_left(t._index_keys, k, f.first_blocks[p], f.block_ends[p])
        off = t._offsets[i]
        out.append((k, t, f, p, i, off, off + t._sizes[i], t._data_map))
    return out


def _steps(db):
    """name -> function timing one pass over located items (returns nothing)."""
    def loop(items):
        for _ in items:
            pass

    def db_get(items):
        get = db.get
        for x in items:
            get(x[0])

    def table_get(items):
        for x in items:
            x[1].get(x[0])

    def range_(items):
        for k, t, f, p, i, off, end, m in items:
            if k > t.largest or k < t.smallest:
                pass

    def partition(items):
        for k, t, f, p, i, off, end, m in items:
            bisect_left(f.separators, k)

    def probe(items):
        for k, t, f, p, i, off, end, m in items:
            f.may_match_partition(p, k)

    def index(items):
        for k, t, f, p, i, off, end, m in items:
            bisect_left(t._index_keys, k, f.first_blocks[p], f.block_ends[p])

    def copy(items):
        for k, t, f, p, i, off, end, m in items:
            m[off : end + 1]

    def crc(items):
        for k, t, f, p, i, off, end, m in items:
            _crc(m[off : end + 1])

    def find(items):
        for k, t, f, p, i, off, end, m in items:
            data = m[off : end + 1]
            _crc(data)
            vs, ve = find_hashed(data, 0, end - off, k, None, off)
            data[vs + 8 : ve]

    return {"DB.get": db_get, "Table.get": table_get, "range": range_,
            "partition": partition, "probe": probe, "index": index, "copy": copy,
            "crc": crc, "find": find, "loop": loop}


def _time(fn, items) -> float:
    t0 = time.process_time()
    fn(items)
    return (time.process_time() - t0) / len(items) * 1e9


def parts(db, keys: list[bytes], rounds: int, sample: int, warm_keys: int, seed: int):
    rng = random.Random(seed)
    steps = _steps(db)
    warm_items = _located(db, rng.sample(keys, warm_keys)) * (sample // warm_keys)
    cold, warm = {n: [] for n in steps}, {n: [] for n in steps}
    names = list(steps)
    for r in range(rounds):
        items = _located(db, rng.sample(keys, sample))
        order = names[r % len(names):] + names[: r % len(names)]
        for n in order:
            cold[n].append(_time(steps[n], items))
            warm[n].append(_time(steps[n], warm_items))
    return ({n: statistics.median(v) for n, v in cold.items()},
            {n: statistics.median(v) for n, v in warm.items()})


def block_sizes(paths: dict, keys: list[bytes], rounds: int, sample: int, seed: int):
    rng = random.Random(seed)
    dbs = {b: engine.DB.open(p) for b, p in paths.items()}
    try:
        for db in dbs.values():
            for k in keys:
                db.get(k)
        gets, seeks = {b: [] for b in dbs}, {b: [] for b in dbs}
        names = list(dbs)
        for r in range(rounds):
            ks = rng.sample(keys, sample)
            order = names[r % len(names):] + names[: r % len(names)]
            for b in order:
                get = dbs[b].get
                t0 = time.process_time()
                for k in ks:
                    get(k)
                gets[b].append((time.process_time() - t0) / len(ks) * 1e9)
            for b in order:
                db = dbs[b]
                t0 = time.process_time()
                for k in ks[:500]:
                    for _ in db.scan(k, None, 100):
                        pass
                seeks[b].append((time.process_time() - t0) / 500 * 1e6)
        return gets, seeks
    finally:
        for db in dbs.values():
            db.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--sample", type=int, default=20_000, help="keys per round")
    ap.add_argument("--warm-keys", type=int, default=32)
    ap.add_argument("--block-sizes", default="", help="e.g. 2048,1024")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    root = tempfile.mkdtemp(prefix="sievekv-get-parts-", dir=args.dir)
    try:
        keys = _keys(args.keys)
        paths = {4096: os.path.join(root, "4096")}
        fill_s = {4096: fill_settled(paths[4096], args.keys)}
        for b in (int(x) for x in args.block_sizes.split(",") if x):
            paths[b] = os.path.join(root, str(b))
            fill_s[b] = fill_settled(paths[b], args.keys, block_size=b)
        with engine.DB.open(paths[4096]) as db:
            for k in keys:
                db.get(k)
            cold, warm = parts(db, keys, args.rounds, args.sample, args.warm_keys, 2)
        print(f"bench 8: the steps of a present-key get, {args.keys:,} keys (16 B random, "
              f"100 B values), default options, settled to one level (fill+settle "
              f"{fill_s[4096]:.0f} s); {args.rounds} rounds of {args.sample:,} keys, median ns "
              f"of process CPU time per key, the empty loop subtracted")
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
              f"{os.getloadavg()[0]:.1f}")
        print()
        print(f"{'step':12}{'cold':>8}{'warm':>8}{'cold-warm':>11}")
        base_c, base_w = cold.pop("loop"), warm.pop("loop")
        for n in cold:
            c, w = cold[n] - base_c, warm[n] - base_w
            print(f"{n:12}{c:8.0f}{w:8.0f}{c - w:11.0f}")
        c = (cold["find"] - cold["crc"], warm["find"] - warm["crc"])
        print(f"{'find - crc':12}{c[0]:8.0f}{c[1]:8.0f}{c[0] - c[1]:11.0f}")
        if len(paths) > 1:
            gets, seeks = block_sizes(paths, keys, args.rounds, args.sample, 3)
            print()
            print(f"DB.get and seek + 100 next per block_size, interleaved ({args.rounds} rounds; "
                  f"ratio: median of per-round ratios to 4096)")
            print(f"{'block_size':>10}{'table bytes':>14}{'get ns':>9}{'ratio':>8}"
                  f"{'seek us':>9}{'ratio':>8}")
            for b, p in paths.items():
                size = sum(os.path.getsize(os.path.join(p, f)) for f in os.listdir(p)
                           if f.endswith(".sst"))
                gr = statistics.median(x / y for x, y in zip(gets[b], gets[4096]))
                sr = statistics.median(x / y for x, y in zip(seeks[b], seeks[4096]))
                print(f"{b:>10}{size:>14,}{statistics.median(gets[b]):9.0f}{gr:8.3f}"
                      f"{statistics.median(seeks[b]):9.1f}{sr:8.3f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
