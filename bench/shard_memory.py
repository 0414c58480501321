"""Where does a shard's anonymous memory go under the soak's load? (bench/results/soak.md, session 9)

    python3 bench/shard_memory.py [--duration 3600] [--out DIR] [--clients 2] [--warm 600]
                                  [--every 20] [--config NAME:OPTS ...]
    python3 bench/shard_memory.py --analyze DIR [--warm 600]

Starts one shard per ``--config`` (default four: ``base``, ``trace`` = under
``-X tracemalloc=25``, ``arena2`` = ``MALLOC_ARENA_MAX=2``, ``w4`` = ``--workers 4``), one
router over them (an even cluster map, so each shard gets the same share of the keys) and the
soak's load processes (bench/soak.py: ``load_client`` x --clients and ``admin_client``).
No restarts. OPTS is a comma list of ``trace``, ``arena=N``, ``workers=N``, ``trimevery=S``
(a ``malloc_trim(0)`` every S seconds inside the shard), ``env.NAME=VALUE`` (in the shard's
environment, e.g. ``env.LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2``: the mallinfo
figures then describe glibc's unused heap, only the RSS measures count;
``env.SHARD_MEM_SYSPATH=DIR`` runs the shard and engine code of the tree at DIR, e.g. a
``git archive HEAD`` export, to compare before and after a fix in one run).

Every shard runs its real ``shard.worker.main`` under a wrapper (``python -c WRAPPER``; no shard
code changes) whose daemon thread writes one JSON line every --every seconds to
``DIR/<name>.mem.jsonl``: from /proc/self/smaps the anonymous memory split into the main
malloc heap (``[heap]``), glibc thread arenas (anonymous mappings aligned to 64 MiB, the
arenas' HEAP_MAX_SIZE), thread stacks and the rest (pymalloc arenas, large mallocs, gRPC's own
mmaps); ``mallinfo2()`` (arena, hblkhd, uordblks, fordblks); the number of malloc heaps
(``malloc_info``); ``sys.getallocatedblocks()``; gc counts and object count; threads; with
``trace``: tracemalloc's traced bytes and its own overhead. Control words written to
``DIR/<name>.ctl`` run in that thread: ``snap0`` (tracemalloc snapshot + type counts),
``snap1`` (the same, and the top 15 growths since snap0 by line and the top 5 by traceback),
``gc`` (a full ``gc.collect()``, sample before and after), ``trim`` (``malloc_trim(0)``, sample
before and after). The harness sends ``snap0`` at --warm, then ``snap1``, ``gc`` and ``trim``
at the end, after the load stopped.

--analyze prints, per shard, first/last and least-squares slopes (per hour) after --warm of
each measure while the load ran, over the whole window and over its first and second halves
(does it level off?). Load runs at the caller's priority: run it under ``nice``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)

import soak  # noqa: E402  (bench/soak.py: load, admin, Node, free_port)

MiB = 1 << 20

WRAPPER = r'''
import ctypes, gc, json, os, sys, threading, time, tracemalloc
from collections import Counter

OUT, CTL, EVERY = os.environ["SHARD_MEM_OUT"], os.environ["SHARD_MEM_CTL"], float(os.environ["SHARD_MEM_EVERY"])
TRIM_EVERY = float(os.environ.get("SHARD_MEM_TRIM_EVERY") or 0)
libc = ctypes.CDLL("libc.so.6")
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = MallInfo2
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.fclose.argtypes = [ctypes.c_void_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.malloc_trim.argtypes = [ctypes.c_size_t]
T0 = time.time()
HEAP_ALIGN = 64 << 20

def smaps():
    out = {"anon_heap": 0, "anon_arenas": 0, "anon_stacks": 0, "anon_other": 0, "anon_file": 0,
           "n_arena_maps": 0, "n_anon_maps": 0}
    cur = None
    with open("/proc/self/smaps") as f:
        for line in f:
            first = line.split(None, 5)
            if "-" in first[0] and len(first) >= 5 and ":" not in first[0]:
                lo, hi = (int(x, 16) for x in first[0].split("-"))
                path = first[5].strip() if len(first) > 5 else ""
                size = hi - lo
                if path == "[heap]": cur = "anon_heap"
                elif path.startswith("[stack"): cur = "anon_stacks"
                elif path.startswith("["): cur = "anon_other"
                elif path: cur = "anon_file"
                elif lo % HEAP_ALIGN == 0 and size <= HEAP_ALIGN:
                    cur = "anon_arenas"; out["n_arena_maps"] += 1
                elif size in ((8 << 20) - 4096, 8 << 20, (8 << 20) + 4096): cur = "anon_stacks"
                else: cur = "anon_other"
                if not path: out["n_anon_maps"] += 1
            elif line.startswith("Anonymous:"):
                out[cur] += int(line.split()[1]) * 1024
    out["anon"] = out["anon_heap"] + out["anon_arenas"] + out["anon_stacks"] + out["anon_other"] + out["anon_file"]
    return out

def heaps():
    path = CTL + ".mi"
    fp = libc.fopen(path.encode(), b"w")
    libc.malloc_info(0, fp); libc.fclose(fp)
    text = open(path).read(); os.remove(path)
    return text.count("<heap nr=")

def sample(event=None):
    mi = libc.mallinfo2()
    rec = {"t": round(time.time() - T0, 1), **smaps(),
           "m_arena": mi.arena, "m_hblkhd": mi.hblkhd, "m_uord": mi.uordblks, "m_ford": mi.fordblks,
           "m_keep": mi.keepcost, "m_heaps": heaps(), "blocks": sys.getallocatedblocks(),
           "gc_counts": gc.get_count(), "gc_collected": sum(s["collected"] for s in gc.get_stats()),
           "threads": len(os.listdir("/proc/self/task")), "py_threads": threading.active_count()}
    if tracemalloc.is_tracing():
        rec["tm_traced"], rec["tm_peak"] = tracemalloc.get_traced_memory()
        rec["tm_overhead"] = tracemalloc.get_tracemalloc_memory()
    if event: rec["event"] = event
    return rec

def types():
    return Counter(type(o).__qualname__ for o in gc.get_objects())

snaps = {}
def control(word, out):
    if word == "snap0":
        snaps["types"] = types()
        if tracemalloc.is_tracing(): snaps["tm"] = tracemalloc.take_snapshot()
        out.write(json.dumps({**sample("snap0"), "objects": sum(snaps["types"].values())}) + "\n")
    elif word == "snap1":
        now = types()
        rec = {**sample("snap1"), "objects": sum(now.values())}
        if "types" in snaps:
            d = now.copy(); d.subtract(snaps["types"])
            rec["type_growth"] = [(k, v) for k, v in d.most_common(15) if v > 0]
        if "tm" in snaps:
            flt = [tracemalloc.Filter(False, tracemalloc.__file__)]
            s1 = tracemalloc.take_snapshot().filter_traces(flt)
            s0 = snaps["tm"].filter_traces(flt)
            rec["tm_lineno"] = [(str(st.traceback[0]), st.size_diff, st.count_diff)
                                for st in s1.compare_to(s0, "lineno")[:15]]
            rec["tm_traceback"] = [(st.size_diff, st.count_diff, [str(fr) for fr in st.traceback[:12]])
                                   for st in s1.compare_to(s0, "traceback")[:5]]
        out.write(json.dumps(rec) + "\n")
    elif word == "gc":
        out.write(json.dumps(sample("pre_gc")) + "\n")
        found = gc.collect()
        out.write(json.dumps({**sample("post_gc"), "collected": found}) + "\n")
    elif word == "trim":
        out.write(json.dumps(sample("pre_trim")) + "\n")
        libc.malloc_trim(0)
        out.write(json.dumps(sample("post_trim")) + "\n")

def run():
    nxt = time.time(); nxt_trim = time.time() + TRIM_EVERY
    with open(OUT, "a", buffering=1) as out:
        while True:
            now = time.time()
            try:
                if os.path.exists(CTL):
                    word = open(CTL).read().strip(); os.remove(CTL)
                    control(word, out)
                if TRIM_EVERY and now >= nxt_trim:
                    nxt_trim += TRIM_EVERY; libc.malloc_trim(0)
                if now >= nxt:
                    nxt += EVERY
                    out.write(json.dumps(sample()) + "\n")
            except Exception as e:
                out.write(json.dumps({"t": round(now - T0, 1), "error": repr(e)}) + "\n")
            time.sleep(0.5)

threading.Thread(target=run, name="mem-sampler", daemon=True).start()
if os.environ.get("SHARD_MEM_SYSPATH"):  # another tree's code (before/after a fix)
    sys.path.insert(0, os.environ["SHARD_MEM_SYSPATH"])
from shard.worker import main
sys.exit(main(sys.argv[1:]))
'''

DEFAULT_CONFIGS = ["base:", "trace:trace", "arena2:arena=2", "w4:workers=4"]
ENGINE = ["memtable_bytes=262144", "target_file_size=262144", "max_bytes_for_level_base=1048576",
          "filter_memory_cap=65536", "block_cache_bytes=1048576"]  # soak.py's


def parse_config(text: str) -> tuple[str, dict]:
    name, _, opts = text.partition(":")
    cfg: dict = {}
    for o in filter(None, opts.split(",")):
        k, _, v = o.partition("=")
        cfg[k] = v or True
    return name, cfg


def shard_node(name: str, cfg: dict, out: str, port: int, every: float) -> tuple[soak.Node, dict]:
    xopts = ["-X", "tracemalloc=25"] if cfg.get("trace") else []
    argv = [sys.executable, *xopts, "-c", WRAPPER, "--data-dir", f"{out}/{name}", "--listen",
            f"127.0.0.1:{port}", "--name", name, "--exit-with-parent", "--log-level", "WARNING"]
    if cfg.get("workers"):
        argv += ["--workers", str(cfg["workers"])]
    for e in ENGINE:
        argv += ["--engine-option", e]
    env = {"SHARD_MEM_OUT": f"{out}/{name}.mem.jsonl", "SHARD_MEM_CTL": f"{out}/{name}.ctl",
           "SHARD_MEM_EVERY": str(every), "SHARD_MEM_TRIM_EVERY": str(cfg.get("trimevery", 0))}
    if cfg.get("arena"):
        env["MALLOC_ARENA_MAX"] = str(cfg["arena"])
    env.update({k[4:]: v for k, v in cfg.items() if k.startswith("env.")})
    return soak.Node(name, argv, out), env


def start_with_env(node: soak.Node, env: dict) -> None:
    """soak.Node.start inherits os.environ: set ``env`` around it."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        node.start()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def control(out: str, name: str, word: str, event: str, timeout: float = 120) -> None:
    """Write ``word`` to the shard's control file and wait for its record ``event``."""
    path = f"{out}/{name}.mem.jsonl"
    seen = sum(1 for _ in open(path))
    with open(f"{out}/{name}.ctl.tmp", "w") as f:
        f.write(word)
    os.replace(f"{out}/{name}.ctl.tmp", f"{out}/{name}.ctl")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = open(path).readlines()[seen:]
        if any(json.loads(l).get("event") == event for l in lines if l.strip()):
            return
        time.sleep(0.5)
    print(f"{name}: no {event} record within {timeout} s", flush=True)


