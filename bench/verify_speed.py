"""How fast DB.verify checks a shard, beside the floor of reading the same files.

    python3 bench/verify_speed.py [--keys 1000000] [--rounds 5] [--dir D]

Fills one DB with --keys random 16-byte keys and 100-byte values (settled: flush + full
compaction), then, interleaved for --rounds rounds:

  verify  DB.verify(): every table re-read in ~1 MiB chunks, every data block's trailer and
          every filter partition's CRC checked in Python (engine/sstable/verify.py)
  floor   the same .sst files read in 1 MiB chunks with one CRC32C per chunk (what reading
          and checksumming the bytes costs without per-block work)

Both read through the page cache, which is warm after the first round: the figures are CPU
bound here, and a cold shard is bounded by its disk instead. Prints MiB/s (median over the
rounds) and the ratio verify / floor.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import engine  # noqa: E402
from engine.checksum import crc32c  # noqa: E402
from settled_db import fill_settled  # noqa: E402

MiB = 1 << 20


def floor(paths: list[str]) -> int:
    total = 0
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            off = 0
            while True:
                chunk = os.pread(fd, MiB, off)
                if not chunk:
                    break
                crc32c(chunk)
                off += len(chunk)
                total += len(chunk)
        finally:
            os.close(fd)
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="sievekv-verify-", dir=args.dir)
    try:
        path = os.path.join(root, "db")
        fill_s = fill_settled(path, args.keys)
        tables = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".sst"))
        rates: dict[str, list[float]] = {"verify": [], "floor": []}
        report = None
        with engine.DB.open(path) as db:
            for r in range(args.rounds):
                order = ["verify", "floor"] if r % 2 == 0 else ["floor", "verify"]
                for what in order:
                    t0 = time.perf_counter()
                    if what == "verify":
                        report = db.verify()
                        n = report["bytes"]
                        if report["damaged"]:
                            raise SystemExit(f"damage reported in a fresh DB: {report['damaged']}")
                    else:
                        n = floor(tables)
                    rates[what].append(n / (time.perf_counter() - t0) / MiB)
        ratios = [v / f for v, f in zip(rates["verify"], rates["floor"])]
        print(f"DB.verify vs reading the same files: {args.keys:,} keys, {len(tables)} tables, "
              f"{report['bytes'] / MiB:.1f} MiB, {report['data_blocks']:,} data blocks, "
              f"{report['filter_partitions']:,} filter partitions (fill + settle {fill_s:.0f} s); "
              f"{args.rounds} interleaved rounds, page cache warm; {os.cpu_count()} CPUs, load "
              f"average {os.getloadavg()[0]:.1f}")
        print(f"  verify  {statistics.median(rates['verify']):8.0f} MiB/s  "
              f"[{min(rates['verify']):.0f}-{max(rates['verify']):.0f}]")
        print(f"  floor   {statistics.median(rates['floor']):8.0f} MiB/s  "
              f"[{min(rates['floor']):.0f}-{max(rates['floor']):.0f}]")
        print(f"  verify / floor {statistics.median(ratios):.2f}x "
              f"[{min(ratios):.2f}-{max(ratios):.2f}]")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
