"""Write amplification of tombstone compactions under a steady load with deletes.

bench/delete_space.py measures space after deletes on a settled DB that then goes idle; this
measures what the option costs while deletes keep coming. Each workload runs three times in one
process on a fresh DB, with the same writes (same seed): ``tombstone_compaction_ratio`` 0
(off), --ratio with ``tombstone_compaction_delay`` 0 (on0: the rule as in session 11, no idle
time) and --ratio with --delay (on: the default delay unless given), on options scaled down 32x
from the defaults (memtable 256 KiB, L1 target 2 MiB, tables 128 KiB) so that some hundred
thousand writes make several flushes per level (since session 13 a memtable entry is charged
240 bytes besides its key and value, so 256 KiB holds ~865 entries of a queue, not ~3,300:
these loads flush faster than L0 empties; bench/results/db.md "Session 14" compares 768 KiB):

- queue / queue-small: insert ascending keys; once --live (or 5,000) keys exist, delete the
  oldest after each insert (~50% deletes once full).
- ttl: phases of 2,000 inserts of new keys and, once 50,000 exist, 2,000 deletes of the oldest
  (each flush mostly puts or mostly deletes).
- random30 / random50: random keys of 100,000, 30% or 50% deletes, the rest puts.

Printed: the share of deletes, user bytes (keys + values), flush bytes, compaction bytes
written, WA = (flush + compaction bytes written) / user bytes, table bytes at the end, live
bytes, seconds, all when the load ends (flushed, nothing due: DB.wait_for_compactions); then
after the DB goes idle (no more writes; DB.wait_for_compactions(delayed=True): the work the
delay held back has run): the compaction bytes written in all, the table bytes, the seconds it
took; compactions by reason during the load, and those that ran once idle. Every run's final
scan is checked against a dict model.

Usage: python3 bench/tombstone_steady_wa.py [--ops 600000] [--workloads queue-small,ttl]
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

KiB, MiB = 1 << 10, 1 << 20
SCALED = dict(memtable_bytes=256 * KiB, max_bytes_for_level_base=2 * MiB,
              target_file_size=128 * KiB)


def key(i: int) -> bytes:
    return b"k%012d" % i


def ops_queue(rng, n_ops, live, vsize):
    lo = hi = out = 0
    while out < n_ops:
        yield key(hi), rng.randbytes(vsize)
        hi += 1
        out += 1
        if hi - lo > live:
            yield key(lo), None
            lo += 1
            out += 1


def ops_ttl(rng, n_ops, live, vsize, phase=2000):
    lo = hi = out = 0
    while out < n_ops:
        for _ in range(phase):
            yield key(hi), rng.randbytes(vsize)
            hi += 1
            out += 1
        if hi - lo > live:
            for _ in range(phase):
                yield key(lo), None
                lo += 1
                out += 1


def ops_random(rng, n_ops, keys, vsize, dels):
    for _ in range(n_ops):
        k = key(rng.randrange(keys))
        yield (k, None) if rng.random() < dels else (k, rng.randbytes(vsize))


def table_bytes(db) -> int:
    return sum(os.path.getsize(table_file_name(db.path, f.number))
               for _, f in db._version.all_files())


def run(gen, ratio: float, delay: float) -> dict:
    d = tempfile.mkdtemp(prefix="sievekv-steadywa-")
    try:
        model: dict = {}
        user = n_del = n = 0
        with DB.open(d, tombstone_compaction_ratio=ratio, tombstone_compaction_delay=delay,
                     **SCALED) as db:
            t0 = time.perf_counter()
            batch = []
            for k, v in gen:
                batch.append((k, v))
                n += 1
                user += len(k) + (len(v) if v is not None else 0)
                if v is None:
                    n_del += 1
                    model.pop(k, None)
                else:
                    model[k] = v
                if len(batch) == 100:
                    db.write(batch)
                    batch = []
            if batch:
                db.write(batch)
            db.flush()
            if not db.wait_for_compactions(3600):
                raise RuntimeError("background work did not finish")
            s = db.stats()
            secs = time.perf_counter() - t0
            tables = table_bytes(db)
            # Idle: no more writes; wait for what the delay held back (the compaction thread
            # wakes up by itself).
            t1 = time.perf_counter()
            if not db.wait_for_compactions(3600, delayed=True):
                raise RuntimeError("held-back work did not finish")
            idle_s = time.perf_counter() - t1
            s2 = db.stats()
            if list(db.scan()) != sorted(model.items()):
                raise AssertionError("the DB's contents differ from the model")
            return dict(user=user, dels=n_del / max(1, n), flush=s["flush_bytes"],
                        comp=s["compaction_bytes_written"], by=s["compactions_by_reason"],
                        by_idle={r: c - s["compactions_by_reason"].get(r, 0)
                                 for r, c in s2["compactions_by_reason"].items()
                                 if c - s["compactions_by_reason"].get(r, 0)},
                        tables=tables, comp_idle=s2["compaction_bytes_written"],
                        tables_idle=table_bytes(db), idle_s=idle_s,
                        live=sum(len(k) + len(v) for k, v in model.items()), secs=secs)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", type=int, default=600_000)
    p.add_argument("--ratio", type=float, default=0.2)
    p.add_argument("--value-size", type=int, default=100)
    p.add_argument("--live", type=int, default=50_000, help="live keys of the queue workload")
    p.add_argument("--workloads", default="queue-small,queue,ttl,random30,random50")
    p.add_argument("--delay", type=float, default=Options.tombstone_compaction_delay,
                   help="tombstone_compaction_delay of the 'on' runs (default: the option's)")
    a = p.parse_args()
    print(f"# {a.ops:,} writes, {a.value_size}-byte values, options {SCALED}; "
          f"on0 = tombstone_compaction_ratio {a.ratio}, delay 0; on = ratio {a.ratio}, "
          f"delay {a.delay:g} s; sizes in MiB; load = when the load ends, idle = after "
          f"the held-back work ran")
    print("                       --------------- load ---------------  ---------- idle ---------")
    print("workload     opt  del%  user  flush  compaction    WA  tables  live  secs  "
          "compaction  tables   secs  by reason (load; idle: more)")
    for w in a.workloads.split(","):
        for name, ratio, delay in (("off", 0.0, 0.0), ("on0", a.ratio, 0.0),
                                   ("on", a.ratio, a.delay)):
            rng = random.Random(7)
            gen = {"queue": lambda: ops_queue(rng, a.ops, a.live, a.value_size),
                   "queue-small": lambda: ops_queue(rng, a.ops, 5_000, a.value_size),
                   "ttl": lambda: ops_ttl(rng, a.ops, 50_000, a.value_size),
                   "random30": lambda: ops_random(rng, a.ops, 100_000, a.value_size, 0.3),
                   "random50": lambda: ops_random(rng, a.ops, 100_000, a.value_size, 0.5),
                   }[w]()
            r = run(gen, ratio, delay)
            wa = (r["flush"] + r["comp"]) / r["user"]
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(r["by"].items())) or "-"
            if r["by_idle"]:
                reasons += "; idle: " + ", ".join(f"{k} {v}"
                                                  for k, v in sorted(r["by_idle"].items()))
            print(f"{w:<12} {name:<4} {r['dels'] * 100:4.0f} {r['user'] / MiB:5.1f} "
                  f"{r['flush'] / MiB:6.1f} {r['comp'] / MiB:11.1f} {wa:5.2f} "
                  f"{r['tables'] / MiB:7.1f} {r['live'] / MiB:5.1f} {r['secs']:5.0f}  "
                  f"{r['comp_idle'] / MiB:10.1f} {r['tables_idle'] / MiB:7.1f} "
                  f"{r['idle_s']:6.1f}  {reasons}", flush=True)


if __name__ == "__main__":
    main()
