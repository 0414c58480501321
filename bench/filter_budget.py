"""What filter_memory_budget (Monkey) buys against uniform bits per key at the same memory.

Every variant loads the same data into a fresh engine.DB: --keys distinct seeded random 16-byte
keys in random order, --value-size byte values, auto compaction on, small memtables and tables
so the tree has several levels (defaults: memtable 4 MiB, target_file_size 2 MiB,
max_bytes_for_level_base 8 MiB, table_workers as the DB's default). Then the memtable is
flushed and the DB left to settle (no compaction running and none to pick).

Variants (--variants, comma separated):

  U    bits_per_key=10, no budget (uniform)
  M    filter_memory_budget = keys x 10 / 8 bytes: the memory U's filters are built for
  U5   bits_per_key=5, no budget
  M-   filter_memory_budget = keys x 5 / 8 bytes, bits_per_key=5 (so the capacity the budget
       covers at bits_per_key, which the planner uses for the keys still to come, is --keys,
       as it is for M)
  M0   M with the planner before coverage (old_bits_for_new_table, patched in for this
       variant only): every run weighted as if every miss probed it, the L0 tables funded by
       the levels, the keys still to come one more run. The before/after comparison.

For each it prints:
- filter bytes held by the tables (FileMeta.filter_bytes, whole 4 KiB partitions), the peak
  over the load and the settle (the current version is polled every 2 ms and summed when it
  changed, so a version that lives under 2 ms can be missed) and at the end, beside the budget
  (or, without one, the bytes the filters are built for);
- filter_report()["budget"]: expected wasted table reads per missing-key lookup for Monkey's
  optimal allocation of that memory, for uniform bits at the same memory, and for the filters
  the tables really have, each run weighted by its estimated coverage (the share of misses that
  probe it); the same sum over every run unweighted (what the report gave before coverage);
  and the exact sum over only the tables whose key range covers each absent key;
- MEASURED wasted reads: the stats()["data_blocks_read"] delta over --misses gets of absent
  random 17-byte keys (inside the key range, so the table's range check does not answer; every
    block read is a filter false positive), with a 95% Poisson interval, per covering table, and
  per run from the filters' own false-positive counters (filter_report; they add up to the
  blocks);
- the shape: tables, entries, bits per key (actual and Monkey's optimum) and filter bytes per
  run (each L0 table is a run, each deeper level one run), the share of the absent keys its
  tables cover (probes/miss) beside the coverage the planner estimates from the version.

Then the ratios M / U (and M- / U5) of measured wasted reads and of filter memory. Counts do
not depend on machine load; only the load seconds do. The shape the tree settles in (above all,
whether L0 tables are left) depends on how flushes and compactions interleave with the load, so
it can differ between variants and rounds: --rounds N repeats every variant (alternating order)
and prints the median of the paired ratios; compare like shapes (the summary prints each).

Run: python3 bench/filter_budget.py [--keys 300000] [--misses 400000] [--value-size 64]
                                    [--variants U,M,U5,M-,M0] [--memtable-mib 4]
                                    [--target-file-mib 2] [--level-base-mib 8] [--seed 7]
                                    [--rounds 1]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from bisect import bisect_left

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import engine  # noqa: E402
import engine.filter_plan  # noqa: E402
from engine.compaction import pick  # noqa: E402
from engine.filter_plan import fpr_function  # noqa: E402

MiB = 1 << 20
VARIANTS = {
    # name: (bits_per_key, budget bits per key of --keys or None)
    "U": (10.0, None),
    "M": (10.0, 10),
    "U5": (5.0, None),
    "M-": (5.0, 5),
    "M0": (10.0, 10),  # M with the planner before coverage (old_bits_for_new_table)
}
PAIRS = (("M", "U"), ("M-", "U5"), ("M-", "U"), ("M0", "U"), ("M", "M0"))


def old_bits_for_new_table(options, levels, out_level, new_entries, removed=None,
                           last_level=False):
    """The planner before coverage (engine/filter_plan.py at commit d0b4f2d), for variant M0:
    Monkey as if every miss probed every run, the L0 tables funded by the levels, the keys
    still to come one more run."""
    from engine.filter_budget import allocate
    from engine.filter_plan import MIN_BITS_PER_KEY, keys_to_come, runs_of

    if options.filter_policy is None:
        return 0.0
    if options.optimize_filters_for_hits and last_level:
        return 0.0
    runs, _ids, target = runs_of(levels, out_level, new_entries, removed)
    runs = runs + [keys_to_come(options, runs)]
    alloc = allocate(runs, options.filter_memory_budget, fpr_function(options))
    bits = alloc.bits_per_key[target]
    return bits if bits >= MIN_BITS_PER_KEY else 0.0


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------
def make_data(n: int, misses: int, value_size: int, seed: int):
    """n distinct 16-byte keys (random order), values, and ``misses`` absent 17-byte keys."""
    rnd = random.Random(seed)
    keys = list({rnd.randbytes(16) for _ in range(n + n // 100 + 16)})[:n]
    rnd.shuffle(keys)
    if len(keys) < n:
        raise SystemExit("not enough distinct keys: pick another seed")
    blob = rnd.randbytes(value_size * 64 + 1)
    values = [blob[(i * 61) % (len(blob) - value_size):][:value_size] for i in range(1024)]
    absent = [rnd.randbytes(17) for _ in range(misses)]  # 17 bytes: never a stored key
    return keys, values, absent


# ---------------------------------------------------------------------------------------------
# one variant
# ---------------------------------------------------------------------------------------------
class HeldSampler:
    """Polls the DB's current version every 2 ms; at each new version sums the tables' filter
    bytes and keeps the peak (and how many keys had been put when it was reached)."""

    def __init__(self, db, progress):
        self.db = db
        self.progress = progress  # callable: keys put so far
        self.peak = 0
        self.peak_at = 0
        self.versions = 0
        self._last = None
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        rs = self.db._rs
        if rs is None or rs.version is self._last:
            return
        self._last = rs.version
        self.versions += 1
        held = sum(f.filter_bytes for files in rs.version.levels for f in files)
        if held > self.peak:
            self.peak, self.peak_at = held, self.progress()

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self.sample()

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.sample()


def settle(db, sampler: HeldSampler, timeout_s: float = 600.0) -> None:
    """Flush, then wait until no compaction runs and none would be picked, three polls in a
    row (a compaction can start between two polls)."""
    db.flush()
    quiet = 0
    deadline = time.monotonic() + timeout_s
    while quiet < 3:
        if time.monotonic() > deadline:
            raise SystemExit("DB did not settle")
        time.sleep(0.1)
        sampler.sample()
        st = db.stats()
        if st["failed"]:
            raise SystemExit(f"background error: {st['failed']}")
        busy = st["compaction_running"] is not None or pick(db._rs.version, db.options) is not None
        quiet = 0 if busy else quiet + 1


def covering_per_run(db, keys) -> list[tuple[int, float]]:
    """Per run (each L0 table, then each non-empty level): how many of ``keys`` its tables' key
    ranges cover (the filter probes those misses make there), and the false positives the
    tables' filters are expected to give on them (each covering table's policy FPR at the bits
    per key it was built with, before page padding)."""
    fpr_of = fpr_function(db.options)
    levels = db._rs.version.levels
    runs = [[f] for f in levels[0]] + [list(files) for files in levels[1:] if files]
    out = []
    for files in runs:
        largests = [f.largest for f in files]
        fprs = [fpr_of(f.filter_bits_per_key) if f.filter_bits_per_key > 0 else 1.0
                for f in files]
        n = 0
        expected = 0.0
        for k in keys:
            i = bisect_left(largests, k)
            if i < len(files) and files[i].smallest <= k:
                n += 1
                expected += fprs[i]
        out.append((n, expected))
    return out


def run_variant(name: str, args, keys, values, absent, root: str) -> dict:
    bits, budget_bits = VARIANTS[name]
    budget = None if budget_bits is None else args.keys * budget_bits // 8
    opts = dict(memtable_bytes=int(args.memtable_mib * MiB),
                target_file_size=int(args.target_file_mib * MiB),
                max_bytes_for_level_base=int(args.level_base_mib * MiB), bits_per_key=bits,
                filter_memory_budget=budget)
    path = os.path.join(root, name)
    import engine.background
    import engine.recovery
    planner = old_bits_for_new_table if name == "M0" else engine.filter_plan.bits_for_new_table
    engine.background.bits_for_new_table = engine.recovery.bits_for_new_table = planner
    put_count = [0]
    db = engine.DB.open(path, **opts)
    try:
        t0 = time.perf_counter()
        with HeldSampler(db, lambda: put_count[0]) as sampler:
            put = db.put
            for i, k in enumerate(keys):
                put(k, values[i & 1023])
                put_count[0] = i + 1
            load_s = time.perf_counter() - t0
            settle(db, sampler)
        settle_s = time.perf_counter() - t0 - load_s
        st = db.stats()
        rep = db.filter_report()
        b = rep["budget"]
        held_end = b["filter_bytes"]
        covering = covering_per_run(db, absent)
        fp_before = {r["file_number"]: r.get("false_positives") or 0
                     for lv in rep["levels"] for r in lv["tables"]}
        blocks0 = st["data_blocks_read"]
        get = db.get
        for k in absent:
            if get(k) is not None:
                raise SystemExit(f"{name}: absent key {k.hex()} found")
        blocks = db.stats()["data_blocks_read"] - blocks0
        rep2 = db.filter_report()
        fp = {r["file_number"]: (r.get("false_positives") or 0) - fp_before.get(r["file_number"], 0)
              for lv in rep2["levels"] for r in lv["tables"]}
        levels = db._rs.version.levels
        runs = []
        for r, cov in zip(b["runs"], covering):
            files = [levels[0][r["l0_index"]]] if r["level"] == 0 else levels[r["level"]]
            runs.append({"level": r["level"], "entries": r["entries"], "tables": len(files),
                         "bits": r["actual_bits_per_key"], "opt_bits": r["optimal_bits_per_key"],
                         "coverage": r["coverage"],
                         "fpr": r["actual_fpr"], "filter_bytes": r["filter_bytes"],
                         "no_filter": r["tables_without_filter"], "covering": cov[0],
                         "exp_fp": cov[1], "fp": sum(fp.get(f.number, 0) for f in files)})
        c = st["counters"]
        return {
            "name": name, "bits_per_key": bits, "budget": budget,
            "built_for": int(sum(f.filter_bits_per_key * f.num_entries
                                 for files in db._rs.version.levels for f in files) / 8),
            "held_peak": sampler.peak, "held_peak_at": sampler.peak_at, "held_end": held_end,
            "versions": sampler.versions,
            "exp_optimal": b["expected_reads_per_miss_optimal"],
            "exp_uniform": b["expected_reads_per_miss_uniform"],
            "uniform_bits": b["uniform_bits_per_key"],
            "exp_actual": b["expected_reads_per_miss_actual"],
            "exp_actual_all": sum(r["actual_fpr"] for r in b["runs"]),
            "blocks": blocks, "misses": len(absent),
            "covering": sum(c[0] for c in covering),
            "exp_covered": sum(c[1] for c in covering) / len(absent),
            "fp": sum(fp.values()), "runs": runs,
            "load_s": load_s, "settle_s": settle_s,
            "flushes": c["flushes"], "compactions": c["compactions"],
            "trivial_moves": c["trivial_moves"],
            "compaction_mib": c["compaction_bytes_written"] / MiB,
            "table_workers": st["table_workers"]["processes"],
        }
    finally:
        db.close()
        shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------
def poisson95(k: int, n: int) -> tuple[float, float]:
    """95% interval of a rate k/n for a Poisson count k (normal approximation, +-1.96 sqrt k)."""
    half = 1.96 * math.sqrt(k) if k else 3.0
    return max(0.0, (k - half) / n), (k + half) / n


def print_variant(r: dict) -> None:
    budget = f"budget {r['budget']:,} B" if r["budget"] is not None else "no budget"
    print(f"{r['name']}: bits_per_key {r['bits_per_key']:g}, {budget}; load {r['load_s']:.1f} s, "
          f"settle {r['settle_s']:.1f} s; {r['flushes']} flushes, {r['compactions']} compactions "
          f"({r['trivial_moves']} trivial moves, {r['compaction_mib']:.0f} MiB written), "
          f"{r['table_workers']} table worker processes")
    print(f"  {'run':<5}{'tables':>7}{'entries':>10}{'bits/key':>9}{'optimal':>8}{'filter B':>10}"
          f"{'eff bits':>9}{'no filter':>10}{'exp FPR':>9}{'probes/miss':>12}{'est cov':>8}"
          f"{'exp FP/miss':>12}{'FP/miss':>9}")
    n = r["misses"]
    for x in r["runs"]:
        eff = 8 * x["filter_bytes"] / x["entries"] if x["entries"] else 0.0
        print(f"  L{x['level']:<4}{x['tables']:>7}{x['entries']:>10,}{x['bits']:>9.2f}"
              f"{x['opt_bits']:>8.2f}{x['filter_bytes']:>10,}{eff:>9.2f}{x['no_filter']:>10}"
              f"{x['fpr']:>9.5f}{x['covering'] / n:>12.3f}{x['coverage']:>8.3f}"
              f"{x['exp_fp'] / n:>12.5f}{x['fp'] / n:>9.5f}")
    print(f"  {'all':<5}{sum(x['tables'] for x in r['runs']):>7}"
          f"{sum(x['entries'] for x in r['runs']):>10,}{'':>17}"
          f"{sum(x['filter_bytes'] for x in r['runs']):>10,}{'':>28}"
          f"{r['covering'] / n:>12.3f}{'':>8}{r['exp_covered']:>12.5f}{r['fp'] / n:>9.5f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=300_000)
    ap.add_argument("--misses", type=int, default=400_000, help="gets of absent keys per variant")
    ap.add_argument("--value-size", type=int, default=64)
    ap.add_argument("--variants", default="U,M,U5,M-")
    ap.add_argument("--memtable-mib", type=float, default=4)
    ap.add_argument("--target-file-mib", type=float, default=2)
    ap.add_argument("--level-base-mib", type=float, default=8)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=1,
                    help="load every variant this many times (alternating order) and report "
                         "the median of the paired ratios: the tree's final shape depends on "
                         "how flushes and compactions interleave with the load")
    ap.add_argument("--dir", default=None, help="parent directory for the DBs")
    args = ap.parse_args()
    names = args.variants.split(",")
    for n in names:
        if n not in VARIANTS:
            raise SystemExit(f"unknown variant {n!r} (known: {', '.join(VARIANTS)})")
    t_start = time.perf_counter()
    keys, values, absent = make_data(args.keys, args.misses, args.value_size, args.seed)
    print(f"filter_budget: {args.keys:,} keys (16 B random, seed {args.seed}), "
          f"{args.value_size} B values; memtable {args.memtable_mib:g} MiB, target_file_size "
          f"{args.target_file_mib:g} MiB, max_bytes_for_level_base {args.level_base_mib:g} MiB, "
          f"auto compaction, default filter policy ({engine.Options.from_kwargs().filter_policy}); "
          f"{args.misses:,} gets of absent 17-byte keys per variant; {args.rounds} round(s)")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f} at the start")
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)  # a --dir that does not exist yet is made
    root = tempfile.mkdtemp(prefix="filterbudget-", dir=args.dir)
    rounds: list[dict] = []
    try:
        for rnd in range(args.rounds):
            results = {}
            for n in (names if rnd % 2 == 0 else names[::-1]):
                results[n] = run_variant(n, args, keys, values, absent, root)
            rounds.append(results)
            print()
            print(f"round {rnd + 1}")
            for n in names:
                print_variant(results[n])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print()
    print("filter memory (bytes held by the tables: whole 4 KiB partitions) and wasted table reads "
          "per missing-key get")
    print(f"{'':<7}{'budget B':>10}{'built for':>11}{'peak held':>11}{'/budget':>8}"
          f"{'end held':>10}{'/budget':>8}{'exp opt':>8}{'exp unif':>9}{'exp all':>8}{'exp act':>8}"
          f"{'exp cover':>10}{'measured':>9}{'95% interval':>15}{'probes':>7}{'per probe':>10}"
          f"  shape (tables per level)")
    for rnd, results in enumerate(rounds):
        for n in names:
            r = results[n]
            ref = r["budget"] if r["budget"] is not None else r["built_for"]
            lo, hi = poisson95(r["blocks"], r["misses"])
            label = f"{n}" + (f" r{rnd + 1}" if args.rounds > 1 else "")
            print(f"{label:<7}{(r['budget'] or 0):>10,}{r['built_for']:>11,}{r['held_peak']:>11,}"
                  f"{r['held_peak'] / ref:>8.2f}{r['held_end']:>10,}{r['held_end'] / ref:>8.2f}"
                  f"{r['exp_optimal']:>8.4f}{r['exp_uniform']:>9.4f}{r['exp_actual_all']:>8.4f}"
                  f"{r['exp_actual']:>8.4f}"
                  f"{r['exp_covered']:>10.4f}{r['blocks'] / r['misses']:>9.4f}"
                  f"{f'{lo:.4f}-{hi:.4f}':>15}{r['covering'] / r['misses']:>7.2f}"
                  f"{r['blocks'] / r['covering']:>10.4f}  {shape(r)}")
    print("""(budget B: the option, 0 = none. built for: bits per key x entries of the tables at the
end. /budget: held bytes over the budget, or over the built-for bytes without one. exp opt, exp
unif, exp act: filter_report()["budget"] expected wasted reads per miss for Monkey's optimum of
that memory, for uniform bits at that memory, and for the filters the tables have, each run
weighted by its estimated coverage. exp all: the last summed over every run unweighted (the
report before coverage). exp cover: the tables' FPRs at their built bits, summed over the
tables whose key range really covers each absent key. measured: data blocks read per absent-key
get, 95% Poisson interval. probes: tables covering an absent key, per get. per probe: measured
per covering table)""")
    print()
    for a, b in PAIRS:
        if a not in names or b not in names:
            continue
        def ratios(key):
            return [key(res[a]) / key(res[b]) for res in rounds if key(res[b])]
        wasted = ratios(lambda r: r["blocks"] / r["misses"])
        per_probe = ratios(lambda r: r["blocks"] / r["covering"])
        end = ratios(lambda r: r["held_end"])
        peak = ratios(lambda r: r["held_peak"])
        exp = ratios(lambda r: r["exp_actual"])
        print(f"{a} / {b}: measured wasted reads per miss {fmt_ratios(wasted)}, per covering "
              f"probe {fmt_ratios(per_probe)}; filter bytes at the end {fmt_ratios(end)}, "
              f"peak {fmt_ratios(peak)}; filter_report expected (actual filters) "
              f"{fmt_ratios(exp)}")
    if args.rounds > 1:
        print("(median of the per-round ratios [min-max])")
    for n in names:
        at = sorted(res[n]["held_peak_at"] for res in rounds)
        print(f"{n}: peak held when {', '.join(f'{x:,}' for x in at)} of {args.keys:,} keys "
              f"had been put (versions sampled: "
              f"{', '.join(str(res[n]['versions']) for res in rounds)})")
    print(f"total run time {time.perf_counter() - t_start:.0f} s")


def shape(r: dict) -> str:
    l0 = sum(1 for x in r["runs"] if x["level"] == 0)
    parts = [f"L0:{l0}"] if l0 else []
    parts += [f"L{x['level']}:{x['tables']}" for x in r["runs"] if x["level"] > 0]
    return " ".join(parts)


def fmt_ratios(xs: list[float]) -> str:
    if not xs:
        return "n/a"
    if len(xs) == 1:
        return f"{xs[0]:.2f}x"
    return f"{statistics.median(xs):.2f}x [{min(xs):.2f}-{max(xs):.2f}]"


if __name__ == "__main__":
    main()
