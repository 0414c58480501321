"""Disk space after deletes, with tombstone compactions off (the old behaviour) and on.

Each workload runs three times in one process, on a fresh DB each time, with
``tombstone_compaction_ratio`` = 0 (off), = --ratio with ``tombstone_compaction_delay`` 0 (on0:
no idle time, as in session 11) and = --ratio with --delay (on: the option's default delay
unless given), everything else at its default:

- delete-random / delete-range: fill --keys keys (--value-size byte values), settle (flush, a
  full compaction, wait until the background work is done), delete --fraction of the keys
  (random ones, or one contiguous range), flush, then write nothing and wait until the
  background work is done, including what the delay held back
  (DB.wait_for_compactions(delayed=True): no compaction running, due, or waiting for its
  tables to be old enough; the compaction thread wakes up by itself). Prints the table bytes
  before the deletes and after, the live bytes (keys + values still present), what a manual
  compaction would leave (the floor), the seconds from the flush of the deletes until idle
  (with a delay: how long the space took to come back), and the bytes the compactions wrote
  and read in that phase (the write-amplification cost).
- overwrite / insert: the same fill and settle, then overwrite --fraction of the keys with new
  values, or insert that many new keys: no tombstones, so the option must not add a
  compaction (the same compactions and bytes with it on and off).
- churn: the same fill and settle, then --churn-ops writes of random existing keys, of which
  --churn-deletes are deletes and the rest overwrites or re-inserts, flushing as the memtable
  fills: the cost of the option under a steady load with deletes.

Every run checks its answers: after the workload settles and again after the final manual
compaction, a full scan must equal the workload's model (every live key with its value, no
other key); a mismatch stops the run with exit status 1.

Usage: python3 bench/delete_space.py [--keys 200000] [--fraction 0.9] [--ratio 0.2]
       [--delay SECONDS]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import DB  # noqa: E402
from engine.filenames import table_file_name  # noqa: E402
from engine.options import Options  # noqa: E402

MiB = 1 << 20
BATCH = 2000


def table_bytes(db) -> int:
    return sum(os.path.getsize(table_file_name(db.path, f.number))
               for _, f in db._version.all_files())


def key(i: int) -> bytes:
    return b"key%012d" % i


def write_all(db, ops) -> None:
    for lo in range(0, len(ops), BATCH):
        db.write(ops[lo:lo + BATCH])


def settle(db) -> float:
    """Flush, then wait (no writes) until nothing runs, is due or is held back by the delay;
    the seconds that took."""
    t0 = time.perf_counter()
    db.flush()
    if not db.wait_for_compactions(3600, delayed=True):
        raise RuntimeError("background work did not finish")
    return time.perf_counter() - t0


def check(db, model: dict, when: str) -> None:
    """A full scan of ``db`` must be ``model`` (key -> value), in key order; else exit 1."""
    n = 0
    want = iter(sorted(model.items()))
    for got in db.scan():
        exp = next(want, None)
        if got != exp:
            model_has = f"{exp[0]!r} ({len(exp[1])} bytes)" if exp else "nothing"
            what = "a different value" if exp and exp[0] == got[0] else "another key"
            sys.exit(f"WRONG ANSWER {when}: entry {n} of the scan is {got[0]!r} "
                     f"({len(got[1])} bytes, {what}), the model has {model_has}")
        n += 1
    if n != len(model):
        sys.exit(f"WRONG ANSWER {when}: the scan has {n} keys, the model {len(model)}")


def run(workload: str, args, ratio: float, delay: float) -> dict:
    d = tempfile.mkdtemp(prefix="sievekv-delspace-")
    try:
        rng = random.Random(1)
        live: dict[bytes, bytes] = {}  # the model: every live key and its value
        with DB.open(d, tombstone_compaction_ratio=ratio,
                     tombstone_compaction_delay=delay) as db:
            fill = [(key(i), rng.randbytes(args.value_size)) for i in range(args.keys)]
            write_all(db, fill)
            live.update(fill)
            db.flush()
            db.compact()
            db.wait_for_compactions(3600)
            before = table_bytes(db)
            s0 = db.stats()
            n = int(args.keys * args.fraction)
            if workload == "delete-random":
                ops = [(key(i), None) for i in rng.sample(range(args.keys), n)]
            elif workload == "delete-range":
                start = (args.keys - n) // 2
                ops = [(key(i), None) for i in range(start, start + n)]
            elif workload == "overwrite":
                ops = [(key(i), rng.randbytes(args.value_size))
                       for i in rng.sample(range(args.keys), n)]
            elif workload == "insert":
                ops = [(key(args.keys + i), rng.randbytes(args.value_size)) for i in range(n)]
            elif workload == "churn":
                ops = []
                for _ in range(args.churn_ops):
                    k = key(rng.randrange(args.keys))
                    ops.append((k, None if rng.random() < args.churn_deletes
                                else rng.randbytes(args.value_size)))
            else:
                raise ValueError(workload)
            t0 = time.perf_counter()
            write_all(db, ops)
            write_s = time.perf_counter() - t0
            for k, v in ops:
                if v is None:
                    live.pop(k, None)
                else:
                    live[k] = v
            settle_s = settle(db)
            s1 = db.stats()
            after = table_bytes(db)
            tombstones = sum(lv["tombstones"] for lv in s1["levels"])
            check(db, live, f"{workload} ratio {ratio} delay {delay} after the settle")
            db.compact()
            floor = table_bytes(db)
            check(db, live, f"{workload} ratio {ratio} delay {delay} after compact()")
        by = {r: c - s0["compactions_by_reason"].get(r, 0)
              for r, c in s1["compactions_by_reason"].items()
              if c - s0["compactions_by_reason"].get(r, 0)}
        return {"before": before, "after": after, "floor": floor,
                "live": sum(len(k) + len(v) for k, v in live.items()), "keys_live": len(live),
                "tombstones": tombstones,
                "write_s": write_s, "settle_s": settle_s,
                "written": s1["compaction_bytes_written"] - s0["compaction_bytes_written"],
                "read": s1["compaction_bytes_read"] - s0["compaction_bytes_read"],
                "compactions": s1["compactions"] - s0["compactions"], "by_reason": by}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def mib(x: int) -> str:
    return f"{x / MiB:.1f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=int, default=200_000)
    p.add_argument("--value-size", type=int, default=100)
    p.add_argument("--fraction", type=float, default=0.9)
    p.add_argument("--ratio", type=float, default=0.2, help="tombstone_compaction_ratio when on")
    p.add_argument("--delay", type=float, default=Options.tombstone_compaction_delay,
                   help="tombstone_compaction_delay of the 'on' runs (default: the option's)")
    p.add_argument("--churn-ops", type=int, default=400_000)
    p.add_argument("--churn-deletes", type=float, default=0.3)
    p.add_argument("--workloads", default="delete-random,delete-range,overwrite,insert,churn")
    args = p.parse_args()
    print(f"# {args.keys:,} keys of {args.value_size}-byte values; fraction {args.fraction}; "
          f"on0 = tombstone_compaction_ratio {args.ratio}, delay 0; on = ratio {args.ratio}, "
          f"delay {args.delay:g} s; churn: {args.churn_ops:,} writes, "
          f"{args.churn_deletes:.0%} deletes; sizes in MiB; settle_s: from the flush of the "
          f"workload's last writes until idle, held-back work included")
    print("workload       option  before  after  after/before  live  floor  tombstones  "
          "settle_s  compactions  written  read  by reason")
    for w in args.workloads.split(","):
        for name, ratio, delay in (("off", 0.0, 0.0), ("on0", args.ratio, 0.0),
                                   ("on", args.ratio, args.delay)):
            r = run(w, args, ratio, delay)
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(r["by_reason"].items())) or "-"
            print(f"{w:<14} {name:<6} {mib(r['before']):>7} {mib(r['after']):>6} "
                  f"{r['after'] / r['before']:>13.2f} {mib(r['live']):>5} {mib(r['floor']):>6} "
                  f"{r['tombstones']:>11,} {r['settle_s']:>9.2f} {r['compactions']:>12} "
                  f"{mib(r['written']):>8} {mib(r['read']):>5}  {reasons}", flush=True)


if __name__ == "__main__":
    main()
