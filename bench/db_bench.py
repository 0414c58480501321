"""db_bench for engine.DB beside RocksDB (rocksdict) and LevelDB (plyvel), same run, same data.

Workloads (db_bench names), on --keys random 16-byte keys with 100-byte random values and
10 filter bits per key in every engine, no compression anywhere, --memtable-mib memtables
(write buffers) and 8 MiB block caches, no fsync per write. Gets read data blocks through a
memory mapping of each table in every engine: sievekv's default (mmap_reads), LevelDB's on
64-bit hosts, and RocksDB's allow_mmap_reads, set here so that all three read the same way
(--rocksdb-pread gives RocksDB its default instead, pread through its 8 MiB block cache, as
every run recorded before this option did: at 1M keys RocksDB's present-key gets then cost
~1.65x more CPU (interleaved chunks, thread CPU time), which flattered sievekv's readrandom).

  fillrandom   put every key once, in random order (time until the last put returns; flushes
               and compactions run in the background and slow the puts down when they fall
               behind); then the memtable is flushed and the tree settled (full compaction),
               each timed apart
  fill+flush   the same puts until the last memtable is in a table. Printed beside fillrandom
               because when the last put returns one engine may still owe more of its flush
               work than the other. Both count a memtable's memory (sievekv: key + value + 176,
               its Python objects; RocksDB: its arena, ~148 B per entry here); at 1M keys and
               64 MiB sievekv holds ~230k entries per memtable (RocksDB ~270k). Until
               session 13 sievekv counted key + value + 16, held all 1M entries (two
               memtables), and its final flush took 2.6 s; in session 13, + 240 (188k)
  readrandom   get --reads existing keys in random order (after close and reopen)
  readmissing  get --reads keys that are not in the DB
  seekrandom   --seeks times: seek to a random key and read the next 100 entries

How it is measured (the machine is shared and its load moves a lot, so the comparison is
built to resist that):
- Each engine fills its DB in its own fresh process (peak RSS of that process and its
  children, i.e. sievekv's table workers, is sampled every 20 ms). With --fill-rounds N the
  fills are repeated in alternating engine order and the median is kept.
- The read phases run in one process holding all the DBs open, interleaved: each phase is cut
  into 10 chunks and every chunk is run on every engine back to back (rotating which engine
  goes first), so all engines see the same load. The ratio printed is the median over chunks
  of (sievekv rate / RocksDB rate); the ops/s columns are each engine's median chunk. The same
  ratio is also printed from the reading thread's CPU time per chunk, and the fill's CPU
  seconds (process + table workers), which a loaded machine moves less than wall time.
- Answers are checked: the timed loops count a get that finds nothing for a present key (or
  a value for a missing one) and a seek that returns nothing, and stop the run on any; untimed,
  every engine must return the value that was put for a sample of each phase's keys, and the
  same entries for a sample of seeks (the same total for all seeks).

Also printed for sievekv: data blocks read per missing-key get per table whose key range
covers the key, and the resident filter bytes (measured by the OS) right after open and after
--reads random gets.

Run:  python3 bench/db_bench.py [--keys N] [--reads N] [--seeks N] [--engines a,b,c]
                                [--memtable-mib M] [--fill-rounds R]
      python3 bench/db_bench.py --keys 100000 --profile fillrandom   # cProfile one phase
"""

from __future__ import annotations

import argparse
import gc
import itertools
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

from bench_deps import require  # noqa: E402  (bench/ is sys.path[0] when run as a script)

