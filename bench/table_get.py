"""Bench 5: the cost of one Table.get (the SSTable point-read path of readrandom).

Writes two tables of --keys entries (16-byte random keys, 100-byte values, blocked Bloom at
10 bits/key) that differ only in the data blocks' restart interval (--intervals, default 16,1),
then times Table.get per key in four cases:

- present, cached: the key's data block is in a block cache large enough for the whole table
  (warmed first), so a get is filter probe + cache lookup + Block.get + value decode;
- present, uncached: no block cache, so every get also preads its 4 KiB block from the page
  cache, checks its CRC32C and builds the Block (readrandom's case: its 8 MiB cache over
  116 MB of tables misses ~93% of the time);
- absent, cached / absent, uncached: keys not in the table (the filter answers for ~99%).

Baseline in the same run: the first interval listed (the default layout, 16); each other
interval's time is printed as a speed-up against it. A floor is printed too: one ``os.pread`` of
a 4 KiB block plus a dict lookup (what a get cannot go below in Python). Times are per get, the
median of --rounds rounds interleaved across layouts (process CPU time, robust to the shared
machine's load).

Run: python3 bench/table_get.py [--keys N] [--gets N] [--rounds N] [--intervals 16,1]
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

from engine.block_cache import BlockCache  # noqa: E402
from engine.format import KIND_VALUE  # noqa: E402
from engine.sstable import Table, TableBuilder, TableOptions  # noqa: E402
from engine.vfs import FileSystem  # noqa: E402


def write_table(fs: FileSystem, path: str, keys: list[bytes], interval: int,
                values: bytes) -> None:
    w = fs.open_writable(path)
    b = TableBuilder(w, TableOptions(restart_interval=interval))
    for j, k in enumerate(keys):
        off = (j * 101) % (len(values) - 100)
        b.add(k, j + 1, KIND_VALUE, values[off: off + 100])
    b.finish()
    w.sync()
    w.close()


def time_gets(get, keys: list[bytes]) -> float:
    """Process CPU seconds per get over ``keys``."""
    t0 = time.process_time()
    for k in keys:
        get(k)
    return (time.process_time() - t0) / len(keys)


def floor_per_get(path: str, keys: list[bytes]) -> float:
    """One pread of 4 KiB at a random block offset plus one dict lookup, per key."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        rng = random.Random(7)
        offs = [rng.randrange(0, size - 4096) & ~4095 for _ in keys]
        d = dict.fromkeys(keys[::2], b"x")
        pread = os.pread
        get = d.get
        t0 = time.process_time()
        for k, o in zip(keys, offs):
            pread(fd, 4096, o)
            get(k)
        return (time.process_time() - t0) / len(keys)
    finally:
        os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--gets", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--intervals", default="16,1")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    intervals = [int(x) for x in args.intervals.split(",")]
    d = args.dir or tempfile.mkdtemp(prefix="sievekv-bench-get-")
    os.makedirs(d, exist_ok=True)
    rng = random.Random(2024)
    fs = FileSystem()
    try:
        keys = sorted({rng.randbytes(16) for _ in range(args.keys)})
        values = rng.randbytes(1 << 16)
        kset = set(keys)
        present = rng.sample(keys, min(args.gets, len(keys)))
        absent = []
        while len(absent) < len(present):
            k = rng.randbytes(16)
            if k not in kset:
                absent.append(k)
        tables = {}
        for iv in intervals:
            path = os.path.join(d, f"interval{iv}.sst")
            write_table(fs, path, keys, iv, values)
            big = BlockCache(1 << 30)
            cached = Table.open(fs, path, file_number=1, block_cache=big)
            for k in present:  # warm: every block of the sample in the cache
                cached.get(k)
            for k in absent:
                cached.get(k)
            uncached = Table.open(fs, path, file_number=2, block_cache=None)
            for k in present:  # sanity: every layout answers every key right
                if cached.get(k) is None or uncached.get(k) != cached.get(k):
                    raise SystemExit(f"interval {iv}: wrong answer for {k.hex()}")
            for k in absent[:1000]:
                if cached.get(k) is not None or uncached.get(k) is not None:
                    raise SystemExit(f"interval {iv}: absent key {k.hex()} found")
            tables[iv] = (path, cached, uncached)
        cases = [("present, cached", 1, present), ("present, uncached", 2, present),
                 ("absent, cached", 1, absent), ("absent, uncached", 2, absent)]
        samples = {(c, iv): [] for c, _, _ in cases for iv in intervals}
        floors = []
        for _ in range(args.rounds):
            for name, which, ks in cases:
                for iv in intervals:
                    samples[(name, iv)].append(time_gets(tables[iv][which].get, ks))
            floors.append(floor_per_get(tables[intervals[0]][0], present))
        base = intervals[0]
        size = {iv: os.path.getsize(tables[iv][0]) for iv in intervals}
        print(f"# bench 5: Table.get, {len(keys):,} keys (16 B keys, 100 B values, blocked Bloom "
              f"10 bits/key), {len(present):,} gets per case, median of {args.rounds} "
              f"interleaved rounds, process CPU time per get")
        print("table bytes: " + ", ".join(f"interval {iv}: {size[iv]:,}" for iv in intervals))
        head = f"{'case':<20}" + "".join(f"{'interval ' + str(iv):>14}" for iv in intervals)
        print(head + "".join(f"{'x vs ' + str(base) + ' (iv ' + str(iv) + ')':>18}"
                             for iv in intervals[1:]))
        for name, _, _ in cases:
            med = {iv: statistics.median(samples[(name, iv)]) for iv in intervals}
            row = f"{name:<20}" + "".join(f"{med[iv] * 1e6:>11.2f} us" for iv in intervals)
            row += "".join(f"{med[base] / med[iv]:>17.2f}x" for iv in intervals[1:])
            print(row)
        fl = statistics.median(floors)
        print(f"floor: os.pread 4 KiB + dict get = {fl * 1e6:.2f} us per get")
        for iv in intervals:
            print(f"present uncached / floor, interval {iv}: "
                  f"{statistics.median(samples[('present, uncached', iv)]) / fl:.2f}x")
        for iv in intervals:
            for _, c, u in [tables[iv]]:
                c.close()
                u.close()
    finally:
        if not args.dir:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
