"""How long DB.checkpoint takes, linked and copied, beside the floor of copying the same files.

    python3 bench/checkpoint_speed.py [--keys 1000000] [--rounds 5] [--dir D]

Fills one DB with --keys random 16-byte keys and 100-byte values (settled: flush + full
compaction), then, interleaved for --rounds rounds, each into a new directory removed after:

  link   DB.checkpoint(): flush (nothing to flush here), hard-link every table, write a
         manifest and CURRENT, fsync, rename (what a checkpoint on the DB's file system costs)
  copy   DB.checkpoint() on a file system that refuses hard links (a FileSystem whose link
         raises EXDEV, as a destination on another file system does): every table copied in
         1 MiB chunks and fsynced
  floor  the same .sst files copied with shutil.copyfile, each fsynced, then the directory
         (what `cp` + `sync` of the tables costs)

The source files are in the page cache after the first round, so copy and floor are bounded by
memory copies and by fsync writing to the disk. Prints per-round seconds (median, range) and
the ratio copy / floor (of MiB/s; below 1 is slower than the floor).
"""

from __future__ import annotations

import argparse
import errno
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import engine  # noqa: E402
from engine.errors import StorageIOError  # noqa: E402
from engine.vfs import FileSystem  # noqa: E402
from settled_db import fill_settled  # noqa: E402

MiB = 1 << 20


class LinksToggle(FileSystem):
    """Hard links fail with EXDEV while ``refuse`` is set (a destination on another file
    system), so the checkpoint copies."""

    refuse = False

    def link(self, src: str, dst: str) -> None:
        if self.refuse:
            raise StorageIOError("link refused (benchmark)", path=src, errno_=errno.EXDEV)
        super().link(src, dst)


def floor(tables: list[str], dest: str) -> None:
    os.mkdir(dest)
    for p in tables:
        out = os.path.join(dest, os.path.basename(p))
        shutil.copyfile(p, out)
        fd = os.open(out, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="sievekv-checkpoint-", dir=args.dir)
    try:
        path = os.path.join(root, "db")
        fs = LinksToggle()
        fill_s = fill_settled(path, args.keys, fs=fs)
        tables = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".sst"))
        size = sum(os.path.getsize(p) for p in tables)
        secs: dict[str, list[float]] = {"link": [], "copy": [], "floor": []}
        with engine.DB.open(path, fs=fs) as db:
            for r in range(args.rounds):
                order = ["link", "copy", "floor"]
                order = order[r % 3:] + order[:r % 3]
                for what in order:
                    dest = os.path.join(root, f"{what}-{r}")
                    t0 = time.perf_counter()
                    if what == "floor":
                        floor(tables, dest)
                    else:
                        fs.refuse = what == "copy"
                        got = db.checkpoint(dest)
                        want = (len(tables), 0) if what == "link" else (0, len(tables))
                        if (got["linked"], got["copied"]) != want:
                            raise SystemExit(f"{what}: unexpected report {got}")
                    secs[what].append(time.perf_counter() - t0)
                    shutil.rmtree(dest)
        ratios = [f / c for c, f in zip(secs["copy"], secs["floor"])]
        print(f"DB.checkpoint: {args.keys:,} keys, {len(tables)} tables, {size / MiB:.1f} MiB "
              f"(fill + settle {fill_s:.0f} s); {args.rounds} interleaved rounds, page cache "
              f"warm; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
        for what in ("link", "copy", "floor"):
            s = secs[what]
            print(f"  {what:<6} {statistics.median(s):8.3f} s  [{min(s):.3f}-{max(s):.3f}]  "
                  f"{size / MiB / statistics.median(s):8.0f} MiB/s")
        print(f"  copy / floor {statistics.median(ratios):.2f}x "
              f"[{min(ratios):.2f}-{max(ratios):.2f}] (of MiB/s)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
