"""Sustained ingest of one engine beside RocksDB: puts/s once flushes and compactions must keep pace.

bench/db_bench.py's fill is a burst: 1M keys into 64 MiB memtables end after 3 flushes and no
compaction, so it says nothing about the rate one shard can take indefinitely. This puts
--keys random 16-byte keys with 100-byte random values (default 5,000,000; 16,384 distinct
values put in turn, too many for block compression to find; a few overwrites are possible and
harmless) from one thread, as fast as the engine accepts them, and samples every --window
seconds what the background work is doing.

Engines, each in its own child process, one after the other (never at the same time):
  sievekv  engine.DB with the engine's DEFAULT options (engine/options.py: 8 MiB memtables, L0
           triggers 4 / 20 / 36, 2 frozen memtables, 2 table worker processes, lz4), unless
           --engine-option KEY=VALUE (repeatable) changes one
  rocksdb  rocksdict with write_buffer_size = sievekv's memtable_bytes (the same number of
           bytes, though the engines charge an entry differently: sievekv key + value + 176,
           RocksDB its arena, ~148 B here), a 10 bits/key Bloom filter, RocksDB's other
           defaults (9.8.4 in rocksdict 0.3.29: snappy, 32 MiB block cache, L0 triggers
           4 / 20 / 36 as sievekv's, 2 write buffers, 2 background jobs, dynamic level bytes,
           a 256 MiB base level where sievekv's L1 target is 64 MiB, 64 MiB tables where
           sievekv's are 4 MiB, and past the slowdown trigger a write rate limit starting at
           16 MiB/s, as sievekv's since session 16; until then sievekv slept 1 ms per write)
Both: write-ahead log on, no sync per write (each engine's default).

Per window (the row says how many seconds it covered) and per engine:
  puts/s     puts in the window / its length (0 while draining; puts are counted per 256)
  stall s    cumulative write-stall seconds (sievekv: stats() write_stall total_seconds, slowdown
             sleeps + stops; RocksDB: "Cumulative stall" of the rocksdb.dbstats property, ms)
  L0         L0 tables (RocksDB: rocksdb.num-files-at-level0)
  flushes    flushes done (RocksDB: Comp(cnt) of L0 in rocksdb.stats, which also counts
             intra-L0 compactions)
  compact    compactions done (sievekv: trivial moves included; RocksDB: the Sum row's
             Comp(cnt) less L0's)
  MiB out    bytes written by flushes + compactions, cumulative (sievekv: flush_bytes +
             compaction_bytes_written; RocksDB: "Cumulative compaction ... GB write", which
             includes flushes, printed in 0.01 GB steps, so +-5 MiB)
  RSS MiB    the child process and its children (sievekv's table workers), when sampled
  compaction running   sievekv: stats()["compaction_running"], its levels, input MiB and
             seconds so far (one compaction at a time); RocksDB: rocksdb.num-running-compactions
Each put is timed (two perf_counter calls around it) into a per-microsecond histogram of
constant size: the report prints p50, p99, p99.9, p99.99 and the largest put latency, and
how many puts took over 1 ms and over 100 ms: where write stalls land for the caller.
After the last put the child times the drain, until background work is done (sievekv: flush()
then wait_for_compactions(); RocksDB: flush() then polling until no flush or compaction is
pending or running), still sampling windows ("drain" rows). Then, untimed, every engine must
return the value put for a sample of 2,000 keys.

Printed at the end: each engine's rate over the whole run (keys / seconds until the last put
returned), over its last half (the second half of the keys: the sustained rate), and with the
drain; sievekv/RocksDB ratios of all three; write amplification ((flush + compaction bytes
written) / user bytes put, keys + values; write-ahead log not counted); total stall seconds;
peak RSS (sampled every 20 ms as in db_bench); CPU seconds of the process and its children;
the load average (1/5/15 min) before and after each engine and the CPU count. The machine is
shared: read rates beside the load average.

Run:  python3 bench/sustained_fill.py [--keys 5000000] [--window 5] [--engines sievekv,rocksdb]
                                      [--engine-option memtable_bytes=67108864] [--dir DIR]
                                      [--progress] [--json FILE]
      --profile FILE cProfiles sievekv's child (the put thread) into FILE (pstats).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_deps import require  # noqa: E402
from db_bench import BITS, MiB, VALUE_SIZE, PeakRSS, _cpu_seconds, run_json_child  # noqa: E402

KEY_SIZE = 16
ENGINES = ("sievekv", "rocksdb")
CHUNK = 256  # puts between two updates of the shared put counter (a window's count is +-CHUNK)
VALUE_POOL = 1 << 14  # distinct random values, put in turn: a 4 KiB block of ~35 entries
# holds two equal values with ~4% chance, far from the 1/8 that block compression must save
CHECK_SAMPLE = 2000  # keys whose values are read back after the drain
LAT_CAP_US = 1_000_000  # put latencies are counted per microsecond up to here (1 s), then as 1 s+
GiB = 1 << 30  # RocksDB's "GB" in its stats text


class UsageError(Exception):
    """A bad command line: one line on stderr, exit 2."""


# ---------------------------------------------------------------------------------------------
# options
# ---------------------------------------------------------------------------------------------
def parse_engine_options(items) -> dict:
    """``["KEY=VALUE", ...]`` -> options for engine.DB.open, typed by each option's default
    (engine/options.py) and validated there. Raises UsageError naming the bad item."""
    from dataclasses import fields

    from engine.errors import SieveError
    from engine.options import Options

    defaults = {f.name: f.default for f in fields(Options) if f.name != "fs"}
    out: dict = {}
    for item in items or ():
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--engine-option {item!r}: expected KEY=VALUE")
        if key not in defaults:
            raise UsageError(f"--engine-option {key}: no such engine option (engine/options.py)")
        default = defaults[key]
        try:
            if isinstance(default, bool):
                value = {"true": True, "false": False}[raw.strip().lower()]
            elif isinstance(default, int):
                value = int(raw)
            elif isinstance(default, float):
                value = float(raw)
            elif raw.strip().lower() in ("none", "null"):
                value = None
            else:
                try:
                    value = json.loads(raw)
                except ValueError:
                    value = raw
        except (KeyError, ValueError):
            kind = "true or false" if isinstance(default, bool) else type(default).__name__
            raise UsageError(f"--engine-option {key}={raw}: expected {kind}") from None
        out[key] = value
    try:
        Options.from_kwargs(**out)
    except SieveError as exc:
        raise UsageError(f"--engine-option: {exc}") from None
    return out


def memtable_bytes(engine_options: dict) -> int:
    from engine.options import Options

    return engine_options.get("memtable_bytes", Options().memtable_bytes)


# ---------------------------------------------------------------------------------------------
# engines: open, put, sample, drain, get, close
# ---------------------------------------------------------------------------------------------
def _running(r) -> str:
    """stats()["compaction_running"] in a few characters: levels, input MiB, seconds so far."""
    if r is None:
        return "-"
    return (f"L{r['level']}>L{r['output_level']} {r['input_bytes'] / MiB:.0f} MiB "
            f"{r['seconds']:.0f}s")


class Sievekv:
    name = "sievekv"

    def open(self, path, engine_options, memtable):
        import engine

        self.db = engine.DB.open(path, **engine_options)
        self.put = self.db.put
        self.get = self.db.get

    def sample(self) -> dict:
        st = self.db.stats()
        return {"stall_s": st["write_stall"]["total_seconds"],
                "l0": st["levels"][0]["tables"],
                "flushes": st["flushes"], "compactions": st["compactions"],
                "flush_bytes": st["flush_bytes"],
                "written": st["flush_bytes"] + st["compaction_bytes_written"],
                "frozen": st["memtable"]["frozen"],
                "running": _running(st["compaction_running"])}

    def drain(self):
        self.db.flush()
        if not self.db.wait_for_compactions():
            raise SystemExit(f"sievekv: wait_for_compactions failed: {self.db.stats()['failed']}")

    def final(self) -> dict:
        st = self.db.stats()
        return {"levels": [[lv["level"], lv["tables"], round(lv["bytes"] / MiB, 1)]
                           for lv in st["levels"] if lv["tables"]],
                "trivial_moves": st["trivial_moves"],
                "compactions_by_reason": st["compactions_by_reason"],
                "slowdowns": st["write_stall"]["slowdowns"], "stops": st["write_stall"]["stops"],
                "slowdown_s": st["write_stall"]["slowdown_seconds"],
                "stop_s": st["write_stall"]["stop_seconds"],
                "worker_jobs": st["table_workers"]["jobs_in_process"],
                "worker_fallbacks": st["table_workers"]["fallbacks_to_threads"],
                "compaction_seconds": st["compaction_seconds"],
                "compression_ratio": st["compression"]["ratio"]}

    def close(self):
        self.db.close()


def _hms_seconds(text: str) -> float:
    h, m, s = text.split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def parse_rocksdb_stats(stats: str, dbstats: str) -> dict:
    """Counters from the text of rocksdb.stats and rocksdb.dbstats (RocksDB's
    internal_stats.cc formats; a field not found is None). Bytes are exact only to the text's
    rounding: flushes to 0.001 GB, flushes + compactions to 0.01 GB."""
    out: dict = {"flushes": None, "compactions": None, "flush_bytes": None, "written": None,
                 "stall_s": None}
    m = re.search(r"^Flush\(GB\): cumulative ([\d.]+)", stats, re.M)
    if m:
        out["flush_bytes"] = int(float(m.group(1)) * GiB)
    m = re.search(r"^Cumulative compaction: ([\d.]+) GB write", stats, re.M)
    if m:
        out["written"] = int(float(m.group(1)) * GiB)
    m = re.search(r"^Cumulative stall: (\d+:\d+:[\d.]+) H:M:S", dbstats, re.M)
    if m:
        out["stall_s"] = _hms_seconds(m.group(1))
    # The first "Compaction Stats" table (by level): rows "L0 files/.. size unit ...", "Sum".
    head = re.search(r"^Level\s+Files\s+Size.*$", stats, re.M)
    if head:
        cols = head.group(0).split()
        try:
            cnt = cols.index("Comp(cnt)") + 1  # the Size column spans two tokens ("2.66 MB")
        except ValueError:
            return out
        rows = {}
        for line in stats[head.end():].splitlines()[2:]:
            tok = line.split()
            if not tok or not (tok[0] == "Sum" or re.fullmatch(r"L\d+", tok[0])):
                break
            rows[tok[0]] = int(tok[cnt])
        if "Sum" in rows:
            out["flushes"] = rows.get("L0", 0)
            out["compactions"] = rows["Sum"] - out["flushes"]
    return out


class RocksDB:
    name = "rocksdb"

    def open(self, path, engine_options, memtable):
        from rocksdict import BlockBasedOptions, Options, Rdict

        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.set_write_buffer_size(memtable)
        bbo = BlockBasedOptions()
        bbo.set_bloom_filter(BITS, False)
        opts.set_block_based_table_factory(bbo)
        self.db = Rdict(path, options=opts)  # a fresh DB: the reopen pitfall does not apply
        self.put = self.db.put
        self.get = self.db.get

    def _int(self, name) -> int:
        return int(self.db.property_int_value(name) or 0)

    def sample(self) -> dict:
        s = parse_rocksdb_stats(self.db.property_value("rocksdb.stats"),
                                self.db.property_value("rocksdb.dbstats"))
        s["l0"] = self._int("rocksdb.num-files-at-level0")
        s["frozen"] = self._int("rocksdb.num-immutable-mem-table")
        n = self._int("rocksdb.num-running-compactions")
        s["running"] = f"{n} running" if n else "-"
        return s

    def busy(self) -> bool:
        return any(self._int(p) for p in ("rocksdb.mem-table-flush-pending",
                                          "rocksdb.compaction-pending",
                                          "rocksdb.num-running-flushes",
                                          "rocksdb.num-running-compactions"))

    def drain(self):
        self.db.flush()
        while self.busy():
            time.sleep(0.05)

    def final(self) -> dict:
        text = self.db.property_value("rocksdb.levelstats") or ""
        levels = []
        for line in text.splitlines():
            tok = line.split()
            if len(tok) == 3 and tok[0].isdigit() and int(tok[1]):
                levels.append([int(tok[0]), int(tok[1]), float(tok[2])])
        m = re.search(r"^Write Stall \(count\): (.*)$", self.db.property_value("rocksdb.stats"), re.M)
        return {"levels": levels, "write_stall_counts": m.group(1) if m else None,
                "version": self._version()}

    def _version(self):
        import glob

        for name in sorted(glob.glob(os.path.join(self.db.path(), "OPTIONS-*"))):
            with open(name) as f:
                m = re.search(r"rocksdb_version=(\S+)", f.read())
            if m:
                return m.group(1)
        return None

    def close(self):
        self.db.close()


ENGINE_CLASSES = {"sievekv": Sievekv, "rocksdb": RocksDB}


# ---------------------------------------------------------------------------------------------
# child: one engine
# ---------------------------------------------------------------------------------------------
class Progress:
    """The put thread's count, read by the sampler (a list item: one store per CHUNK puts)."""

    def __init__(self):
        self.done = [0]


