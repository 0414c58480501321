"""Bench 4: the cost of opening many small tables.

Writes --tables (default 1,000) small tables (--keys entries each, 16-byte random keys,
100-byte values, blocked Bloom at 10 bits/key), then opens them all with Table.open and reports
the time and bytes read per open (through the FileSystem's counters) against the file size, and
the filter memory mapped and resident afterwards (target: none). Baselines in the same run:
(a) an eager filter load: Table.open plus reading the whole filter region (what a reader that
loads filters at open pays, as LevelDB does); (b) one read of each whole file (raw I/O, no
parsing).

Run: python3 bench/table_open.py [--tables N] [--keys N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from engine.format import KIND_VALUE  # noqa: E402
from engine.sstable import Table, TableBuilder, TableOptions  # noqa: E402
from engine.sstable.residency import resident_bytes  # noqa: E402
from engine.vfs import FileSystem  # noqa: E402


def write_tables(d: str, n: int, keys_per_table: int, rng: random.Random) -> list[str]:
    fs = FileSystem()
    values = rng.randbytes(1 << 16)
    paths = []
    for i in range(n):
        path = os.path.join(d, f"{i + 1:06d}.sst")
        w = fs.open_writable(path)
        b = TableBuilder(w, TableOptions())
        for j, k in enumerate(sorted({rng.randbytes(16) for _ in range(keys_per_table)})):
            off = (j * 101) % (len(values) - 100)
            b.add(k, j, KIND_VALUE, values[off: off + 100])
        b.finish()
        w.sync()
        w.close()
        paths.append(path)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", type=int, default=1000)
    ap.add_argument("--keys", type=int, default=500)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    d = args.dir or tempfile.mkdtemp(prefix="sievekv-bench-open-")
    os.makedirs(d, exist_ok=True)
    try:
        t0 = time.perf_counter()
        paths = write_tables(d, args.tables, args.keys, random.Random(7))
        wrote = time.perf_counter() - t0
        total_size = sum(os.path.getsize(p) for p in paths)
        print(f"# bench 4: open cost, {len(paths):,} tables of {args.keys} entries "
              f"(16 B keys, 100 B values, blocked Bloom 10 bits/key), written in {wrote:.1f} s; "
              f"mean file size {total_size / len(paths):,.0f} B; best of {args.rounds} rounds")
        best_lazy = best_eager = best_raw = float("inf")
        for _ in range(args.rounds):
            fs = FileSystem()
            t0 = time.perf_counter()
            tables = [Table.open(fs, p, file_number=i + 1) for i, p in enumerate(paths)]
            best_lazy = min(best_lazy, time.perf_counter() - t0)
            c = fs.counters.snapshot()
            keys = [t.residency_key for t in tables]
            mapped = sum(t.filter_stats({})["mapped_bytes"] for t in tables)
            resident = resident_bytes(paths)
            for t in tables:
                t.close()
            efs = FileSystem()
            t0 = time.perf_counter()
            for p in paths:
                t = Table.open(efs, p)
                f = t._filter
                t._file.read_at(f.region_offset, f.region_size)
                t.close()
            best_eager = min(best_eager, time.perf_counter() - t0)
            rfs = FileSystem()
            t0 = time.perf_counter()
            for p in paths:
                rfs.read_file(p)
            best_raw = min(best_raw, time.perf_counter() - t0)
        n = len(paths)
        per_open = c["bytes_read"] / n
        eager_per = efs.counters.bytes_read / n
        print(f"Table.open: {best_lazy / n * 1e6:.1f} us per table, {c['read_calls'] / n:.1f} "
              f"reads, {per_open:,.0f} B read per open = {c['bytes_read'] / total_size:.2%} of "
              f"the file bytes")
        print(f"after opening all: filter bytes mapped {mapped}, mappings {c['maps']}, "
              f"tables with a mapping {sum(k is not None for k in keys)}, resident bytes of "
              f"the table files (smaps) {sum(resident.values())} (target 0 for all)")
        raw_per = rfs.counters.bytes_read / n
        print(f"baseline (a) open + eager filter load: {best_eager / n * 1e6:.1f} us, "
              f"{eager_per:,.0f} B read per table; ratio lazy/(a): time "
              f"{best_lazy / best_eager:.2f}x, bytes {per_open / eager_per:.3f}x")
        print(f"baseline (b) read the whole file, no parsing: {best_raw / n * 1e6:.1f} us, "
              f"{raw_per:,.0f} B per table; ratio lazy/(b): time {best_lazy / best_raw:.2f}x, "
              f"bytes {per_open / raw_per:.4f}x")
    finally:
        if args.dir is None:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