def run(args) -> None:
    os.makedirs(args.out, exist_ok=True)
    configs = [parse_config(c) for c in (args.config or DEFAULT_CONFIGS)]
    t0 = time.time()
    stop_at = t0 + args.duration
    ports = [soak.free_port() for _ in configs]
    rport = soak.free_port()
    addr = f"127.0.0.1:{rport}"
    ctx = mp.get_context("spawn")
    clients = [ctx.Process(target=soak.load_client,
                           args=(i, addr, stop_at, f"{args.out}/client{i}.json", i == 0, args.keys))
               for i in range(args.clients)]
    clients.append(ctx.Process(target=soak.admin_client, args=(addr, stop_at, f"{args.out}/admin.jsonl")))
    with open(f"{args.out}/configs.json", "w") as f:
        json.dump({"configs": configs, "args": vars(args), "t0": t0}, f)
    nodes = []
    router = None
    try:
        for (name, cfg), port in zip(configs, ports):
            node, env = shard_node(name, cfg, args.out, port, args.every)
            nodes.append(node)
            start_with_env(node, env)
        from router.cluster_map import ClusterMap
        map_path = f"{args.out}/cluster.toml"
        with open(map_path, "w") as f:
            f.write(ClusterMap.even([(n, f"127.0.0.1:{p}") for (n, _), p in zip(configs, ports)]).to_toml())
        router = soak.Node("router", [sys.executable, "-m", "router", "--cluster-map", map_path, "--listen",
                                      addr, "--processes", "1", "--exit-with-parent", "--log-level",
                                      "WARNING"], args.out)
        router.start()
        for c in clients:
            c.start()
        snapped = False
        while time.time() < stop_at:
            if not snapped and time.time() - t0 >= args.warm:
                snapped = True
                for name, _ in configs:
                    control(args.out, name, "snap0", "snap0")
                print(f"t={time.time() - t0:.0f} snap0 taken", flush=True)
            for n in [router, *nodes]:
                if n.popen.poll() is not None:
                    raise RuntimeError(f"{n.name} exited {n.popen.returncode}")
            time.sleep(1)
        for c in clients:
            c.join(60)
        time.sleep(5)  # quiescent
        for name, _ in configs:
            control(args.out, name, "snap1", "snap1", timeout=300)
            control(args.out, name, "gc", "post_gc")
            control(args.out, name, "trim", "post_trim")
        for n in nodes:
            print(n.name, "stop", n.stop(signal.SIGTERM), flush=True)
        print("router stop", router.stop(signal.SIGTERM), flush=True)
    finally:
        for c in clients:
            if c.is_alive():
                c.kill()
        for n in [router, *nodes]:
            if n is not None:
                n.kill_group()
    analyze(args.out, args.warm)