class Sampler:
    """Every ``window`` seconds from ``t0``: puts done, the engine's counters, RSS."""

    def __init__(self, eng, progress, peak, window, t0, echo):
        self.eng, self.progress, self.peak, self.window, self.t0 = eng, progress, peak, window, t0
        self.echo = echo
        self.phase = "put"
        self.rows: list = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._last = (t0, 0)
        self._lock = threading.Lock()

    def take(self):
        with self._lock:
            now = time.perf_counter()
            done = self.progress.done[0]
            row = {"t": now - self.t0, "dt": now - self._last[0], "phase": self.phase,
                   "puts": done - self._last[1], **self.eng.sample(),
                   "rss": self.peak.rss()}
            self._last = (now, done)
            self.rows.append(row)
            if self.echo:
                print(f"  {self.eng.name} {format_row(row)}", file=sys.stderr, flush=True)

    def _run(self):
        k = 1
        while not self._stop.wait(max(0.0, self.t0 + k * self.window - time.perf_counter())):
            self.take()
            k += 1

    def start(self):
        self._t.start()

    def stop(self):
        self._stop.set()
        self._t.join()


def make_values(seed: int) -> list:
    rnd = random.Random(seed)
    return [rnd.randbytes(VALUE_SIZE) for _ in range(VALUE_POOL)]


