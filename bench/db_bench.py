"""db_bench for engine.DB beside RocksDB (rocksdict) and LevelDB (plyvel), same run, same data.

Workloads (db_bench names), on --keys random 16-byte keys with 100-byte random values and
10 filter bits per key in every engine, no compression anywhere, 8 MiB memtables, 8 MiB
block caches, no fsync per write:

  fillrandom   put every key once, in random order (time until the last put returns; flushes
               and compactions run in the background and slow the puts down when they fall
               behind); then the tree is settled (flush + full compaction, timed apart)
  readrandom   get --reads existing keys in random order (after close and reopen)
  readmissing  get --reads keys that are not in the DB
  seekrandom   --seeks times: seek to a random key and read the next 100 entries

Also printed for sievekv: data blocks read per missing-key get per table whose key range
covers the key, peak RSS during the fill (each engine runs in its own process), and the
resident filter bytes (measured by the OS) right after open and after --reads random gets.

Each engine runs in a fresh child process; read phases report the median of 5 equal chunks
(the machine is shared, the median resists other loads); ratios are sievekv / RocksDB.

Run:  python3 bench/db_bench.py [--keys N] [--reads N] [--seeks N] [--engines a,b,c]
      python3 bench/db_bench.py --keys 100000 --profile fillrandom   # cProfile one phase
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

MiB = 1 << 20
VALUE_SIZE = 100
BITS = 10
ENGINES = ("sievekv", "rocksdb", "leveldb")
PHASES = ("fillrandom", "readrandom", "readmissing", "seekrandom")


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------
def make_data(n: int, reads: int, seed: int = 301):
    rnd = random.Random(seed)
    keys = [rnd.randbytes(16) for _ in range(n)]
    have = set(keys)
    missing = []
    while len(missing) < reads:
        k = rnd.randbytes(16)
        if k not in have:
            missing.append(k)
    blob = rnd.randbytes(VALUE_SIZE * 64 + 1)
    values = [blob[(i * 61) % (len(blob) - VALUE_SIZE):][:VALUE_SIZE] for i in range(1024)]
    read_keys = [keys[rnd.randrange(n)] for _ in range(reads)]
    return keys, values, missing, read_keys


def value_for(values, i: int) -> bytes:
    return values[i & 1023]


# ---------------------------------------------------------------------------------------------
# engines: open, put, get, seek+next, settle, close
# ---------------------------------------------------------------------------------------------
class Sievekv:
    name = "sievekv"

    def open(self, path):
        import engine

        self.db = engine.DB.open(path, memtable_bytes=8 * MiB, block_cache_bytes=8 * MiB,
                                 bits_per_key=float(BITS))
        self.put = self.db.put
        self.get = self.db.get

    def seek_next(self, key, n):
        got = 0
        for _ in self.db.scan(key, limit=n):
            got += 1
        return got

    def settle(self):
        self.db.compact()

    def close(self):
        self.db.close()


class RocksDB:
    name = "rocksdb"

    def _opts(self):
        from rocksdict import BlockBasedOptions, Cache, DBCompressionType, Options

        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.set_compression_type(DBCompressionType.none())
        opts.set_write_buffer_size(8 * MiB)
        bbo = BlockBasedOptions()
        bbo.set_bloom_filter(BITS, False)
        bbo.set_block_cache(Cache(8 * MiB))
        opts.set_block_based_table_factory(bbo)
        return opts

    def open(self, path):
        from rocksdict import Rdict

        opts = self._opts()
        # PITFALLS: reopening with Rdict(path, opts) silently drops the table options (bloom).
        if os.path.exists(os.path.join(path, "CURRENT")):
            self.db = Rdict(path, options=opts, column_families={"default": opts})
        else:
            self.db = Rdict(path, options=opts)
        self.put = self.db.put
        self.get = self.db.get

    def seek_next(self, key, n):
        it = self.db.iter()
        it.seek(key)
        got = 0
        while got < n and it.valid():
            it.key()
            it.value()
            it.next()
            got += 1
        del it
        return got

    def settle(self):
        self.db.flush()
        self.db.compact_range(None, None)

    def close(self):
        self.db.close()


class LevelDB:
    name = "leveldb"

    def open(self, path):
        import plyvel

        self.db = plyvel.DB(path, create_if_missing=True, bloom_filter_bits=BITS,
                            compression=None, write_buffer_size=8 * MiB,
                            lru_cache_size=8 * MiB)
        self.put = self.db.put
        self.get = self.db.get

    def seek_next(self, key, n):
        got = 0
        it = self.db.iterator(start=key)
        for _ in it:
            got += 1
            if got >= n:
                break
        it.close()
        return got

    def settle(self):
        # PITFALLS: compact_range() without bounds only flushes the memtable.
        self.db.compact_range(start=b"", stop=b"\xff" * 17)

    def close(self):
        self.db.close()


# ---------------------------------------------------------------------------------------------
# child: one engine, every phase
# ---------------------------------------------------------------------------------------------
class PeakRSS:
    def __init__(self):
        import psutil

        self._p = psutil.Process()
        self.peak = self._p.memory_info().rss
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def rss(self) -> int:
        """This process and its children (sievekv's table workers) together."""
        total = self._p.memory_info().rss
        for c in self._p.children(recursive=True):
            try:
                total += c.memory_info().rss
            except Exception:  # noqa: BLE001 - a child that just exited
                pass
        return total

    def _run(self):
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.rss())

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.rss())


