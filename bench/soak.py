"""Soak: does any sievekv process or directory grow over time with a bounded key space?

    python3 bench/soak.py [--duration 780] [--out DIR] [--keys 12000] [--clients 3]
                          [--shard-restart-every 90] [--router-restart-every 150] [--kill-at 330]
    python3 bench/soak.py --analyze DIR [--warm 180]

Starts 3 shard processes (fixed free ports, small memtables and tables so flushes and
compactions run every few seconds, a 64 KiB filter cap) and one router, then --clients load
processes (router.client.Client: puts/overwrites/deletes of --keys keys, gets, multi_gets,
batched writes, scans with a limit, scans abandoned half-way, gets of missing keys; client 0
also flushes every 30 s and compacts every 100 s) and one admin process (Stats + FilterReport
every 10 s, to DIR/admin.jsonl). Every --shard-restart-every s one shard is stopped (SIGTERM,
once SIGKILL at --kill-at) and started again on its port; every --router-restart-every s the
router. Every 10 s DIR/samples.jsonl gets, per process (and its children): RSS (anonymous and
file-backed apart: tables are memory-mapped, so file pages count in RSS), descriptors (those on
deleted files apart), threads; per data directory: files, bytes, .sst/.log/MANIFEST/.tmp.
Stops every process it started (SIGTERM at the end, SIGKILL of the process groups on error).
--analyze prints first/last/min/max and least-squares slopes after the warm-up, per process
incarnation for the shards. Results: bench/results/soak.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

KEYS = 12000  # --keys


def key(i: int) -> bytes:
    return b"key%08d" % i


# --------------------------------------------------------------------------------- clients
def load_client(idx: int, address: str, stop_at: float, out: str, flusher: bool, keys: int):
    global KEYS
    KEYS = keys
    from router.client import Client
    from router.client_errors import ClientError

    rng = random.Random(idx)
    counts: dict[str, int] = {}
    errs: dict[str, int] = {}
    c = Client(address, timeout=10.0)
    last_flush = last_compact = time.monotonic()
    last_dump = 0.0

    def bump(d, k):
        d[k] = d.get(k, 0) + 1

    while time.time() < stop_at:
        r = rng.random()
        op = "?"
        try:
            if r < 0.33:
                op = "put"
                c.put(key(rng.randrange(KEYS)), rng.randbytes(rng.randrange(50, 1500)))
            elif r < 0.41:
                op = "delete"
                c.delete(key(rng.randrange(KEYS)))
            elif r < 0.63:
                op = "get"
                c.get(key(rng.randrange(KEYS)))
            elif r < 0.73:
                op = "multi_get"
                c.multi_get([key(rng.randrange(KEYS)) for _ in range(50)])
            elif r < 0.78:
                op = "write"
                c.write([(key(rng.randrange(KEYS)), None if rng.random() < 0.3 else rng.randbytes(200))
                         for _ in range(20)])
            elif r < 0.86:
                op = "scan_limit"
                s = rng.randrange(KEYS)
                sum(1 for _ in c.scan(key(s), None, limit=100))
            elif r < 0.93:
                op = "scan_abandon"
                s = rng.randrange(KEYS)
                it = c.scan(key(s), key(min(KEYS, s + 2000)))
                for j, _ in enumerate(it):
                    if j >= 30:
                        break
                if rng.random() < 0.5:
                    it.close()  # half explicit, half left to gc
                del it
            elif r < 0.945:
                op = "scan_full_abandon"
                it = c.scan()
                for j, _ in enumerate(it):
                    if j >= 500:
                        break
                del it
            else:
                op = "get_missing"
                c.get(b"nokey%08d" % rng.randrange(10 ** 8))
            bump(counts, op)
        except ClientError as e:
            bump(errs, f"{op}:{type(e).__name__}")
            time.sleep(0.05)
        except Exception as e:  # noqa: BLE001
            bump(errs, f"{op}:OTHER:{type(e).__name__}:{str(e)[:80]}")
            time.sleep(0.05)
        now = time.monotonic()
        if flusher:
            try:
                if now - last_flush > 30:
                    last_flush = now
                    c.flush(timeout=60)
                    bump(counts, "flush")
                if now - last_compact > 100:
                    last_compact = now
                    c.compact(timeout=300)
                    bump(counts, "compact")
            except ClientError as e:
                bump(errs, f"admin:{type(e).__name__}")
        if now - last_dump > 5:
            last_dump = now
            with open(out + ".tmp", "w") as f:
                json.dump({"counts": counts, "errors": errs}, f)
            os.replace(out + ".tmp", out)
    c.close()
    with open(out, "w") as f:
        json.dump({"counts": counts, "errors": errs, "done": True}, f)


def admin_client(address: str, stop_at: float, out: str):
    """Stats + FilterReport every 10 s; appends one JSON line per round."""
    from router.client import Client
    from router.client_errors import ClientError

    c = Client(address, timeout=20.0)
    with open(out, "a") as f:
        while time.time() < stop_at:
            t = time.time()
            rec = {"t": t}
            try:
                st = c.stats()
                fr = c.filter_report()
                shards = {}
                for name, s in (st.get("shards") or {}).items():
                    lv = s.get("levels", [])
                    shards[name] = {
                        "tables": [l["tables"] for l in lv],
                        "table_bytes": s.get("total_table_bytes"),
                        "mem_bytes": (s.get("memtable") or {}).get("bytes"),
                        "frozen": (s.get("memtable") or {}).get("frozen"),
                        "log_bytes": (s.get("log") or {}).get("bytes"),
                        "block_cache": s.get("block_cache"),
                        "mapped_tables": (s.get("reads") or {}).get("mapped_tables"),
                        "workers": s.get("table_workers"),
                        "bg_errors": s.get("background_errors"),
                        "entries": sum(l["entries"] for l in lv),
                    }
                for name, r in (fr.get("shards") or {}).items():
                    tot = r.get("totals", {})
                    cap = r.get("cap", {})
                    shards.setdefault(name, {}).update({
                        "f_tables": tot.get("tables"), "f_partitions": tot.get("partitions"),
                        "f_resident": tot.get("resident_bytes"), "f_mapped": tot.get("mapped_bytes"),
                        "f_part_resident": tot.get("partitions_resident"),
                        "cap_tracked": cap.get("tracked_resident_bytes"),
                        "cap_parts": cap.get("resident_partitions"),
                        "cap_measured": cap.get("measured_resident_bytes"),
                        "cap_evictions": cap.get("evictions"),
                    })
                rec["shards"] = shards
            except ClientError as e:
                rec["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            except Exception as e:  # noqa: BLE001
                rec["error"] = f"OTHER {type(e).__name__}: {str(e)[:200]}"
            f.write(json.dumps(rec, default=str) + "\n")
            f.flush()
            time.sleep(max(0.0, 10 - (time.time() - t)))
    c.close()


# --------------------------------------------------------------------------------- cluster
class Node:
    def __init__(self, name, argv, run_dir):
        self.name, self.argv, self.run_dir = name, argv, run_dir
        self.popen = None
        self.starts = 0

    def start(self):
        port_file = os.path.join(self.run_dir, f"{self.name}.port")
        if os.path.exists(port_file):
            os.remove(port_file)
        log = open(os.path.join(self.run_dir, f"{self.name}.log"), "ab")
        self.popen = subprocess.Popen([*self.argv, "--port-file", port_file], cwd=REPO, stdout=log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True)
        log.close()
        self.starts += 1
        deadline = time.monotonic() + 60
        while not os.path.exists(port_file):
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.popen.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready")
            time.sleep(0.05)

    def stop(self, sig=signal.SIGTERM):
        t = time.monotonic()
        self.popen.send_signal(sig)
        try:
            rc = self.popen.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            rc = self.popen.wait(10)
            rc = f"hung->killed({rc})"
        return rc, time.monotonic() - t

    def kill_group(self):
        if self.popen and self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.popen.wait(10)


def free_port():
    from tests.conftest import free_port as fp
    return fp()


def _rss_split(pid) -> tuple[int, int]:
    """(RssAnon, RssFile) in bytes from /proc/PID/status."""
    anon = file = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                anon = int(line.split()[1]) * 1024
            elif line.startswith("RssFile:"):
                file = int(line.split()[1]) * 1024
    return anon, file


def proc_sample(pid):
    import psutil
    try:
        p = psutil.Process(pid)
        procs = [p] + p.children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    out = {"pid": pid, "n": len(procs), "rss": 0, "fds": 0, "threads": 0, "deleted_fds": 0,
           "sockets": 0, "children": []}
    for q in procs:
        try:
            rss = q.memory_info().rss
            fdd = f"/proc/{q.pid}/fd"
            fds = os.listdir(fdd)
            dele = socks = 0
            for fd in fds:
                try:
                    tgt = os.readlink(os.path.join(fdd, fd))
                except OSError:
                    continue
                if tgt.endswith("(deleted)"):
                    dele += 1
                if tgt.startswith("socket:"):
                    socks += 1
            th = q.num_threads()
            anon, file = _rss_split(q.pid)
        except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
            continue
        if q.pid == pid:
            out.update(rss=rss, anon=anon, file=file, fds=len(fds), threads=th, deleted_fds=dele,
                       sockets=socks)
        else:
            out["children"].append({"pid": q.pid, "rss": rss, "fds": len(fds), "threads": th,
                                    "deleted_fds": dele})
    return out


def dir_sample(d):
    out = {"files": 0, "bytes": 0, "log": 0, "sst": 0, "manifest": 0, "tmp": 0, "manifest_bytes": 0,
           "log_bytes": 0, "other": []}
    for name in os.listdir(d):
        try:
            sz = os.path.getsize(os.path.join(d, name))
        except OSError:
            continue
        out["files"] += 1
        out["bytes"] += sz
        if name.endswith(".log"):
            out["log"] += 1
            out["log_bytes"] += sz
        elif name.endswith(".sst"):
            out["sst"] += 1
        elif name.startswith("MANIFEST-"):
            out["manifest"] += 1
            out["manifest_bytes"] += sz
        elif name.endswith(".tmp"):
            out["tmp"] += 1
        elif name not in ("CURRENT", "LOCK"):
            out["other"].append(name)
    return out


def main():
    global KEYS
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=720)
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "sievekv-soak"))
    ap.add_argument("--shard-restart-every", type=float, default=90)
    ap.add_argument("--router-restart-every", type=float, default=150)
    ap.add_argument("--kill-at", type=float, default=330)
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--keys", type=int, default=KEYS)
    ap.add_argument("--analyze", metavar="DIR", help="print the summary of a finished run")
    ap.add_argument("--warm", type=float, default=180, help="--analyze: seconds of warm-up left out")
    args = ap.parse_args()
    if args.analyze:
        return analyze(args.analyze, args.warm)
    KEYS = args.keys
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    stop_at = t0 + args.duration

    ports = [free_port() for _ in range(4)]
    rport = ports[3]
    # clients first (spawn, before any grpc object in this process; none is ever made here)
    ctx = mp.get_context("spawn")
    addr = f"127.0.0.1:{rport}"
    clients = [ctx.Process(target=load_client, args=(i, addr, stop_at, f"{args.out}/client{i}.json", i == 0, args.keys))
               for i in range(args.clients)]
    clients.append(ctx.Process(target=admin_client, args=(addr, stop_at, f"{args.out}/admin.jsonl")))

    eng = ["memtable_bytes=262144", "target_file_size=262144", "max_bytes_for_level_base=1048576",
           "filter_memory_cap=65536", "block_cache_bytes=1048576"]
    shards = []
    for i in range(3):
        argv = [sys.executable, "-m", "shard", "--data-dir", f"{args.out}/s{i}", "--listen",
                f"127.0.0.1:{ports[i]}", "--name", f"s{i}", "--exit-with-parent", "--log-level", "WARNING"]
        for e in eng:
            argv += ["--engine-option", e]
        shards.append(Node(f"s{i}", argv, args.out))
    for s in shards:
        s.start()
    sys.path.insert(0, REPO)
    from router.cluster_map import ClusterMap
    map_path = f"{args.out}/cluster.toml"
    with open(map_path, "w") as f:
        f.write(ClusterMap.even([(f"s{i}", f"127.0.0.1:{ports[i]}") for i in range(3)]).to_toml())
    router = Node("router", [sys.executable, "-m", "router", "--cluster-map", map_path, "--listen",
                             addr, "--processes", "1", "--exit-with-parent", "--log-level", "WARNING"],
                  args.out)
    router.start()
    for c in clients:
        c.start()

    events = open(f"{args.out}/events.jsonl", "a")
    samples = open(f"{args.out}/samples.jsonl", "a")

    def event(**kw):
        kw["t"] = round(time.time() - t0, 1)
        events.write(json.dumps(kw) + "\n")
        events.flush()
        print(json.dumps(kw), flush=True)

    next_sample = t0
    next_shard = t0 + args.shard_restart_every
    next_router = t0 + args.router_restart_every
    killed = False
    rr = 0
    try:
        while time.time() < stop_at:
            now = time.time()
            if now >= next_sample:
                next_sample += 10
                rec = {"t": round(now - t0, 1), "shards": {}, "dirs": {}, "clients": []}
                for s in shards:
                    rec["shards"][s.name] = proc_sample(s.popen.pid)
                    rec["dirs"][s.name] = dir_sample(f"{args.out}/{s.name}")
                rec["router"] = proc_sample(router.popen.pid)
                rec["clients"] = [proc_sample(c.pid) for c in clients]
                la = os.getloadavg()[0]
                rec["load"] = la
                samples.write(json.dumps(rec) + "\n")
                samples.flush()
                sh = rec["shards"]
                print(f"t={rec['t']:.0f} load={la:.1f} " + " ".join(
                    f"{n}:rss={v['rss'] >> 20}M fd={v['fds']} th={v['threads']} del={v['deleted_fds']} "
                    f"sst={rec['dirs'][n]['sst']} log={rec['dirs'][n]['log']} mf={rec['dirs'][n]['manifest']}"
                    f"/{rec['dirs'][n]['manifest_bytes']}" for n, v in sh.items() if v)
                    + f" | router rss={rec['router']['rss'] >> 20}M fd={rec['router']['fds']} th={rec['router']['threads']}"
                    + " | clients " + ",".join(f"{c['rss'] >> 20}M/{c['fds']}" for c in rec["clients"] if c),
                    flush=True)
            if now >= next_shard and now < stop_at - 30:
                next_shard += args.shard_restart_every
                s = shards[rr % 3]
                rr += 1
                sig = signal.SIGTERM
                if not killed and now - t0 >= args.kill_at:
                    sig, killed = signal.SIGKILL, True
                rc, took = s.stop(sig)
                s.start()
                event(what="shard_restart", shard=s.name, sig=sig.name, rc=rc, stop_s=round(took, 2))
            if now >= next_router and now < stop_at - 30:
                next_router += args.router_restart_every
                rc, took = router.stop(signal.SIGTERM)
                router.start()
                event(what="router_restart", rc=rc, stop_s=round(took, 2))
            time.sleep(0.2)
        for c in clients:
            c.join(60)
        # final sample after load stops (quiescent)
        time.sleep(5)
        rec = {"t": round(time.time() - t0, 1), "final": True, "shards": {}, "dirs": {}}
        for s in shards:
            rec["shards"][s.name] = proc_sample(s.popen.pid)
            rec["dirs"][s.name] = dir_sample(f"{args.out}/{s.name}")
        rec["router"] = proc_sample(router.popen.pid)
        samples.write(json.dumps(rec) + "\n")
        # graceful stop
        for s in shards:
            rc, took = s.stop(signal.SIGTERM)
            event(what="final_stop", shard=s.name, rc=rc, stop_s=round(took, 2))
        rc, took = router.stop(signal.SIGTERM)
        event(what="final_stop", shard="router", rc=rc, stop_s=round(took, 2))
    finally:
        for c in clients:
            if c.is_alive():
                c.kill()
        for n in [router, *shards]:
            n.kill_group()


def analyze(run: str, warm: float) -> None:
    """Summary of a finished run (see the module docstring)."""
    rows = [json.loads(l) for l in open(f"{run}/samples.jsonl")]
    final = [r for r in rows if r.get("final")]
    rows = [r for r in rows if not r.get("final")]
    def slope(pts):
        n = len(pts)
        if n < 3: return float("nan")
        mx = sum(x for x, _ in pts) / n; my = sum(y for _, y in pts) / n
        sxx = sum((x - mx) ** 2 for x, _ in pts)
        return sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else 0.0
    def series(get):
        return [(r["t"], get(r)) for r in rows if r["t"] >= warm and get(r) is not None]
    def show(label, get, unit=1, per="/h"):
        s = series(get)
        if not s: return
        ys = [y for _, y in s]
        print(f"{label:32s} first={s[0][1]/unit:9.1f} last={s[-1][1]/unit:9.1f} min={min(ys)/unit:9.1f} max={max(ys)/unit:9.1f} slope={slope(s)*3600/unit:9.2f}{per}")
    M = 1 << 20
    print(f"samples={len(rows)} warm-up cut at t={warm}s, last t={rows[-1]['t']}")
    for n in ["s0", "s1", "s2"]:
        # per incarnation (pid)
        pids = []
        for r in rows:
            p = r["shards"][n]["pid"]
            if not pids or pids[-1] != p: pids.append(p)
        for pid in pids:
            sub = [r for r in rows if r["shards"][n]["pid"] == pid and r["t"] >= warm]
            if len(sub) < 4: continue
            s = [(r["t"], r["shards"][n]["rss"]) for r in sub]
            f = [(r["t"], r["shards"][n]["fds"]) for r in sub]
            a = [(r["t"], r["shards"][n].get("anon")) for r in sub if r["shards"][n].get("anon") is not None]
            if a:
                print(f"{n} pid {pid} anon rss {a[0][1]/M:.1f}->{a[-1][1]/M:.1f} MiB slope {slope(a)*3600/M:.1f} MiB/h; "
                      f"file rss {sub[0]['shards'][n]['file']/M:.1f}->{sub[-1]['shards'][n]['file']/M:.1f} MiB")
            print(f"{n} pid {pid} t={sub[0]['t']:.0f}..{sub[-1]['t']:.0f} rss {s[0][1]/M:.1f}->{s[-1][1]/M:.1f} MiB slope {slope(s)*3600/M:.1f} MiB/h; fds {f[0][1]}->{f[-1][1]} max {max(y for _,y in f)}; threads {sub[0]['shards'][n]['threads']}->{sub[-1]['shards'][n]['threads']} max {max(r['shards'][n]['threads'] for r in sub)}; deleted-fds max {max(r['shards'][n]['deleted_fds'] for r in sub)}")
        show(f"{n} rss (all incarnations) MiB", lambda r: r["shards"][n]["rss"], M, " MiB/h")
        show(f"{n} worker rss MiB", lambda r: sum(c["rss"] for c in r["shards"][n]["children"]) or None, M, " MiB/h")
        show(f"{n} fds", lambda r: r["shards"][n]["fds"])
        show(f"{n} threads", lambda r: r["shards"][n]["threads"])
        show(f"{n} dir bytes MiB", lambda r: r["dirs"][n]["bytes"], M, " MiB/h")
        show(f"{n} dir files", lambda r: r["dirs"][n]["files"])
        show(f"{n} .sst", lambda r: r["dirs"][n]["sst"])
        show(f"{n} .log", lambda r: r["dirs"][n]["log"])
        show(f"{n} MANIFEST files", lambda r: r["dirs"][n]["manifest"])
        show(f"{n} MANIFEST bytes", lambda r: r["dirs"][n]["manifest_bytes"], 1, " B/h")
        print(f"{n} max .tmp {max(r['dirs'][n]['tmp'] for r in rows)}; other files {set(x for r in rows for x in r['dirs'][n]['other'])}")
    pids = []
    for r in rows:
        if not pids or pids[-1] != r["router"]["pid"]: pids.append(r["router"]["pid"])
    for pid in pids:
        sub = [r for r in rows if r["router"]["pid"] == pid]
        print(f"router pid {pid} t={sub[0]['t']:.0f}..{sub[-1]['t']:.0f} rss {sub[0]['router']['rss']/M:.1f}->{sub[-1]['router']['rss']/M:.1f} fds {sub[0]['router']['fds']}->{sub[-1]['router']['fds']} max {max(r['router']['fds'] for r in sub)} threads max {max(r['router']['threads'] for r in sub)} procs {sub[-1]['router']['n']}")
    for i in range(len(rows[0]["clients"])):
        show(f"client{i} rss MiB", lambda r: r["clients"][i]["rss"] if r["clients"][i] else None, M, " MiB/h")
        show(f"client{i} fds", lambda r: r["clients"][i]["fds"] if r["clients"][i] else None)
        show(f"client{i} threads", lambda r: r["clients"][i]["threads"] if r["clients"][i] else None)
    for r in final:
        print("final (quiescent):", {n: (v["rss"] >> 20, v["fds"], v["threads"], v["deleted_fds"]) for n, v in r["shards"].items()},
              {n: {k: d[k] for k in ("files", "bytes", "sst", "log", "manifest", "manifest_bytes", "tmp")} for n, d in r["dirs"].items()})
    # admin
    adm = [json.loads(l) for l in open(f"{run}/admin.jsonl")]
    t0 = adm[0]["t"]
    errs = [a for a in adm if "error" in a]
    print(f"admin rounds {len(adm)}, errors {len(errs)}: {[e['error'][:80] for e in errs][:5]}")
    for n in ["s0", "s1", "s2"]:
        pts = [(a["t"] - t0, a["shards"].get(n)) for a in adm if "shards" in a and a["shards"].get(n)]
        pts = [(t, s) for t, s in pts if t >= warm]
        ent = [(t, s["entries"]) for t, s in pts]; tb = [(t, s["table_bytes"]) for t, s in pts]
        print(f"{n} entries {ent[0][1]}->{ent[-1][1]} slope {slope(ent)*3600:.0f}/h; table bytes {tb[0][1]/M:.2f}->{tb[-1][1]/M:.2f} MiB slope {slope(tb)*3600/M:.2f} MiB/h")
        bad = [(round(t), s["cap_tracked"], s["cap_measured"], s["f_resident"], s["cap_parts"], s["f_part_resident"]) for t, s in pts if s["cap_tracked"] != s["cap_measured"] or s["cap_parts"] != s["f_part_resident"]]
        print(f"{n} cap tracked!=measured rounds: {len(bad)}/{len(pts)} {bad[:5]}; max tracked {max(s['cap_tracked'] for _, s in pts)}; evictions last {pts[-1][1]['cap_evictions']}")
        bc = [s["block_cache"] for _, s in pts]
        print(f"{n} block cache usage max {max(b['usage_bytes'] for b in bc)} cap {bc[0]['capacity_bytes']}; mapped_tables vs f_tables mismatch {sum(1 for _, s in pts if s['mapped_tables'] != s['f_tables'])}; tables sum vs f_tables mismatch {sum(1 for _, s in pts if sum(s['tables']) != s['f_tables'])}")


if __name__ == "__main__":
    main()