MiB = 1 << 20
VALUE_SIZE = 100
BITS = 10
ENGINES = ("sievekv", "rocksdb", "leveldb")
PHASES = ("fillrandom", "readrandom", "readmissing", "seekrandom")
READ_PHASES = PHASES[1:]
MEMTABLE = 8 * MiB  # set from --memtable-mib
ROCKSDB_MMAP = True  # cleared by --rocksdb-pread
CHUNKS = 10
VERIFY_SAMPLE = 2000  # keys per read phase whose values are compared across engines (untimed)


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

        # compression off: the run compares engines with "no compression anywhere" (RocksDB
        # and LevelDB below too); the engine's default is lz4 since session 11
        # (bench/compression.py; these random values would be stored raw under it anyway)
        self.db = engine.DB.open(path, memtable_bytes=MEMTABLE, block_cache_bytes=8 * MiB,
                                 bits_per_key=float(BITS), compression="none")
        self.put = self.db.put
        self.get = self.db.get

    def seek_next(self, key, n):
        got = 0
        for _ in self.db.scan(key, limit=n):
            got += 1
        return got

    def seek_items(self, key, n):
        return list(self.db.scan(key, limit=n))

    def flush(self):
        self.db.flush()

    def memtable_entries(self) -> int:
        rs = self.db._rs  # stats() counts the frozen memtables' bytes, not their entries
        return len(rs.mem) + sum(len(m) for m in rs.frozen)

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
        opts.set_write_buffer_size(MEMTABLE)
        opts.set_allow_mmap_reads(ROCKSDB_MMAP)
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
        # items(): one call per entry yielding (key, value), as sievekv's scan and plyvel's
        # iterator do (iter() with valid/key/value/next took four calls: ~1.2x slower here)
        got = 0
        for _ in self.db.items(from_key=key):
            got += 1
            if got >= n:
                break
        return got

    def seek_items(self, key, n):
        return list(itertools.islice(self.db.items(from_key=key), n))

    def flush(self):
        self.db.flush()

    def memtable_entries(self) -> int:
        p = self.db.property_int_value
        return int(p("rocksdb.num-entries-active-mem-table") + p("rocksdb.num-entries-imm-mem-tables"))

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
                            compression=None, write_buffer_size=MEMTABLE,
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

    def seek_items(self, key, n):
        with self.db.iterator(start=key) as it:
            return list(itertools.islice(it, n))

    def memtable_entries(self) -> int:
        return -1  # plyvel does not say

    def flush(self):
        # PITFALLS: compact_range() without bounds only flushes the memtable.
        self.db.compact_range()

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


def _cpu_seconds() -> float:
    """CPU seconds of this process and its live children (sievekv's table workers), so
    work done in other processes is counted as RocksDB's and LevelDB's threads are. Less
    sensitive to the shared machine's load than wall time."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for p in (me, *me.children(recursive=True)):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except Exception:  # noqa: BLE001 - a child that just exited
            pass
    return total


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


ENGINE_CLASSES = {"sievekv": Sievekv, "rocksdb": RocksDB, "leveldb": LevelDB}


def _profiler(args, phase):
    if args.profile != phase:
        return None
    import cProfile

    return cProfile.Profile()


def _print_profile(prof, title):
    import pstats

    if prof is not None:
        print(f"--- cProfile: {title}", file=sys.stderr)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(30)


def fill_child(engine_name: str, path: str, args) -> dict:
    """Fill and settle one engine's DB at ``path`` (its own process)."""
    import psutil

    eng = ENGINE_CLASSES[engine_name]()
    keys, values, _missing, _read_keys = make_data(args.keys, args.reads)
    gc.collect()
    gc.freeze()
    out: dict = {"engine": engine_name}
    eng.open(path)
    rss0 = psutil.Process().memory_info().rss
    prof = _profiler(args, "fillrandom")

    def fill():
        put = eng.put
        for i, k in enumerate(keys):
            put(k, value_for(values, i))

    with PeakRSS() as peak:
        cpu0 = _cpu_seconds()
        t0 = time.perf_counter()
        if prof is not None:
            prof.enable()
        fill()
        if prof is not None:
            prof.disable()
        out["fillrandom_s"] = time.perf_counter() - t0
        out["fill_cpu_s"] = _cpu_seconds() - cpu0
        out["memtable_entries"] = eng.memtable_entries()
        if engine_name == "sievekv":
            st = eng.db.stats()
            out["sievekv_fill_end"] = {"flushes": st["flushes"], "compactions": st["compactions"]}
        t0 = time.perf_counter()
        eng.flush()
        out["flush_s"] = time.perf_counter() - t0
        out["fill_flush_cpu_s"] = _cpu_seconds() - cpu0
        t0 = time.perf_counter()
        eng.settle()
        out["settle_s"] = time.perf_counter() - t0
    out["fillrandom"] = args.keys / out["fillrandom_s"]
    out["fill+flush"] = args.keys / (out["fillrandom_s"] + out["flush_s"])
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
    _print_profile(prof, f"{engine_name} fillrandom")
    return out


