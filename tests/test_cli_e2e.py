"""End to end through the command line, as an operator runs it: ``python -m router.cli ...``
(the ``sievekv`` console script) against real shard and router processes in a temporary
directory, on 127.0.0.1 with free ports.

One cluster serves the whole module (tests run in file order; the last one stops it). The
module finalizer runs ``cluster stop`` and then SIGKILLs any pid still alive from the state
file, so no process outlives the tests even when one fails.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from router import cluster_state as cs
from router.cli import rpc

from .conftest import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sievekv(*argv, input=None, env=None, timeout=120):
    """Run the CLI; returns CompletedProcess with text stdout/stderr."""
    e = dict(os.environ)
    e.pop("SIEVEKV_ROUTER", None)
    e.pop("SIEVEKV_CONFIG", None)
    e["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in e.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "router.cli", *argv], input=input,
                          capture_output=True, text=isinstance(input, (str, type(None))),
                          env=e, timeout=timeout, cwd=ROOT)


def kill_recorded(data_dir: str) -> None:
    try:
        doc = cs.read_state(data_dir)
    except cs.StateError:
        return
    for _, pid, ct in cs.recorded_pids(doc):
        if cs.pid_alive(pid, ct):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    d = tmp_path_factory.mktemp("e2e")
    conf = d / "cluster.toml"
    conf.write_text(textwrap.dedent(f"""
        [cluster]
        data_dir = "data"
        [router]
        listen = "127.0.0.1:0"
        metrics_port = {free_port()}
        [shards]
        count = 2
        base_port = 0
        [[shard]]
        metrics_port = {free_port()}
        [[shard]]
        metrics_port = {free_port()}
        [engine]
        memtable_bytes = "64KiB"
        bits_per_key = 10
        [supervisor]
        start_timeout = 60.0
        stop_timeout = 10.0
        restart_delay = 0.2
    """))
    return start_cluster(conf, request)


def start_cluster(conf, request) -> dict:
    """`sievekv cluster start --config conf` (data_dir "data" beside it), stopped by a
    finalizer registered first, so a failed start is cleaned up too."""
    d = conf.parent
    data_dir = str(d / "data")

    def finish():
        sievekv("cluster", "stop", "--config", str(conf), "--timeout", "5")
        kill_recorded(data_dir)

    request.addfinalizer(finish)
    r = sievekv("cluster", "start", "--config", str(conf))
    assert r.returncode == 0, r.stderr
    return {"conf": str(conf), "data_dir": data_dir, "router": r.stdout.strip(),
            "start": r, "dir": d}


CLI_ENV = ("SIEVEKV_ROUTER", "SIEVEKV_CONFIG", "SIEVEKV_DATA_DIR", "SIEVEKV_DEBUG")


def clean_cli_env(monkeypatch) -> None:
    """Unset the environment variables the CLI reads, so a test sees only its own flags."""
    for name in CLI_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def cli_env_cleared(monkeypatch):
    """clean_cli_env as a fixture: ``pytestmark = pytest.mark.usefixtures("cli_env_cleared")``
    in a module that imports it."""
    clean_cli_env(monkeypatch)


TWO_SHARDS = """
[cluster]
data_dir = "data"
[router]
listen = "127.0.0.1:0"
[shards]
count = 2
base_port = 0
[supervisor]
start_timeout = 60.0
stop_timeout = 10.0
"""


def two_shard_cluster(name: str):
    """A module-scoped fixture: a real 2-shard cluster on free ports (TWO_SHARDS), started
    once per module in a directory ``name`` and stopped by its finalizer. Use as
    ``cluster = two_shard_cluster("bench")``."""
    @pytest.fixture(scope="module")
    def cluster(tmp_path_factory, request):
        return cluster_from_text(TWO_SHARDS, tmp_path_factory, request, name)
    return cluster


def cluster_from_text(text: str, tmp_path_factory, request, name: str) -> dict:
    """Write ``text`` as cluster.toml in a fresh directory ``name`` and start that cluster
    (stopped by the test's finalizer, see start_cluster)."""
    conf = tmp_path_factory.mktemp(name) / "cluster.toml"
    conf.write_text(text)
    return start_cluster(conf, request)


def cli(cluster, *argv, **kw):
    return sievekv(*argv, "--config", cluster["conf"], **kw)


def state(cluster) -> dict:
    return cs.read_state(cluster["data_dir"])


def proc(cluster, name) -> dict:
    return next(p for p in state(cluster)["processes"] if p["name"] == name)


def test_start_prints_the_router_address_and_progress(cluster):
    r = cluster["start"]
    doc = state(cluster)
    assert r.stdout == doc["router_address"] + "\n"
    assert "SERVING" in r.stderr and "cluster is up" in r.stderr
    assert doc["state"] == "running"
    for p in doc["processes"]:
        assert cs.pid_alive(p["pid"], p["create_time"]), p["name"]
        ps = psutil.Process(p["pid"])
        assert os.getsid(p["pid"]) != os.getsid(0)  # detached from our session


def at_once(*calls):
    """Run the ``sievekv`` calls ``calls`` (each a no-argument function) concurrently, in
    threads; their results in order. Each is a separate CLI process with its own timeout
    (subprocess.run kills it past that), so none outlives the call."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(len(calls)) as pool:
        return [f.result() for f in [pool.submit(c) for c in calls]]


def test_put_get_delete_scan(cluster):
    # Calls that do not depend on each other run at once (each CLI process is ~0.5 s of
    # start-up); every call and every check of the sequential version is kept.
    put1, put2, put_hex, bad_hex = at_once(
        lambda: cli(cluster, "put", "k1", "v1"),
        lambda: cli(cluster, "put", "k2", "v2\twith tab"),
        lambda: cli(cluster, "put", "-e", "hex", "00ff", "deadbeef"),
        lambda: cli(cluster, "put", "-e", "hex", "zz", "00"))
    assert put1.stdout == "OK\n"
    assert put2.returncode == 0
    assert put_hex.returncode == 0
    assert bad_hex.returncode == 2
    assert bad_hex.stderr == "sievekv: error: key: not valid hex: 'zz'\n"
    r, absent, scan, scan_json, b64, env = at_once(
        lambda: cli(cluster, "get", "k1"),
        lambda: cli(cluster, "get", "absent"),
        lambda: cli(cluster, "scan", "--start", "k", "--end", "l"),
        lambda: cli(cluster, "scan", "--start", "k", "--end", "l", "--format", "jsonl",
                    "--limit", "1"),
        lambda: cli(cluster, "get", "-e", "base64", "AP8="),
        # the router address can come from the environment too
        lambda: sievekv("get", "k2", env={"SIEVEKV_ROUTER": cluster["router"]}))
    assert (r.returncode, r.stdout) == (0, "v1\n")
    assert absent.returncode == 5 and absent.stderr == "sievekv: error: key 'absent' not found\n"
    assert scan.stdout == "k1\tv1\nk2\tv2\twith tab\n"
    assert [json.loads(x) for x in scan_json.stdout.splitlines()] == [
        {"key": "k1", "value": "v1"}]
    # binary keys and values
    assert b64.stdout == "3q2+7w==\n"
    assert env.stdout == "v2\twith tab\n"
    assert cli(cluster, "delete", "k1").returncode == 0
    assert cli(cluster, "get", "k1").returncode == 5


def test_load_then_scan_round_trips(cluster):
    lines = "".join(json.dumps({"key": f"load:{i:05d}", "value": f"value-{i}"}) + "\n"
                    for i in range(3000))
    r = cli(cluster, "load", "--batch", "500", input=lines)
    assert r.returncode == 0, r.stderr
    assert "loaded 3,000 records" in r.stderr
    r, tsv = at_once(
        lambda: cli(cluster, "scan", "--start", "load:", "--end", "load;", "--format", "jsonl"),
        lambda: cli(cluster, "scan", "--start", "load:", "--end", "load;"))
    assert r.stdout == lines
    tsv = tsv.stdout
    assert tsv.count("\n") == 3000 and tsv.startswith("load:00000\tvalue-0\n")
    bad = cli(cluster, "load", "--format", "tsv", input="x\t1\nno-tab\n")
    assert bad.returncode == 2
    assert bad.stderr.startswith("sievekv: error: stdin: line 2: expected KEY<TAB>VALUE")
    assert cli(cluster, "get", "x").stdout == "1\n"  # the good line before it was loaded


def test_status_json(cluster):
    r, text = at_once(lambda: cli(cluster, "cluster", "status", "--json"),
                      lambda: cli(cluster, "cluster", "status"))
    assert r.returncode == 0, r.stdout + r.stderr
    st = json.loads(r.stdout)
    assert st["cluster"] == "running" and st["supervisor"]["alive"]
    rows = {p["name"]: p for p in st["processes"]}
    assert set(rows) == {"shard-0", "shard-1", "router"}
    for name, p in rows.items():
        assert p["health"] == "SERVING" and p["alive"] and p["uptime_s"] >= 0
        assert p["metrics_port"] and p["metrics_url"].endswith(f":{p['metrics_port']}/metrics")
    assert rows["shard-0"]["slots"] == [0, 8191] and rows["shard-1"]["slots"] == [8192, 16383]
    assert sum(rows[s]["keys"] for s in ("shard-0", "shard-1")) >= 3000
    assert text.returncode == 0 and "shard-1" in text.stdout and "SERVING" in text.stdout


def test_metrics_endpoints_answer(cluster):
    import urllib.request
    st = json.loads(cli(cluster, "cluster", "status", "--json").stdout)
    for p in st["processes"]:
        with urllib.request.urlopen(p["metrics_url"], timeout=5) as resp:
            assert resp.status == 200


def _os_resident_filter_bytes(pid: int, shard_dir: str) -> int:
    """RSS of the shard process's mappings of its tables' filter regions, as the OS reports
    it in /proc/PID/smaps. A table file has two mappings: its filter region, mapped from the
    page-aligned region offset (> 0), and, with mmap_reads, its data blocks, mapped from file
    offset 0; only the first kind counts here."""
    total = 0
    counting = False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split(None, 5)
            if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
                path = head[5].strip() if len(head) == 6 else ""
                counting = path.startswith(shard_dir + os.sep) and int(head[2], 16) > 0
            elif counting and line.startswith("Rss:"):
                total += int(line.split()[1]) * 1024
    return total


def test_filters_json_agrees_with_the_shards_and_the_os(cluster):
    r = cli(cluster, "flush")
    assert r.returncode == 0 and r.stdout.count("flushed") == 2
    from router.client import Client
    with Client(cluster["router"]) as c:  # probe the filters: present and absent keys
        for i in range(0, 3000, 25):
            assert c.get(f"load:{i:05d}".encode()) == f"value-{i}".encode()
            assert c.get(f"load:{i:05d}-absent".encode()) is None  # in range
    r = cli(cluster, "filters", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    sums = dict.fromkeys(("filter_bytes", "keys", "partitions", "tables"), 0)
    for name in ("shard-0", "shard-1"):
        via_router = doc["shards"][name]
        p = proc(cluster, name)
        direct = rpc.report_json(p["address"], "FilterReport", 10)["shards"][name]
        # the static accounting is identical whichever way it is asked, table by table
        def tables(rep):
            return [(lv["level"], t["file_number"], t["keys"], t["filter_bytes"],
                     t["filter_index_bytes"], t["partitions"], t["bits_per_key"])
                    for lv in rep["levels"] for t in lv["tables"]]
        assert tables(via_router) == tables(direct) and tables(direct)
        for f in sums:
            sums[f] += direct["totals"][f]
        assert direct["totals"]["probes"] > 0 and direct["totals"]["negatives"] > 0
        # residency: the shard's number is the OS's number for that process
        reported = direct["totals"]["resident_bytes"]
        measured = _os_resident_filter_bytes(p["pid"], p["data_dir"])
        assert reported == measured > 0, (name, reported, measured)
    for f, v in sums.items():
        assert doc["cluster_totals"][f] == v, f
    text = cli(cluster, "filters", "--tables")
    assert text.returncode == 0 and "RESIDENT" in text.stdout and "cluster total" in text.stdout


def test_stats_flush_compact(cluster):
    r, compact = at_once(lambda: cli(cluster, "stats", "--json"),
                         lambda: cli(cluster, "compact"))
    assert r.returncode == 0
    assert set(json.loads(r.stdout)["shards"]) == {"shard-0", "shard-1"}
    assert compact.returncode == 0 and compact.stdout.count("compacted") == 2


def test_a_second_start_on_the_locked_directory_fails_fast(cluster):
    sup = state(cluster)["supervisor"]
    r = cli(cluster, "cluster", "start")
    assert r.returncode == 6
    assert r.stderr.endswith(f"is locked by a running cluster (supervisor pid {sup['pid']}); "
                             f"stop it first with `sievekv cluster stop`\n")
    assert r.stderr.count("\n") == 1 and r.stdout == ""
    assert cs.pid_alive(sup["pid"], sup["create_time"])


def test_bad_config_is_one_line_and_starts_nothing(cluster, tmp_path):
    conf = tmp_path / "bad.toml"
    conf.write_text('[cluster]\ndata_dir = "d"\n[engine]\nbits_per_key = "lots"\n')
    r = sievekv("cluster", "start", "--config", str(conf))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (f"sievekv: error: config {conf}: [engine]: option bits_per_key must be "
                        f"a float, got 'lots'\n")
    assert not (tmp_path / "d").exists()  # nothing created, nothing started


def test_a_shard_killed_with_sigkill_is_restarted_with_its_data(cluster):
    old = proc(cluster, "shard-1")
    os.kill(old["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        p = proc(cluster, "shard-1")
        if p["pid"] != old["pid"] and p["status"] == "serving":
            break
        time.sleep(0.1)
    else:
        raise AssertionError("shard-1 was not restarted")
    assert p["restarts"] == old["restarts"] + 1 and p["last_exit"] == "killed by SIGKILL"
    r = cli(cluster, "scan", "--start", "load:", "--end", "load;", "--format", "jsonl")
    assert r.stdout.count("\n") == 3000  # every acknowledged record is still there
    st = json.loads(cli(cluster, "cluster", "status", "--json").stdout)
    row = next(x for x in st["processes"] if x["name"] == "shard-1")
    assert row["restarts"] == 1 and row["health"] == "SERVING"


def test_restart_one_shard(cluster):
    old = proc(cluster, "shard-0")
    r = cli(cluster, "cluster", "restart", "--shard", "0")
    assert r.returncode == 0, r.stderr
    new = proc(cluster, "shard-0")
    assert new["pid"] != old["pid"] and new["status"] == "serving"
    assert not cs.pid_alive(old["pid"], old["create_time"])
    assert cli(cluster, "get", "k2").stdout == "v2\twith tab\n"


def test_restart_the_whole_cluster(cluster):
    before = state(cluster)
    r = cli(cluster, "cluster", "restart")
    assert r.returncode == 0, r.stderr
    after = state(cluster)
    assert after["state"] == "running"
    assert after["supervisor"]["pid"] != before["supervisor"]["pid"]
    assert not [n for n, p, ct in cs.recorded_pids(before) if cs.pid_alive(p, ct)]
    assert r.stdout.strip() == after["router_address"]
    assert cli(cluster, "get", "k2").stdout == "v2\twith tab\n"  # data survived


def test_stop_leaves_no_process_behind(cluster):
    doc = state(cluster)
    pids = cs.recorded_pids(doc)
    assert len(pids) >= 4  # supervisor, two shards, router
    r = cli(cluster, "cluster", "stop")
    assert r.returncode == 0, r.stderr
    assert sorted(line.split()[0] for line in r.stdout.splitlines()) == [
        "router", "shard-0", "shard-1"]
    alive = [(n, p) for n, p, ct in pids if cs.pid_alive(p, ct)]
    assert alive == []
    assert state(cluster)["state"] == "stopped"
    r, get = at_once(lambda: cli(cluster, "cluster", "status"),
                     lambda: cli(cluster, "get", "k2"))
    assert r.returncode == 3
    assert get.returncode == 3 and "is stopped" in get.stderr
