"""A shard's memory under a write burst, beside what deploy/README.md ("Memory") says to size for.

    python3 bench/shard_footprint.py [--keys 1000000] [--batch 1000] [--writers 1]
                                     [--values random|text] [--gets 20000] [--multigets 1000]
                                     [--compact] [--wait-idle] [--engine-option NAME=VALUE ...]
                                     [--out DIR]

Starts ONE real shard process (``python3 -m shard`` on a fresh data directory under --out,
127.0.0.1 port 0, engine defaults unless --engine-option is given) and drives it over gRPC
from this process (``router.client.Client``, which talks to a shard directly):

  write   --keys random 16-byte keys with 100-byte values, in KV.Write batches of --batch
          mutations from --writers threads (values: ``random`` incompressible bytes, whose
          blocks lz4 leaves raw and gets read from the mapping; ``text`` JSON-like bytes that
          lz4 compresses, so gets decompress blocks into the block cache)
  settle  Admin.Stats every 0.5 s until no memtable waits for its flush, no compaction runs
          and every level is within its target (the picker's rule), twice in a row
  read    --gets Gets and --multigets MultiGets of 100 keys, random keys, half of them absent;
          every answer is checked against the value written (a wrong one fails the run)
  compact with --compact: one manual compaction (Admin.Compact, what ``sievekv compact`` sends)
  idle    with --wait-idle: until the table workers have exited (60 s without a job)

A sampler thread reads, every 50 ms, RssAnon and RssFile (/proc/PID/status, bench/soak.py's
``_rss_split``) of the shard and of each of its child processes (the table workers, started by
the first flush and gone after 60 s idle), and every second, from /proc/PID/smaps, the resident
pages of the mapped table files (``.sst``): these are file-backed and, as the README says,
come on top of the sizing figure. It prints, per phase and for the run, the peak and the final
anonymous RSS of the shard, of the workers and of both; the same for "RSS less table pages"
(anonymous + shared libraries + other file pages: what deploy/README.md's figures count);
the table bytes on disk (Admin.Stats), the memtable and block cache bytes the engine accounts;
the formula deploy/README.md "Memory" gave until session 14 (what this bench was written to
check), with the ratio measured / formula,

    shard 70 MiB + table_workers x 35 MiB (x 70 MiB while writing tables)
      + (1 + max_frozen_memtables) x memtable_bytes + block_cache_bytes + 2% of the table bytes

and the item's figures since: a settled shard (100 MiB + its memtable and block cache in use
+ 80 bytes per data block) beside the shard's own RSS less table pages at the end, and the
worst case (full memtables and cache, every worker at 35 MiB plus the larger of a flush of a
full memtable, ~500 bytes per entry, and a compaction of l0_stop_trigger + 1 inputs holding
MERGE_BATCH entries of key + value + 170 bytes each) beside the run's peak. The shard is stopped
(SIGTERM, then its process group is killed) on every way out. Timings are not the point: the
load average is printed because the write rate (and so how many L0 tables pile up) depends
on it. Results: bench/results/soak.md
("Session 14: shard footprint under a write burst").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)

import psutil  # noqa: E402

import soak  # noqa: E402  (bench/soak.py: Node, _rss_split)
from engine.errors import SieveError  # noqa: E402
from engine.iterators import MERGE_BATCH  # noqa: E402
from engine.memtable import ENTRY_OVERHEAD  # noqa: E402
from engine.options import Options  # noqa: E402
from shard.worker import parse_engine_option  # noqa: E402

MiB = 1 << 20
KEY_BYTES, VALUE_BYTES = 16, 100
# deploy/README.md "Memory" until session 14 (what this bench was written to check):
OLD_SHARD, OLD_WORKER, OLD_WORKER_WRITING, OLD_INDEX_SHARE = 70 * MiB, 35 * MiB, 70 * MiB, 0.02
# ... and since (measured here): a settled shard, a fresh worker, index bytes per data block,
# bytes a merge holds per entry on top of its key and value (a compaction holds at most
# MERGE_BATCH entries per input since session 14), bytes a flush job holds per memtable entry
NOW_SHARD, NOW_WORKER, NOW_INDEX_PER_BLOCK, NOW_MERGE_PER_ENTRY = 100 * MiB, 35 * MiB, 80, 170
NOW_FLUSH_PER_ENTRY = 500
MEMTABLE_PER_ENTRY = ENTRY_OVERHEAD  # what memtable_bytes charges per entry beside key and value


# --------------------------------------------------------------------------------- data
def value_of(key: bytes, kind: str) -> bytes:
    """The 100-byte value written for ``key`` (derived from it, so reads can be checked
    without keeping the values)."""
    if kind == "random":
        return hashlib.shake_128(key).digest(VALUE_BYTES)
    h = key.hex()
    doc = b'{"id":"%s","user":"user%s","active":true,"plan":"free","region":"eu-west-1"}' % (
        h[:16].encode(), h[16:22].encode())
    return (doc + b" " * VALUE_BYTES)[:VALUE_BYTES]


def key_at(keys: bytes, i: int) -> bytes:
    return keys[KEY_BYTES * i:KEY_BYTES * (i + 1)]


# --------------------------------------------------------------------------------- sampling
def table_pages(pid: int) -> int:
    """Resident bytes of the process's mappings of ``.sst`` files (/proc/PID/smaps)."""
    total, in_table = 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            if line[0] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                in_table = line.rstrip().endswith(".sst")
            elif in_table and line.startswith("Rss:"):
                total += int(line.split()[1]) * 1024
    return total