def read_child(paths: dict, args) -> dict:
    """Open every engine's DB and run the read phases interleaved chunk by chunk."""
    keys, values, missing, read_keys = make_data(args.keys, args.reads)
    seek_keys = read_keys[: args.seeks]
    gc.collect()
    gc.freeze()
    engines = {}
    out: dict = {name: {} for name in paths}
    import engine.db  # noqa: F401 - imports are not part of the reopen time (engine's
    # package __init__ imports engine.db lazily, on the first DB.open: importing only
    # ``engine`` put engine.db's imports, numpy among them, ~0.28 s, into sievekv's reopen)
    import plyvel  # noqa: F401
    import rocksdict  # noqa: F401

    for name, path in paths.items():
        eng = ENGINE_CLASSES[name]()
        t0 = time.perf_counter()
        eng.open(path)
        out[name]["open_s"] = time.perf_counter() - t0
        engines[name] = eng
    if "sievekv" in engines:
        out["sievekv"]["after_open"] = _sievekv_filters(engines["sievekv"].db)
    names = list(engines)
    bad = {n: 0 for n in names}
    entries = {n: 0 for n in names}  # seekrandom: entries each engine returned

    def do_reads(name, part, want_found):
        get = engines[name].get
        miss = 0
        for k in part:
            if (get(k) is None) == want_found:
                miss += 1
        bad[name] += miss

    def do_seeks(name, part):
        seek = engines[name].seek_next
        got = 0
        for k in part:
            g = seek(k, 100)
            if g == 0:
                bad[name] += 1
            got += g
        entries[name] += got

    work = {"readrandom": (read_keys, lambda n, p: do_reads(n, p, True)),
            "readmissing": (missing, lambda n, p: do_reads(n, p, False)),
            "seekrandom": (seek_keys, do_seeks)}
    for phase in READ_PHASES:
        items, fn = work[phase]
        size = max(1, len(items) // CHUNKS)
        rates = {n: [] for n in names}
        cpu_rates = {n: [] for n in names}
        if phase == "readmissing" and "sievekv" in engines:
            blocks0 = engines["sievekv"].db.stats()["data_blocks_read"]
        prof = _profiler(args, phase)
        for c, lo in enumerate(range(0, len(items), size)):
            part = items[lo:lo + size]
            order = names[c % len(names):] + names[:c % len(names)]
            for n in order:
                if prof is not None and n == "sievekv":
                    prof.enable()
                c0 = time.thread_time()
                t0 = time.perf_counter()
                fn(n, part)
                dt = time.perf_counter() - t0
                cdt = time.thread_time() - c0
                if prof is not None and n == "sievekv":
                    prof.disable()
                rates[n].append(len(part) / dt)
                cpu_rates[n].append(len(part) / max(cdt, 1e-9))
        _print_profile(prof, f"sievekv {phase}")
        for n in names:
            out[n][phase] = statistics.median(rates[n])
            out[n][phase + "_chunks"] = rates[n]
            out[n][phase + "_cpu_chunks"] = cpu_rates[n]
        if "sievekv" in engines and phase == "readrandom":
            out["sievekv"]["after_gets"] = _sievekv_filters(engines["sievekv"].db)
        if "sievekv" in engines and phase == "readmissing":
            db = engines["sievekv"].db
            blocks = db.stats()["data_blocks_read"] - blocks0
            covering = _covering_tables(db, missing)
            out["sievekv"]["missing_blocks_per_get"] = blocks / len(missing)
            out["sievekv"]["missing_blocks_per_covering_table"] = blocks / covering if covering else None
            out["sievekv"]["missing_covering_tables_per_get"] = covering / len(missing)
        if any(bad.values()):
            raise SystemExit(f"{phase}: wrong answers {bad}")
        _check_answers(phase, engines, keys, values, read_keys, missing, seek_keys, entries)
    for eng in engines.values():
        eng.close()
    return out


def _check_answers(phase, engines, keys, values, read_keys, missing, seek_keys, entries) -> None:
    """Untimed: the timed loops only check found / not found (and seeks for >= 1 entry); here
    every engine must return the value that was put for a sample of the phase's keys, and
    seeks must return the same entries on every engine."""
    if phase == "seekrandom":
        if len(set(entries.values())) > 1:
            raise SystemExit(f"seekrandom: engines returned different entry counts {entries}")
        sample = seek_keys[:VERIFY_SAMPLE // 20]
        want = [next(iter(engines.values())).seek_items(k, 100) for k in sample]
        for name, eng in engines.items():
            if [eng.seek_items(k, 100) for k in sample] != want:
                raise SystemExit(f"seekrandom: {name} returned other entries than "
                                 f"{next(iter(engines))}")
        return
    sample = (read_keys if phase == "readrandom" else missing)[:VERIFY_SAMPLE]
    expected: dict = {}
    if phase == "readrandom":
        wanted = set(sample)
        for i, k in enumerate(keys):  # the last put of a key wins, as in the fill
            if k in wanted:
                expected[k] = value_for(values, i)
    wrong = {name: sum(1 for k in sample if eng.get(k) != expected.get(k))
             for name, eng in engines.items()}
    if any(wrong.values()):
        raise SystemExit(f"{phase}: wrong values for a sample of {len(sample)} keys: {wrong}")


# ---------------------------------------------------------------------------------------------
# parent: one child per engine, then the table
# ---------------------------------------------------------------------------------------------
def _run_child(args, *extra) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--keys", str(args.keys), "--reads",
           str(args.reads), "--seeks", str(args.seeks), "--memtable-mib", str(args.memtable_mib),
           *extra]
    if args.rocksdb_pread:
        cmd.append("--rocksdb-pread")
    if args.profile:
        cmd += ["--profile", args.profile]
    return run_json_child(cmd, f"child {extra}")


def run_json_child(cmd: list, what: str) -> dict:
    """Run a benchmark child process; its last stdout line is its JSON result (exit with one
    line naming ``what`` if it fails)."""
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    global MEMTABLE, ROCKSDB_MMAP
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--reads", type=int, default=None, help="gets per read phase (default min(keys, 100000))")
    ap.add_argument("--seeks", type=int, default=None, help="seeks (default min(keys // 10, 10000))")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--memtable-mib", type=int, default=64,
                    help="memtable / write buffer size of every engine (default 64: RocksDB's)")
    ap.add_argument("--fill-rounds", type=int, default=1)
    ap.add_argument("--dir", default=None, help="parent directory for the DBs")
    ap.add_argument("--rocksdb-pread", action="store_true",
                    help="RocksDB reads with pread through its 8 MiB block cache (its default; "
                         "the runs recorded before this option) instead of allow_mmap_reads")
    ap.add_argument("--profile", choices=PHASES, default=None,
                    help="cProfile this phase of sievekv (printed to stderr)")
    ap.add_argument("--fill-child", nargs=2, metavar=("ENGINE", "PATH"), help=argparse.SUPPRESS)
    ap.add_argument("--read-child", metavar="JSON", help=argparse.SUPPRESS)
    args = ap.parse_args()
    wanted = args.engines.split(",")
    require([m for e, m in (("rocksdb", "rocksdict"), ("leveldb", "plyvel")) if e in wanted],
            "db_bench")
    MEMTABLE = args.memtable_mib * MiB
    ROCKSDB_MMAP = not args.rocksdb_pread
    if args.reads is None:
        args.reads = min(args.keys, 100_000)
    if args.seeks is None:
        args.seeks = max(1, min(args.keys // 10, 10_000))
    if args.fill_child:
        print(json.dumps(fill_child(args.fill_child[0], args.fill_child[1], args)))
        return
    if args.read_child:
        print(json.dumps(read_child(json.loads(args.read_child), args)))
        return
    names = args.engines.split(",")
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)  # a --dir that does not exist yet is made
    root = tempfile.mkdtemp(prefix="dbbench-", dir=args.dir)
    try:
        fills: dict = {n: [] for n in names}
        paths = {}
        for r in range(args.fill_rounds):
            for n in (names if r % 2 == 0 else names[::-1]):
                path = os.path.join(root, f"{n}-{r}")
                fills[n].append(_run_child(args, "--fill-child", n, path))
                if r == args.fill_rounds - 1 or r == 0:
                    paths[n] = path
        results = {}
        for n in names:
            runs = sorted(fills[n], key=lambda x: x["fillrandom"])
            results[n] = dict(runs[len(runs) // 2])
            results[n]["fill_rounds"] = [x["fillrandom"] for x in fills[n]]
            results[n]["fill+flush"] = statistics.median(x["fill+flush"] for x in fills[n])
        reads = _run_child(args, "--read-child", json.dumps(paths))
        for n in names:
            results[n].update(reads[n])
        report(results, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _ratio(results, phase) -> float | None:
    s, r = results.get("sievekv"), results.get("rocksdb")
    if not s or not r:
        return None
    if phase in ("fillrandom", "fill+flush"):
        return s[phase] / r[phase]
    pairs = [a / b for a, b in zip(s[phase + "_chunks"], r[phase + "_chunks"])]
    return statistics.median(pairs)


def report(results: dict, args) -> None:
    print(f"db_bench: {args.keys:,} keys (16 B random), {VALUE_SIZE} B values, {BITS} bits/key, "
          f"{args.memtable_mib} MiB memtables, 8 MiB block caches, no compression; "
          f"{args.reads:,} gets per read phase, {args.seeks:,} seeks x 100 next")
    print("gets read mapped tables in sievekv and LevelDB; RocksDB: "
          + ("allow_mmap_reads" if ROCKSDB_MMAP else "pread + 8 MiB block cache (--rocksdb-pread)"))
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f} at the end; fill rounds: {args.fill_rounds}")
    names = list(results)
    have_ratio = "sievekv" in results and "rocksdb" in results
    print()
    print(f"{'workload':<14}" + "".join(f"{n + ' ops/s':>18}" for n in names)
          + (f"{'sievekv/rocksdb':>18}" if have_ratio else ""))
    targets = {"fillrandom": 0.5, "fill+flush": 0.5, "readrandom": 0.5, "readmissing": 0.25,
               "seekrandom": None}
    for phase in ("fillrandom", "fill+flush", *READ_PHASES):
        row = f"{phase:<14}" + "".join(f"{results[n][phase]:>18,.0f}" for n in names)
        if have_ratio:
            ratio = _ratio(results, phase)
            t = targets[phase]
            # three decimals: a ratio of 0.499 printed as "0.50x" beside "MISSED" misleads
            row += f"{ratio:>17.3f}x" + (f"  (target >= {t}x: {'met' if ratio >= t else 'MISSED'})" if t else "")
        print(row)
    print("(fill+flush: the same puts timed until the last memtable is in a table; read phases: "
          "each engine's median over 10 interleaved chunks; ratio: median of the per-chunk ratios)")
    if have_ratio:  # gets run in the calling thread in every engine: its CPU time is their cost
        cpu = {phase: statistics.median(a / b for a, b in zip(results["sievekv"][phase + "_cpu_chunks"],
                                                              results["rocksdb"][phase + "_cpu_chunks"]))
               for phase in READ_PHASES}
        print("the same ratios from the reading thread's CPU time (less sensitive to the machine's "
              "load): " + ", ".join(f"{p} {r:.3f}x" for p, r in cpu.items()))
    print()
    print(f"{'':<30}" + "".join(f"{n:>14}" for n in names))
    for label, key, fmt in (("fill seconds", "fillrandom_s", "{:.1f}"),
                            ("entries in memtables then", "memtable_entries", "{:,}"),
                            ("flush seconds", "flush_s", "{:.1f}"),
                            ("CPU s: fill **", "fill_cpu_s", "{:.1f}"),
                            ("CPU s: fill+flush **", "fill_flush_cpu_s", "{:.1f}"),
                            ("settle (compact) s", "settle_s", "{:.1f}"),
                            ("reopen seconds", "open_s", "{:.3f}"),
                            ("peak RSS during fill MiB *", "peak_rss_mib", "{:.0f}"),
                            ("RSS growth during fill MiB *", "rss_growth_mib", "{:.0f}")):
        print(f"{label:<30}" + "".join(
            f"{fmt.format(results[n][key]) if results[n][key] >= 0 else 'n/a':>14}" for n in names))
    if args.fill_rounds > 1:
        print(f"{'fillrandom ops/s per round':<30}" + "".join(
            f" {'/'.join(f'{x / 1000:.0f}k' for x in results[n]['fill_rounds']):>13}" for n in names))
    print("* the filling process and its children (sievekv's table worker processes)")
    print("** CPU seconds of the filling process and its children, background threads included")
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
        fe = s["sievekv_fill_end"]
        print(f"  when the last put returned: {fe['flushes']} flushes and {fe['compactions']} "
              f"compactions done")
        print(f"  fill + flush + settle: {fs['flushes']} flushes, {fs['compactions']} compactions "
              f"({fs['compaction_bytes_written'] / MiB:.0f} MiB written), write stalls "
              f"{fs['write_stall_s']:.2f} s, {fs['worker_jobs']} jobs in table worker processes;"
              f" levels after settle (level, tables): {fs['levels']}")


if __name__ == "__main__":
    main()