def slope(pts):
    n = len(pts)
    if n < 3:
        return float("nan")
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else 0.0


MEASURES = [  # (key, divisor, unit)
    ("anon", MiB, "MiB"), ("anon_heap", MiB, "MiB"), ("anon_arenas", MiB, "MiB"),
    ("anon_other", MiB, "MiB"), ("anon_stacks", MiB, "MiB"), ("n_arena_maps", 1, ""),
    ("m_arena", MiB, "MiB"), ("m_hblkhd", MiB, "MiB"), ("m_uord", MiB, "MiB"), ("m_ford", MiB, "MiB"),
    ("m_heaps", 1, ""), ("blocks", 1000, "k"), ("tm_traced", MiB, "MiB"), ("tm_overhead", MiB, "MiB"),
    ("threads", 1, ""),
]


def analyze(out: str, warm: float) -> None:
    meta = json.load(open(f"{out}/configs.json"))
    calls = 0
    for name in os.listdir(out):
        if name.startswith("client") and name.endswith(".json"):
            calls += sum(json.load(open(f"{out}/{name}"))["counts"].values())
    print(f"run {out}: configs {meta['configs']}; warm-up cut at {warm} s; client calls {calls}")
    for name, cfg in meta["configs"]:
        recs = [json.loads(l) for l in open(f"{out}/{name}.mem.jsonl") if l.strip()]
        plain = [r for r in recs if "event" not in r and "error" not in r]
        errors = [r for r in recs if "error" in r]
        until = meta["args"]["duration"] - 10  # the load stops then (shard clocks start later)
        post = [r for r in plain if warm <= r["t"] <= until]
        print(f"\n== {name} {cfg}: {len(plain)} samples, t={plain[0]['t']}..{plain[-1]['t']} s, "
              f"{len(errors)} sampler errors {errors[:1]}")
        for key, div, unit in MEASURES:
            pts = [(r["t"], r[key]) for r in post if key in r]
            if len(pts) < 3:
                continue
            half = len(pts) // 2
            print(f"  {key:13s} first {pts[0][1] / div:9.2f} last {pts[-1][1] / div:9.2f} "
                  f"min {min(y for _, y in pts) / div:9.2f} max {max(y for _, y in pts) / div:9.2f} "
                  f"slope {slope(pts) * 3600 / div:8.2f} {unit}/h (halves "
                  f"{slope(pts[:half]) * 3600 / div:.2f}, {slope(pts[half:]) * 3600 / div:.2f})")
        for r in recs:
            ev = r.get("event")
            if ev in ("pre_trim", "post_trim", "pre_gc", "post_gc"):
                print(f"  {ev:9s} anon {r['anon'] / MiB:.2f} heap {r['anon_heap'] / MiB:.2f} arenas "
                      f"{r['anon_arenas'] / MiB:.2f} other {r['anon_other'] / MiB:.2f} MiB; "
                      f"mallinfo arena {r['m_arena'] / MiB:.2f} uord {r['m_uord'] / MiB:.2f} "
                      f"ford {r['m_ford'] / MiB:.2f} MiB heaps {r['m_heaps']}"
                      + (f"; gc collected {r['collected']}" if "collected" in r else ""))
            elif ev in ("snap0", "snap1"):
                print(f"  {ev}: t={r['t']} objects {r.get('objects')}")
                if r.get("type_growth"):
                    print("    type growth:", r["type_growth"])
                for line, size, count in r.get("tm_lineno", []):
                    print(f"    {size / 1024:9.1f} KiB {count:+7d}  {line}")
                for size, count, tb in r.get("tm_traceback", []):
                    print(f"    tb {size / 1024:.1f} KiB {count:+d}:\n      " + "\n      ".join(tb))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=3600)
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "sievekv-shard-memory"))
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--keys", type=int, default=soak.KEYS)
    ap.add_argument("--warm", type=float, default=600)
    ap.add_argument("--every", type=float, default=20)
    ap.add_argument("--config", action="append", help="NAME:OPTS (see the module docstring); repeatable")
    ap.add_argument("--analyze", metavar="DIR")
    args = ap.parse_args()
    if args.analyze:
        return analyze(args.analyze, args.warm)
    run(args)


if __name__ == "__main__":
    main()
