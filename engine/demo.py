"""A small tour of sievekv's tables: ``python3 -m engine.demo [--dir DIR]``.

Writes a few SSTables (each with a differently configured partitioned filter) into a
directory, reopens them (reading only their metadata), looks up present and absent keys, and
prints each table's filter report: bytes on disk / mapped / resident (measured by the OS),
partitions touched, probes, useful negatives, positives, true positives and the observed
false-positive rate. Finishes in a few seconds.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time

from .block_cache import BlockCache
from .format import KIND_VALUE
from .sstable import Table, TableBuilder, TableOptions
from .sstable.residency import resident_bytes
from .vfs import FileSystem

TABLES = [("blocked-bloom", 10.0), ("bloom", 10.0), ("blocked-bloom", 5.0)]


def _write(fs: FileSystem, path: str, keys: list[bytes], policy: str, bits: float) -> None:
    w = fs.open_writable(path)
    b = TableBuilder(w, TableOptions(filter_policy=policy, bits_per_key=bits))
    for seq, k in enumerate(keys, 1):
        b.add(k, seq, KIND_VALUE, b"value-of-" + k.hex().encode())
    b.finish()
    w.sync()
    w.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python3 -m engine.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--dir", help="directory for the tables (default: a temporary one, removed)")
    ap.add_argument("--keys", type=int, default=20_000, help="keys per table")
    ap.add_argument("--lookups", type=int, default=20_000, help="absent-key lookups")
    args = ap.parse_args(argv)
    d = args.dir or tempfile.mkdtemp(prefix="sievekv-demo-")
    os.makedirs(d, exist_ok=True)
    rng = random.Random(2024)
    fs = FileSystem()
    try:
        t0 = time.perf_counter()
        paths, all_keys = [], []
        for i, (policy, bits) in enumerate(TABLES, 1):
            keys = sorted({rng.randbytes(16) for _ in range(args.keys)})
            path = os.path.join(d, f"{i:06d}.sst")
            _write(fs, path, keys, policy, bits)
            paths.append(path)
            all_keys.append(keys)
        size = sum(os.path.getsize(p) for p in paths)
        print(f"wrote {len(paths)} tables, {sum(map(len, all_keys)):,} keys, {size:,} bytes, "
              f"to {d} in {time.perf_counter() - t0:.1f} s")

        rfs = FileSystem()
        cache = BlockCache(8 << 20)
        tables = [Table.open(rfs, p, file_number=i, block_cache=cache)
                  for i, p in enumerate(paths, 1)]
        mapped = sum(t.filter_stats()["mapped_bytes"] for t in tables)
        print(f"reopened: read {rfs.counters.bytes_read:,} bytes of metadata in "
              f"{rfs.counters.read_calls} reads ({rfs.counters.bytes_read / size:.2%} of the "
              f"files); filter bytes mapped {mapped}, resident "
              f"{sum(resident_bytes(paths).values())}")

        first = tables[0]
        for k in (rng.randbytes(16) for _ in range(3)):
            first.get(k)
        s = first.filter_stats()
        print(f"after 3 lookups in {os.path.basename(first.path)}: {s['partitions_touched']} of "
              f"{s['partitions']} partitions touched, {s['resident_bytes']:,} of "
              f"{s['filter_bytes']:,} filter bytes resident")

        found = 0
        sample = [(t, k) for t, keys in zip(tables, all_keys) for k in rng.sample(keys, 1000)]
        for t, k in sample:
            seq, kind, value = t.get(k)
            found += value == b"value-of-" + k.hex().encode()
        present = {k for keys in all_keys for k in keys}
        absent = [k for k in (rng.randbytes(16) for _ in range(args.lookups)) if k not in present]
        wrong = sum(t.get(k) is not None for k in absent for t in tables)
        blocks = sum(t.data_blocks_read for t in tables)
        print(f"lookups: {found:,}/{len(sample):,} present keys found with the right value; "
              f"{len(absent):,} absent keys x {len(tables)} tables: {wrong} wrongly found; "
              f"{blocks:,} data blocks read ({cache.hits:,} block cache hits)")

        print("\nfilter report (bytes; resident = pages of each table's filter mapping present "
              "in this process, read from /proc/self/pagemap)")
        head = (f"{'table':11} {'policy':31} {'bits/key':>8} {'keys':>7} {'on disk':>8} "
                f"{'mapped':>8} {'resident':>8} {'touched':>9} {'probes':>7} {'useful':>7} "
                f"{'pos':>6} {'true+':>6} {'FPR':>7}")
        print(head)
        print("-" * len(head))
        for t in tables:
            s = t.filter_stats()
            fpr = f"{s['observed_fpr']:.4f}" if s["observed_fpr"] is not None else "-"
            print(f"{os.path.basename(t.path):11} {s['policy']:31} "
                  f"{s['effective_bits_per_key']:8.2f} {s['keys']:7,} {s['filter_bytes']:8,} "
                  f"{s['mapped_bytes']:8,} {s['resident_bytes']:8,} "
                  f"{s['partitions_touched']:>4}/{s['partitions']:<4} {s['probes']:7,} "
                  f"{s['useful']:7,} {s['positives']:6,} {s['true_positives']:6,} {fpr:>7}")
        for t in tables:
            t.close()
    finally:
        if args.dir is None:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