class Sampler(threading.Thread):
    """Samples the shard and its children (the table workers) every ``every`` s into
    ``self.samples``: dicts of ``t``, ``phase`` (whatever the main thread last set), and for
    ``shard`` and ``workers`` (summed over the live ones): ``_anon`` (RssAnon), ``_pages``
    (resident ``.sst`` mappings) and ``_other`` (the other file-backed pages: libraries), plus
    ``workers`` (how many) and ``worker_anon_max``. The smaps walk behind ``_pages`` costs
    milliseconds, so it runs every ``pages_every`` s per process: in between, ``_pages`` and
    ``_other`` are the process's last such figures (the libraries barely move; table pages
    are reported, not counted in the sizing figure). Stop with :meth:`stop`."""

    def __init__(self, pid: int, every: float = 0.05, pages_every: float = 1.0):
        super().__init__(name="footprint-sampler", daemon=True)
        self.proc = psutil.Process(pid)
        self.every, self.pages_every = every, pages_every
        self.phase = "start"
        self.samples: list[dict] = []
        self.errors = 0
        self._halt = threading.Event()
        self._split: dict[int, tuple[float, int, int]] = {}  # pid -> (when, pages, other)

    def _one(self, pid: int, now: float) -> tuple[int, int, int]:
        """(anonymous, table pages, other file pages) of one process, in bytes."""
        anon, file = soak._rss_split(pid)
        when, pages, other = self._split.get(pid, (-1e9, 0, 0))
        if now - when >= self.pages_every:
            pages = table_pages(pid)
            anon, file = soak._rss_split(pid)  # read again: the smaps walk took a while
            other = max(0, file - pages)
            self._split[pid] = (now, pages, other)
        return anon, pages, other

    def sample(self) -> dict | None:
        try:
            children = self.proc.children()
            now = time.monotonic()
            anon, pages, other = self._one(self.proc.pid, now)
        except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
            return None
        rec = {"t": now, "phase": self.phase, "shard_anon": anon, "shard_pages": pages,
               "shard_other": other, "workers": 0, "workers_anon": 0, "workers_pages": 0,
               "workers_other": 0, "worker_anon_max": 0}
        for p in children:
            try:
                anon, pages, other = self._one(p.pid, now)
            except (FileNotFoundError, ProcessLookupError):  # a worker that just exited
                continue
            rec["workers"] += 1
            rec["workers_anon"] += anon
            rec["workers_pages"] += pages
            rec["workers_other"] += other
            rec["worker_anon_max"] = max(rec["worker_anon_max"], anon)
        live = {p.pid for p in children} | {self.proc.pid}
        self._split = {k: v for k, v in self._split.items() if k in live}
        return rec

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                rec = self.sample()
            except OSError:
                self.errors += 1
                rec = None
            if rec is not None:
                self.samples.append(rec)
            self._halt.wait(self.every)

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


def derived(s: dict) -> dict:
    """The figures reported for one sample (bytes); ``rss*`` = RSS less table pages."""
    shard_rss = s["shard_anon"] + s["shard_other"]
    workers_rss = s["workers_anon"] + s["workers_other"]
    return {"shard anon": s["shard_anon"], "workers anon": s["workers_anon"],
            "total anon": s["shard_anon"] + s["workers_anon"],
            "shard rss*": shard_rss, "workers rss*": workers_rss,
            "total rss*": shard_rss + workers_rss,
            "table pages": s["shard_pages"] + s["workers_pages"], "workers": s["workers"],
            "worker anon max": s["worker_anon_max"]}