def chunked_rate(fn, items, chunks: int = 5) -> tuple[float, float]:
    """Run fn over items in equal chunks; (median chunk ops/s, total seconds)."""
    size = max(1, len(items) // chunks)
    rates = []
    total = 0.0
    for c in range(0, len(items), size):
        part = items[c:c + size]
        t0 = time.perf_counter()
        fn(part)
        dt = time.perf_counter() - t0
        total += dt
        rates.append(len(part) / dt)
    return statistics.median(rates), total


def _sievekv_filters(db) -> dict:
    rep = db.filter_report()
    return {"resident_filter_bytes": rep["totals"]["resident_bytes"],
            "filter_bytes": rep["totals"]["filter_bytes"]}


def _covering_tables(db, keys) -> int:
    """Sum over keys of the tables whose key range covers the key (the filter probes)."""
    rs = db._rs
    tables = list(rs.l0) + [t for lv in rs.levels for t in lv[3]]
    ranges = sorted((t.smallest, t.largest) for t in tables)
    n = 0
    for k in keys:
        for lo, hi in ranges:
            if lo <= k <= hi:
                n += 1
    return n


def run_child(engine_name: str, args) -> dict:
    import cProfile
    import pstats

    import psutil

    eng = {"sievekv": Sievekv, "rocksdb": RocksDB, "leveldb": LevelDB}[engine_name]()
    keys, values, missing, read_keys = make_data(args.keys, args.reads)
    seek_keys = read_keys[: args.seeks]
    gc.collect()
    gc.freeze()
    out: dict = {"engine": engine_name, "keys": args.keys}
    path = tempfile.mkdtemp(prefix=f"dbbench-{engine_name}-", dir=args.dir)
    prof = cProfile.Profile() if args.profile else None

    def profiled(phase, fn, *a):
        if prof is not None and args.profile == phase:
            prof.enable()
            try:
                return fn(*a)
            finally:
                prof.disable()
        return fn(*a)

    try:
        eng.open(path)
        rss0 = psutil.Process().memory_info().rss

        def fill():
            put = eng.put
            for i, k in enumerate(keys):
                put(k, value_for(values, i))

        with PeakRSS() as peak:
            t0 = time.perf_counter()
            profiled("fillrandom", fill)
            out["fillrandom_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            profiled("settle", eng.settle)
            out["settle_s"] = time.perf_counter() - t0
        out["fillrandom"] = args.keys / out["fillrandom_s"]
        out["peak_rss_mib"] = peak.peak / MiB
        out["rss_growth_mib"] = (peak.peak - rss0) / MiB
        if engine_name == "sievekv":
            st = eng.db.stats()
            out["sievekv_fill_stats"] = {
                "write_stall_s": st["write_stall"]["total_seconds"],
                "compactions": st["compactions"], "flushes": st["flushes"],
                "compaction_bytes_written": st["compaction_bytes_written"],
                "worker_jobs": st["table_workers"]["jobs_in_process"],
                "levels": [(lv["level"], lv["tables"]) for lv in st["levels"] if lv["tables"]]}
        eng.close()

        t0 = time.perf_counter()
        eng.open(path)
        out["open_s"] = time.perf_counter() - t0
        if engine_name == "sievekv":
            out["after_open"] = _sievekv_filters(eng.db)

        get = eng.get
        bad = 0

        def readrandom(part):
            nonlocal bad
            for k in part:
                if get(k) is None:
                    bad += 1

        out["readrandom"], _ = profiled("readrandom", chunked_rate, readrandom, read_keys)
        if bad:
            raise SystemExit(f"{engine_name}: {bad} existing keys not found")
        if engine_name == "sievekv":
            out["after_gets"] = _sievekv_filters(eng.db)
            blocks0 = eng.db.stats()["data_blocks_read"]

        def readmissing(part):
            nonlocal bad
            for k in part:
                if get(k) is not None:
                    bad += 1

        out["readmissing"], _ = profiled("readmissing", chunked_rate, readmissing, missing)
        if bad:
            raise SystemExit(f"{engine_name}: {bad} missing keys found")
        if engine_name == "sievekv":
            blocks = eng.db.stats()["data_blocks_read"] - blocks0
            covering = _covering_tables(eng.db, missing)
            out["missing_blocks_per_get"] = blocks / len(missing)
            out["missing_blocks_per_covering_table"] = blocks / covering if covering else None
            out["missing_covering_tables_per_get"] = covering / len(missing)

        def seekrandom(part):
            nonlocal bad
            seek = eng.seek_next
            for k in part:
                if seek(k, 100) == 0:
                    bad += 1

        out["seekrandom"], _ = profiled("seekrandom", chunked_rate, seekrandom, seek_keys)
        eng.close()
    finally:
        shutil.rmtree(path, ignore_errors=True)
    if prof is not None:
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(30)
    return out


# ---------------------------------------------------------------------------------------------
# parent: one child per engine, then the table
# ---------------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--reads", type=int, default=None, help="gets per read phase (default min(keys, 100000))")
    ap.add_argument("--seeks", type=int, default=None, help="seeks (default min(keys // 10, 10000))")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--dir", default=None, help="parent directory for the DBs")
    ap.add_argument("--profile", choices=PHASES + ("settle",), default=None,
                    help="cProfile this phase of each engine (printed to stderr)")
    ap.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.reads is None:
        args.reads = min(args.keys, 100_000)
    if args.seeks is None:
        args.seeks = max(1, min(args.keys // 10, 10_000))
    if args.child:
        print(json.dumps(run_child(args.child, args)))
        return
    results = {}
    for name in args.engines.split(","):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--keys", str(args.keys),
               "--reads", str(args.reads), "--seeks", str(args.seeks)]
        if args.dir:
            cmd += ["--dir", args.dir]
        if args.profile:
            cmd += ["--profile", args.profile]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{name} failed (exit {proc.returncode})")
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    report(results, args)


def report(results: dict, args) -> None:
    base = results.get("rocksdb")
    print(f"db_bench: {args.keys:,} keys (16 B random), {VALUE_SIZE} B values, {BITS} bits/key, "
          f"{args.reads:,} gets per read phase, {args.seeks:,} seeks x 100 next")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f} at the end")
    names = list(results)
    print()
    print(f"{'workload':<14}" + "".join(f"{n + ' ops/s':>18}" for n in names)
          + (f"{'sievekv/rocksdb':>18}" if base and "sievekv" in results else ""))
    targets = {"fillrandom": 0.5, "readrandom": 0.5, "readmissing": 0.25, "seekrandom": None}
    for phase in PHASES:
        row = f"{phase:<14}" + "".join(f"{results[n][phase]:>18,.0f}" for n in names)
        if base and "sievekv" in results:
            ratio = results["sievekv"][phase] / base[phase]
            t = targets[phase]
            row += f"{ratio:>17.2f}x" + (f"  (target >= {t}x: {'met' if ratio >= t else 'MISSED'})" if t else "")
        print(row)
    print()
    print(f"{'':<28}" + "".join(f"{n:>14}" for n in names))
    for label, key, fmt in (("fill seconds", "fillrandom_s", "{:.1f}"),
                            ("settle (flush+compact) s", "settle_s", "{:.1f}"),
                            ("reopen seconds", "open_s", "{:.3f}"),
                            ("peak RSS during fill MiB *", "peak_rss_mib", "{:.0f}"),
                            ("RSS growth during fill MiB", "rss_growth_mib", "{:.0f}")):
        print(f"{label:<28}" + "".join(f"{fmt.format(results[n][key]):>14}" for n in names))
    print("* the engine's process and its child processes (sievekv's table workers)")
    s = results.get("sievekv")
    if s:
        print()
        print("sievekv:")
        print(f"  data blocks read per missing-key get: {s['missing_blocks_per_get']:.4f} "
              f"({s['missing_covering_tables_per_get']:.2f} tables cover each key; "
              f"{s['missing_blocks_per_covering_table']:.4f} per covering table, target <= 0.01)")
        print(f"  resident filter bytes after open: {s['after_open']['resident_filter_bytes']:,} "
              f"of {s['after_open']['filter_bytes']:,} filter bytes on disk")
        print(f"  resident filter bytes after {args.reads:,} random gets: "
              f"{s['after_gets']['resident_filter_bytes']:,}")
        fs = s["sievekv_fill_stats"]
        print(f"  fill: {fs['flushes']} flushes, {fs['compactions']} compactions "
              f"({fs['compaction_bytes_written'] / MiB:.0f} MiB written), write stalls "
              f"{fs['write_stall_s']:.2f} s; {fs['worker_jobs']} jobs ran in table worker processes;"
              f" levels after settle (level, tables): {fs['levels']}")


if __name__ == "__main__":
    main()
