"""Bench 4: the cost of opening many small tables.

Writes --tables (default 1,000) small tables (--keys entries each, 16-byte random keys,
100-byte values, blocked Bloom at 10 bits/key), then opens them all with Table.open and reports
the time and bytes read per open (through the FileSystem's counters) against the file size, and
the filter memory mapped and resident afterwards (target: none). Times are the best of
--rounds, as CPU time of this process (stable on a shared machine) and as wall time. Baselines in the same run:
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
        best = {"lazy": [float("inf")] * 2, "eager": [float("inf")] * 2,
                "raw": [float("inf")] * 2}

        def timed(name, fn):
            c0, w0 = time.process_time(), time.perf_counter()
            result = fn()
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
            best[name] = [min(best[name][0], cpu), min(best[name][1], wall)]
            return result

        def eager_open_all(efs):
            for p in paths:
                t = Table.open(efs, p)
                f = t._filter
                t._file.read_at(f.region_offset, f.region_size)
                t.close()

        def raw_read_all(rfs):
            for p in paths:
                rfs.read_file(p)

        for _ in range(args.rounds):
            fs = FileSystem()
            tables = timed("lazy", lambda: [Table.open(fs, p, file_number=i + 1)
                                            for i, p in enumerate(paths)])
            c = fs.counters.snapshot()
            keys = [t.residency_key for t in tables]
            mapped = sum(t.filter_stats()["mapped_bytes"] for t in tables)
            resident = resident_bytes(paths)
            for t in tables:
                t.close()
            efs, rfs = FileSystem(), FileSystem()
            timed("eager", lambda: eager_open_all(efs))
            timed("raw", lambda: raw_read_all(rfs))
        n = len(paths)
        per_open = c["bytes_read"] / n
        eager_per = efs.counters.bytes_read / n
        raw_per = rfs.counters.bytes_read / n

        def us(name):
            cpu, wall = best[name]
            return f"{cpu / n * 1e6:.1f} us CPU ({wall / n * 1e6:.1f} us wall)"

        def ratio(a, b):
            return f"{best[a][0] / best[b][0]:.2f}x CPU ({best[a][1] / best[b][1]:.2f}x wall)"

        print(f"Table.open: {us('lazy')} per table, {c['read_calls'] / n:.1f} reads, "
              f"{per_open:,.0f} B read per open = {c['bytes_read'] / total_size:.2%} of the "
              f"file bytes")
        print(f"after opening all: filter bytes mapped {mapped}, mappings {c['maps']}, "
              f"tables with a mapping {sum(k is not None for k in keys)}, resident bytes of "
              f"the table files (smaps) {sum(resident.values())} (target 0 for all)")
        print(f"baseline (a) open + eager filter load: {us('eager')}, {eager_per:,.0f} B read "
              f"per table; lazy/(a): time {ratio('lazy', 'eager')}, bytes "
              f"{per_open / eager_per:.3f}x")
        print(f"baseline (b) read the whole file, no parsing: {us('raw')}, {raw_per:,.0f} B "
              f"per table; lazy/(b): time {ratio('lazy', 'raw')}, bytes "
              f"{per_open / raw_per:.4f}x")
    finally:
        if args.dir is None:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