# --------------------------------------------------------------------------------- phases
def write_phase(client, keys: bytes, n: int, args, progress) -> None:
    """Write every key from ``args.writers`` threads, each its own slice, ``args.batch`` a call."""
    errors: list[BaseException] = []
    done = [0]
    lock = threading.Lock()

    def writer(w: int) -> None:
        try:
            for first in range(w * args.batch, n, args.batch * args.writers):
                batch = [key_at(keys, i) for i in range(first, min(first + args.batch, n))]
                client.write([(k, value_of(k, args.values)) for k in batch])
                with lock:
                    done[0] += len(batch)
                    progress(done[0])
        except BaseException as exc:  # noqa: BLE001  (re-raised in the main thread)
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(args.writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def settled(stats: dict, opts: Options) -> bool:
    """No frozen memtable, no compaction running, every level under its trigger/target."""
    if stats["memtable"]["frozen"] or stats["compaction_running"]:
        return False
    levels = stats["levels"]
    if levels[0]["tables"] >= opts.l0_compaction_trigger:
        return False
    return all(lv["target_bytes"] is None or lv["bytes"] < lv["target_bytes"] for lv in levels[1:])


def wait_settled(client, name: str, opts: Options, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    in_a_row = 0
    while time.monotonic() < deadline:
        st = client.stats()["shards"][name]
        in_a_row = in_a_row + 1 if settled(st, opts) else 0
        if in_a_row >= 2:
            return st
        time.sleep(0.5)
    raise RuntimeError(f"flushes and compactions not done after {timeout:.0f} s")


def read_phase(client, keys: bytes, n: int, args, rng: random.Random) -> dict:
    """Gets and MultiGets of random keys, half absent; returns counts, raises on a wrong answer."""
    def pick() -> tuple[bytes, bytes | None]:
        if rng.random() < 0.5:
            k = key_at(keys, rng.randrange(n))
            return k, value_of(k, args.values)
        return rng.randbytes(KEY_BYTES), None  # absent (a collision with 2**128 keys: no)

    found = 0
    for _ in range(args.gets):
        k, want = pick()
        got = client.get(k)
        if got != want:
            raise RuntimeError(f"Get {k.hex()}: wrong answer ({'found' if got else 'absent'})")
        found += got is not None
    for _ in range(args.multigets):
        picks = [pick() for _ in range(100)]
        got = client.multi_get([k for k, _ in picks])
        for (k, want), g in zip(picks, got):
            if g != want:
                raise RuntimeError(f"MultiGet {k.hex()}: wrong answer")
            found += g is not None
    return {"keys read": args.gets + 100 * args.multigets, "found": found}


# --------------------------------------------------------------------------------- report
def mib(x: float) -> str:
    return f"{x / MiB:7.1f} MiB"


def formula_before(opts: Options, table_bytes: int) -> dict:
    """deploy/README.md "Memory" until session 14: its terms for these options and data."""
    return {"shard process": OLD_SHARD,
            "table workers": opts.table_workers * OLD_WORKER,
            "memtables": (1 + opts.max_frozen_memtables) * opts.memtable_bytes,
            "block cache": opts.block_cache_bytes,
            "indexes (2% of tables)": int(OLD_INDEX_SHARE * table_bytes)}


def formula_now(opts: Options, st: dict) -> tuple[int, int]:
    """deploy/README.md "Memory" now: (a settled shard with what its engine holds at the end,
    the worst case: full memtables and cache, and every worker running the larger of a flush
    of a full memtable and a compaction of l0_stop_trigger L0 tables and one overlapping
    table, MERGE_BATCH entries held per input)."""
    index = NOW_INDEX_PER_BLOCK * sum(lv["data_blocks"] for lv in st["levels"])
    settled = (NOW_SHARD + st["memtable"]["bytes"] + st["memtable"]["frozen_bytes"]
               + st["block_cache"]["usage_bytes"] + index)
    entry = KEY_BYTES + VALUE_BYTES
    per_memtable = opts.memtable_bytes // (entry + MEMTABLE_PER_ENTRY)
    merge = (opts.l0_stop_trigger + 1) * MERGE_BATCH * (entry + NOW_MERGE_PER_ENTRY)
    worker = NOW_WORKER + max(merge, per_memtable * NOW_FLUSH_PER_ENTRY)
    worst = (NOW_SHARD + (1 + opts.max_frozen_memtables) * opts.memtable_bytes
             + opts.block_cache_bytes + index + opts.table_workers * worker)
    return settled, worst


def report(samples: list[dict], opts: Options, st: dict, start: dict, extra: dict) -> None:
    rows = [(s["phase"], derived(s)) for s in samples]
    phases = list(dict.fromkeys(p for p, _ in rows))
    names = ["shard anon", "workers anon", "total anon", "shard rss*", "workers rss*",
             "total rss*", "table pages"]
    heads = ["shard anon", "wrk anon", "total anon", "shard rss*", "wrk rss*", "total rss*", "table pages"]
    print(f"\n{len(samples)} samples; peak (max over the phase) and final (its last sample), MiB; "
          f"rss* = RSS less table pages (anonymous + libraries + other file pages):")
    print(f"{'':14s}" + "".join(f"{n:>12s}" for n in heads) + f"{'workers':>9s}")
    for ph in phases + ["run"]:
        sel = [d for p, d in rows if ph in (p, "run")]
        print(f"{ph + ' peak':14s}" + "".join(f"{max(d[n] for d in sel) / MiB:12.1f}" for n in names)
              + f"{max(d['workers'] for d in sel):9d}")
        print(f"{ph + ' final':14s}" + "".join(f"{sel[-1][n] / MiB:12.1f}" for n in names)
              + f"{sel[-1]['workers']:9d}")
    peak_worker = max(d["worker anon max"] for _, d in rows)
    tb = st["total_table_bytes"]
    entries = sum(lv["entries"] for lv in st["levels"])
    blocks = sum(lv["data_blocks"] for lv in st["levels"])
    print(f"\nshard at start (no table yet): anon {mib(start['shard_anon'])}, rss {mib(start['shard_anon'] + start['shard_other'])}")
    print(f"largest table worker seen: anon {mib(peak_worker)}")
    print(f"tables: {mib(tb)} on disk, {entries:,} entries, {blocks:,} data blocks, "
          f"{sum(lv['tables'] for lv in st['levels'])} tables "
          f"(levels {[lv['tables'] for lv in st['levels']]}), compression {st['compression']['ratio']}")
    mem_end = st["memtable"]["bytes"] + st["memtable"]["frozen_bytes"]
    cache = st["block_cache"]["usage_bytes"]
    print(f"engine accounts: memtables peak {mib(extra['mem_peak'])} (active + frozen, Stats polls), "
          f"at the end {mib(mem_end)}; block cache at the end {mib(cache)} of "
          f"{mib(st['block_cache']['capacity_bytes'])}; write stalls {st['write_stall']['stops']} "
          f"stops, {st['write_stall']['slowdowns']} slowdowns")
    last = derived(samples[-1])
    print(f"shard at the end less those two: anon {mib(last['shard anon'] - mem_end - cache)}, "
          f"rss* {mib(last['shard rss*'] - mem_end - cache)} (the process itself, its indexes and "
          f"what its heap kept)")
    terms = formula_before(opts, tb)
    doc = sum(terms.values())
    doc_writing = doc + opts.table_workers * (OLD_WORKER_WRITING - OLD_WORKER)
    print("\ndeploy/README formula before session 14: "
          + " + ".join(f"{k} {v / MiB:.1f}" for k, v in terms.items())
          + f" = {mib(doc)} (with workers at {OLD_WORKER_WRITING >> 20} MiB while writing: {mib(doc_writing)})")
    run = [d for _, d in rows]
    for label, key in (("anonymous", "total anon"), ("rss less table pages", "total rss*")):
        peak, final = max(d[key] for d in run), run[-1][key]
        print(f"measured / formula, {label:21s}: peak {mib(peak)} = {peak / doc:.2f}x "
              f"({peak / doc_writing:.2f}x of the writing figure); final {mib(final)} = {final / doc:.2f}x")
    settled, worst = formula_now(opts, st)
    peak = max(d["total rss*"] for d in run)
    print(f"deploy/README now: settled shard {mib(settled)} (100 MiB + memtable + block cache in use "
          f"+ {NOW_INDEX_PER_BLOCK} B per data block), shard rss* at the end {mib(last['shard rss*'])} = "
          f"{last['shard rss*'] / settled:.2f}x; worst case {mib(worst)} (full memtables and "
          f"cache, both workers busy), peak rss* {mib(peak)} = {peak / worst:.2f}x")


# --------------------------------------------------------------------------------- main
def run(args) -> int:
    from router.client import Client  # gRPC only in this process, never forked after

    engine_opts = dict(args.engine_option)
    opts = Options.from_kwargs(**engine_opts)
    os.makedirs(args.out, exist_ok=True)
    data = os.path.join(args.out, "data")
    shutil.rmtree(data, ignore_errors=True)
    argv = [sys.executable, "-m", "shard", "--data-dir", data, "--listen", "127.0.0.1:0",
            "--name", "footprint", "--exit-with-parent", "--log-level", "WARNING"]
    for name, value in args.engine_option:
        argv += ["--engine-option", f"{name}={json.dumps(value)}"]
    print(f"shard_footprint: keys {args.keys:,}, batch {args.batch}, writers {args.writers}, "
          f"values {args.values}, engine options {engine_opts or 'defaults'}; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    node = soak.Node("footprint", argv, args.out)
    sampler = None
    try:
        node.start()
        with open(os.path.join(args.out, "footprint.port")) as f:
            port = int(f.read().strip())
        print(f"shard pid {node.popen.pid} on 127.0.0.1:{port}, data in {data}", flush=True)
        sampler = Sampler(node.popen.pid)
        start = sampler.sample()
        sampler.start()
        rng = random.Random(args.seed)
        keys = rng.randbytes(KEY_BYTES * args.keys)
        with Client(f"127.0.0.1:{port}", timeout=120.0) as c:
            mem_peak = [0]
            last = [time.monotonic(), time.monotonic()]
            t0 = time.monotonic()

            def progress(done: int) -> None:  # under the writers' lock
                now = time.monotonic()
                if now - last[0] >= 0.5 or done == args.keys:
                    last[0] = now
                    m = c.stats()["shards"]["footprint"]["memtable"]
                    mem_peak[0] = max(mem_peak[0], m["bytes"] + m["frozen_bytes"])
                if now - last[1] >= 10 or done == args.keys:
                    last[1] = now
                    print(f"  wrote {done:,} keys in {now - t0:.0f} s ({done / (now - t0):,.0f} keys/s), "
                          f"load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)

            sampler.phase = "write"
            write_phase(c, keys, args.keys, args, progress)
            t_write = time.monotonic() - t0
            sampler.phase = "settle"
            st = wait_settled(c, "footprint", opts, args.settle_timeout)
            t_settle = time.monotonic() - t0 - t_write
            sampler.phase = "read"
            t1 = time.monotonic()
            reads = read_phase(c, keys, args.keys, args, random.Random(args.seed + 1))
            t_read = time.monotonic() - t1
            if args.compact:
                sampler.phase = "compact"
                t2 = time.monotonic()
                c.compact(timeout=args.settle_timeout)
                print(f"manual compaction (Admin.Compact) {time.monotonic() - t2:.1f} s", flush=True)
            st = c.stats()["shards"]["footprint"]
            if args.wait_idle:
                sampler.phase = "idle"
                deadline = time.monotonic() + 300
                while sampler.samples[-1]["workers"] and time.monotonic() < deadline:
                    time.sleep(0.5)
            time.sleep(3 * sampler.every)  # a last sample of the final phase
        sampler.stop()
        print(f"write {t_write:.1f} s ({args.keys / t_write:,.0f} keys/s), settle {t_settle:.1f} s, "
              f"read {t_read:.1f} s ({reads['keys read']:,} keys, {reads['found']:,} found, every "
              f"answer checked); load average {os.getloadavg()[0]:.2f}; sampler errors {sampler.errors}")
        report(sampler.samples, opts, st, start, {"mem_peak": mem_peak[0]})
        rc, took = node.stop(signal.SIGTERM)
        print(f"shard stopped: exit code {rc} in {took:.1f} s")
        return 0 if rc == 0 else 1
    finally:
        if sampler is not None and sampler.is_alive():
            sampler.stop()
        node.kill_group()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=1000, help="mutations per KV.Write")
    ap.add_argument("--writers", type=int, default=1, help="threads writing at once")
    ap.add_argument("--values", choices=("random", "text"), default="random")
    ap.add_argument("--gets", type=int, default=20_000)
    ap.add_argument("--multigets", type=int, default=1_000, help="MultiGets of 100 keys")
    ap.add_argument("--compact", action="store_true", help="after the reads, a manual compaction")
    ap.add_argument("--wait-idle", action="store_true", help="end once the table workers exited")
    ap.add_argument("--settle-timeout", type=float, default=1800.0)
    ap.add_argument("--engine-option", action="append", default=[], type=parse_engine_option,
                    metavar="NAME=VALUE", help="passed to the shard; repeatable")
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "sievekv-footprint"))
    args = ap.parse_args(argv)
    if args.keys < 1 or args.batch < 1 or args.writers < 1:
        ap.error("--keys, --batch and --writers must be >= 1")
    try:
        Options.from_kwargs(**dict(args.engine_option))
    except SieveError as exc:
        ap.error(f"--engine-option: {exc}")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