def put_all(eng, n: int, seed: int, progress: Progress, half_at: list,
            latency: list | None = None) -> list:
    """Put ``n`` random keys (a fresh random blob per CHUNK keys, values in turn from
    VALUE_POOL random ones); return [(key, value)] for every ~n/CHECK_SAMPLE-th put, read
    back later. ``latency``: a list of LAT_CAP_US + 1 counts, where each put's time in whole
    microseconds (two perf_counter calls around it) is counted."""
    rnd = random.Random(seed)
    values = make_values(seed + 1)
    put = eng.put
    done = progress.done
    half = n // 2
    every = max(1, n // CHECK_SAMPLE)
    sample = []
    left = n
    while left > 0:
        m = min(CHUNK, left)
        blob = rnd.randbytes(KEY_SIZE * m)
        keys = [blob[o:o + KEY_SIZE] for o in range(0, KEY_SIZE * m, KEY_SIZE)]
        base = n - left
        vals = values[base % VALUE_POOL:base % VALUE_POOL + m]  # CHUNK divides VALUE_POOL
        if latency is None:
            for k, v in zip(keys, vals):
                put(k, v)
        else:
            clock = time.perf_counter
            for k, v in zip(keys, vals):
                t = clock()
                put(k, v)
                us = int((clock() - t) * 1e6)
                latency[us if us < LAT_CAP_US else LAT_CAP_US] += 1
        for j in range(-base % every, m, every):
            sample.append((keys[j], vals[j]))
        left -= m
        done[0] = n - left
        if not half_at and done[0] >= half:
            half_at.append((time.perf_counter(), done[0]))
    return sample


def child(engine_name: str, path: str, args, engine_options: dict) -> dict:
    eng = ENGINE_CLASSES[engine_name]()
    out: dict = {"engine": engine_name, "load_before": os.getloadavg()}
    eng.open(path, engine_options, memtable_bytes(engine_options))
    progress = Progress()
    half_at: list = []
    prof = None
    if args.profile and engine_name == "sievekv":
        import cProfile

        prof = cProfile.Profile()
    with PeakRSS() as peak:
        rss0 = peak.rss()
        cpu0 = _cpu_seconds()
        t0 = time.perf_counter()
        sampler = Sampler(eng, progress, peak, args.window, t0, args.progress)
        sampler.start()
        if prof is not None:
            prof.enable()
        latency = [0] * (LAT_CAP_US + 1)
        sample = put_all(eng, args.keys, args.seed, progress, half_at, latency)
        if prof is not None:
            prof.disable()
        t_put = time.perf_counter()
        cpu_put = _cpu_seconds() - cpu0
        sampler.take()  # the partial window up to the last put
        sampler.phase = "drain"
        eng.drain()
        t_drain = time.perf_counter()
        sampler.stop()
        sampler.take()  # the partial window up to the end of the drain
        cpu_all = _cpu_seconds() - cpu0
    wrong = sum(1 for k, v in sample if eng.get(k) != v)
    if wrong:
        raise SystemExit(f"{engine_name}: {wrong} of {len(sample)} sampled keys read back wrong")
    out.update({
        "put_s": t_put - t0, "drain_s": t_drain - t_put,
        "half_s": t_put - half_at[0][0], "half_puts": args.keys - half_at[0][1],
        "cpu_put_s": cpu_put, "cpu_s": cpu_all,
        "rss0_mib": rss0 / MiB, "peak_rss_mib": peak.peak / MiB,
        "windows": sampler.rows, "end": sampler.rows[-1], "final": eng.final(),
        "checked": len(sample), "load_after": os.getloadavg(),
        "latency_us": latency_percentiles(latency)})
    eng.close()
    if prof is not None:
        prof.dump_stats(args.profile)
    return out


LAT_POINTS = (("p50", 0.50), ("p99", 0.99), ("p99.9", 0.999), ("p99.99", 0.9999))


def latency_percentiles(counts: list) -> dict:
    """{"p50": us, ..., "max": us, "over_1ms": n, "over_100ms": n} of a per-microsecond
    histogram (the last slot: LAT_CAP_US or more)."""
    total = sum(counts)
    out: dict = {}
    seen = 0
    points = list(LAT_POINTS)
    for us, c in enumerate(counts):
        if not c:
            continue
        seen += c
        while points and seen >= points[0][1] * total:
            out[points.pop(0)[0]] = us
        out["max"] = us
    out["over_1ms"] = sum(counts[1000:])
    out["over_100ms"] = sum(counts[100_000:])
    return out


# ---------------------------------------------------------------------------------------------
# parent: one child per engine, then the report
# ---------------------------------------------------------------------------------------------
def _fmt(v, spec) -> str:
    return "n/a" if v is None else format(v, spec)


def format_row(r: dict) -> str:
    mib = None if r["written"] is None else r["written"] / MiB
    return (f"{r['t']:>7.1f} {r['dt']:>5.1f} {r['phase']:<5} {r['puts'] / r['dt'] if r['dt'] else 0:>9,.0f}"
            f" {_fmt(r['stall_s'], '>8.2f')} {r['l0']:>4} {r['frozen']:>3}"
            f" {_fmt(r['flushes'], '>7')} {_fmt(r['compactions'], '>7')}"
            f" {_fmt(mib, '>8,.0f')} {r['rss'] / MiB:>7.0f}  {r['running']}")


ROW_HEAD = (f"{'t s':>7} {'dt':>5} {'phase':<5} {'puts/s':>9} {'stall s':>8} {'L0':>4} {'imm':>3}"
            f" {'flushes':>7} {'compact':>7} {'MiB out':>8} {'RSS MiB':>7}  compaction running")


def _run_child(args, name: str, path: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--keys", str(args.keys), "--window",
           str(args.window), "--seed", str(args.seed), "--child", name, path]
    for item in args.engine_option or ():
        cmd += ["--engine-option", item]
    if args.progress:
        cmd.append("--progress")
    if args.profile:
        cmd += ["--profile", args.profile]
    return run_json_child(cmd, f"sustained_fill: the {name} child")


def summarize(r: dict, keys: int) -> dict:
    end = r["end"]
    user = keys * (KEY_SIZE + VALUE_SIZE)
    return {
        "whole": keys / r["put_s"], "last_half": r["half_puts"] / r["half_s"],
        "with_drain": keys / (r["put_s"] + r["drain_s"]),
        "wa": None if end["written"] is None else end["written"] / user,
        "flush_mib": None if end["flush_bytes"] is None else end["flush_bytes"] / MiB,
        "compaction_mib": (None if end["written"] is None or end["flush_bytes"] is None
                           else (end["written"] - end["flush_bytes"]) / MiB)}


def report(results: dict, args, engine_options: dict) -> None:
    from engine.options import Options

    o = Options.from_kwargs(**engine_options)
    mem = memtable_bytes(engine_options)
    user = args.keys * (KEY_SIZE + VALUE_SIZE)
    print(f"sustained_fill: {args.keys:,} puts of random {KEY_SIZE} B keys and {VALUE_SIZE} B "
          f"random values ({user / MiB:,.0f} MiB of user data), one thread, windows of "
          f"{args.window:g} s")
    print("sievekv: engine defaults"
          + (f" + {', '.join(f'{k}={v}' for k, v in engine_options.items())}" if engine_options else "")
          + f" (memtable_bytes {mem / MiB:g} MiB, l0 triggers {o.l0_compaction_trigger}/"
          f"{o.l0_slowdown_trigger}/{o.l0_stop_trigger}, max_frozen_memtables "
          f"{o.max_frozen_memtables}, table_workers {o.table_workers}, compression {o.compression})")
    print(f"rocksdb: write_buffer_size {mem / MiB:g} MiB, bloom {BITS} bits/key, other options "
          f"RocksDB's defaults; both: WAL on, no sync")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; each engine in its own "
          f"child process, one after the other")
    print("load average (1/5/15 min): "
          + "; ".join(f"{n} before {'/'.join(f'{x:.2f}' for x in r['load_before'])}, after "
                      f"{'/'.join(f'{x:.2f}' for x in r['load_after'])}"
                      for n, r in results.items()))
    for name, r in results.items():
        print()
        print(f"{name} per window (stall s, flushes, compact, MiB out: cumulative; imm: frozen "
              f"memtables):")
        print(ROW_HEAD)
        for row in r["windows"]:
            print(format_row(row))
    sums = {n: summarize(r, args.keys) for n, r in results.items()}
    names = list(results)
    ratio = "sievekv" in results and "rocksdb" in results
    print()
    print(f"{'':<34}" + "".join(f"{n:>14}" for n in names) + (f"{'sievekv/rocksdb':>17}" if ratio else ""))

    def line(label, vals, spec, show_ratio=False):
        row = f"{label:<34}" + "".join(f"{_fmt(v, spec):>14}" for v in vals)
        if ratio and show_ratio and None not in vals:
            row += f"{vals[0] / vals[1]:>16.3f}x"
        print(row)

    line("puts/s, whole run", [sums[n]["whole"] for n in names], ",.0f", True)
    line("puts/s, last half (sustained)", [sums[n]["last_half"] for n in names], ",.0f", True)
    line("puts/s, with the drain", [sums[n]["with_drain"] for n in names], ",.0f", True)
    line("seconds: puts", [results[n]["put_s"] for n in names], ".1f")
    line("seconds: drain after the last put", [results[n]["drain_s"] for n in names], ".1f")
    line("write stall seconds", [results[n]["end"]["stall_s"] for n in names], ".2f")
    line("  share of the put seconds", [None if results[n]["end"]["stall_s"] is None
                                        else results[n]["end"]["stall_s"] / results[n]["put_s"]
                                        for n in names], ".0%")
    for key, _q in LAT_POINTS + (("max", 1.0),):
        line(f"put latency us, {key} ****", [results[n]["latency_us"].get(key) for n in names],
             ",", False)
    line("puts over 1 ms", [results[n]["latency_us"]["over_1ms"] for n in names], ",")
    line("puts over 100 ms", [results[n]["latency_us"]["over_100ms"] for n in names], ",")
    line("flushes", [results[n]["end"]["flushes"] for n in names], "")
    line("compactions", [results[n]["end"]["compactions"] for n in names], "")
    line("MiB written: flushes", [sums[n]["flush_mib"] for n in names], ",.0f")
    line("MiB written: compactions", [sums[n]["compaction_mib"] for n in names], ",.0f")
    line("write amplification *", [sums[n]["wa"] for n in names], ".2f", True)
    line("peak RSS MiB **", [results[n]["peak_rss_mib"] for n in names], ",.0f")
    line("RSS MiB before the first put **", [results[n]["rss0_mib"] for n in names], ",.0f")
    line("CPU s: puts ***", [results[n]["cpu_put_s"] for n in names], ",.1f")
    line("CPU s: puts + drain ***", [results[n]["cpu_s"] for n in names], ",.1f")
    print(f"*   (flush + compaction bytes written) / {user / MiB:,.0f} MiB put (keys + values); "
          f"write-ahead log not counted")
    print("**  the child process and its children (sievekv's table workers), sampled every 20 ms")
    print("*** CPU seconds of the child process and its live children, background threads included")
    print("**** each put timed alone (two perf_counter calls, ~0.1 us, in both engines), whole "
          "microseconds; a stall or slowdown sleep is inside the put that paid it")
    for name, r in results.items():
        f = r["final"]
        print(f"{name} after the drain: levels (level, tables, MiB) {f['levels']}; "
              + "; ".join(f"{k} {v}" for k, v in f.items() if k != "levels")
              + f"; {r['checked']:,} sampled keys read back right")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=5_000_000)
    ap.add_argument("--window", type=float, default=5.0, help="seconds per sample (default 5)")
    ap.add_argument("--engines", default=",".join(ENGINES),
                    help="comma-separated, run in this order (default sievekv,rocksdb)")
    ap.add_argument("--engine-option", action="append", metavar="KEY=VALUE",
                    help="a sievekv option (engine/options.py) instead of its default; "
                         "memtable_bytes is RocksDB's write_buffer_size too")
    ap.add_argument("--seed", type=int, default=1501)
    ap.add_argument("--dir", default=None, help="parent directory for the DBs (default: a temp dir)")
    ap.add_argument("--progress", action="store_true", help="print each window to stderr as it ends")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write the raw results here")
    ap.add_argument("--profile", default=None, metavar="FILE",
                    help="cProfile sievekv's put thread into FILE (pstats format)")
    ap.add_argument("--child", nargs=2, metavar=("ENGINE", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.keys < 2:
        ap.error("--keys must be at least 2")
    if not args.window > 0:
        ap.error("--window must be > 0")
    names = [n.strip() for n in args.engines.split(",") if n.strip()]
    bad = [n for n in names if n not in ENGINE_CLASSES]
    if bad or not names or len(set(names)) != len(names):
        ap.error(f"--engines: expected a comma-separated list of {', '.join(ENGINES)}, "
                 f"got {args.engines!r}")
    try:
        engine_options = parse_engine_options(args.engine_option)
    except UsageError as exc:
        ap.error(str(exc))
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args, engine_options)))
        return
    if "rocksdb" in names:
        require(["rocksdict"], "sustained_fill")
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    root = tempfile.mkdtemp(prefix="sustained-", dir=args.dir)
    results = {}
    try:
        for name in names:
            path = os.path.join(root, name)
            results[name] = _run_child(args, name, path)
            shutil.rmtree(path, ignore_errors=True)  # 5M keys: ~1 GiB a DB
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report(results, args, engine_options)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f)


if __name__ == "__main__":
    main()
