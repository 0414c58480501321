"""`sievekv bench`: the load test through the router, on a real 2-shard cluster (stopped by
start_cluster's finalizer, even when a test fails) with real client processes. Short runs
(--seconds 0.5, small key spaces) and no assertion on speed: only on what was counted.
The summing and the exit on a run where every call failed are checked on result documents."""

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from router.cli.bench_cmd import all_failed
from router.cli.bench_report import nearest_rank, render, summarize

from .test_cli_e2e import cli_env_cleared  # noqa: F401 (a fixture, used by pytestmark)
from .test_cli_e2e import ROOT, free_port, sievekv, two_shard_cluster


SHORT = ("--seconds", "0.5", "--clients", "2", "--quiet")


pytestmark = pytest.mark.usefixtures("cli_env_cleared")
cluster = two_shard_cluster("bench")


def bench_json(cluster, *argv) -> dict:
    r = sievekv("bench", *SHORT, "--json", *argv, "--config", cluster["conf"])
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # --quiet: no progress, no warning
    return json.loads(r.stdout)


def test_put_then_get_with_preload_finds_every_key(cluster):
    doc = bench_json(cluster, "--op", "put", "--keys", "300", "--value-size", "32")
    put = doc["ops"]["put"]
    assert put["calls"] > 0 and put["keys"] == put["calls"] and put["errors"] == {}
    assert put["found_ratio"] is None
    doc = bench_json(cluster, "--op", "get", "--keys", "300", "--preload")
    get = doc["ops"]["get"]
    assert get["calls"] > 0 and get["errors"] == {}
    assert get["found"] == get["keys"] == get["calls"] and get["found_ratio"] == 1.0
    assert doc["total"]["calls"] == get["calls"]
    assert sum(c["calls"] for c in doc["per_client"]) == get["calls"]
    assert len(doc["per_client"]) == 2
    assert doc["client_ops_per_s_min"] <= doc["client_ops_per_s_max"]


def test_get_without_preload_reports_what_it_found(cluster):
    # Keys far past those written by the other tests: none exists.
    doc = bench_json(cluster, "--op", "get", "--keys", "5", "--clients", "1")
    get = doc["ops"]["get"]
    assert get["calls"] > 0 and get["found_ratio"] == get["found"] / get["keys"]


def test_mget_keys_per_second_is_batch_times_calls(cluster):
    doc = bench_json(cluster, "--op", "mget", "--batch", "7", "--keys", "300", "--preload")
    mget = doc["ops"]["mget"]
    assert mget["calls"] > 0 and mget["errors"] == {}
    assert mget["keys"] == 7 * mget["calls"] and mget["found"] == mget["keys"]
    assert mget["keys_per_s"] == pytest.approx(7 * mget["ops_per_s"])
    assert mget["ops_per_s"] == pytest.approx(mget["calls"] / doc["elapsed"])


def test_json_has_the_documented_fields(cluster):
    doc = bench_json(cluster, "--op", "mixed", "--keys", "300", "--sync")
    assert set(doc) == {"op", "clients", "seconds", "keys", "value_size", "batch", "sync",
                        "preload", "router", "elapsed", "interrupted", "ops", "total",
                        "per_client", "client_ops_per_s_min", "client_ops_per_s_max",
                        "lost_clients"}
    assert doc["lost_clients"] == []
    assert doc["op"] == "mixed" and doc["clients"] == 2 and doc["sync"] is True
    assert doc["interrupted"] is False and doc["elapsed"] > 0
    assert set(doc["ops"]) <= {"get", "put"} and "get" in doc["ops"]
    for o in doc["ops"].values():
        assert set(o) == {"calls", "ops_per_s", "keys", "keys_per_s", "found", "found_ratio",
                          "latency_ms", "errors", "first_errors"}
        if o["calls"]:
            lat = o["latency_ms"]
            assert set(lat) == {"p50", "p90", "p99", "max", "mean"}
            assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert set(doc["total"]) == {"calls", "ops_per_s", "errors"}


def test_text_output_has_a_row_per_op_and_the_client_spread(cluster):
    r = sievekv("bench", *SHORT, "--op", "mixed", "--keys", "300", "--config", cluster["conf"])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("bench mixed: 2 client(s), ")
    assert lines[1].split()[:4] == ["OP", "CALLS", "OPS/S", "KEYS/S"]
    assert lines[2].split()[0] == "get"
    assert lines[-1].startswith("per client ops/s: min ")


@pytest.mark.parametrize("argv, words", [
    (["--clients", "0"], "--clients"),
    (["--seconds", "0"], "--seconds"),
    (["--seconds", "-1"], "--seconds"),
    (["--keys", "0"], "--keys"),
    (["--batch", "0"], "--batch"),
    (["--value-size", "4194305"], "over the cluster's value limit"),
    (["--op", "scan"], "invalid choice"),
    (["--clients", "two"], "invalid int value"),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path, argv, words):
    r = sievekv("bench", *argv, "--data-dir", str(tmp_path), "--router",
                f"127.0.0.1:{free_port()}")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stdout == "" and r.stderr.count("\n") == 1 and words in r.stderr, r.stderr


def _tagged(tag: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("SIEVEKV_BENCH_TEST_TAG") == tag and \
                    p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def test_no_cluster_exits_3_with_one_line_and_no_child_left(tmp_path):
    tag = uuid.uuid4().hex
    r = sievekv("bench", "--clients", "3", "--seconds", "0.5", "--data-dir", str(tmp_path),
                "--router", f"127.0.0.1:{free_port()}", env={"SIEVEKV_BENCH_TEST_TAG": tag})
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert r.stdout == "" and r.stderr.count("\n") == 1 and "UNAVAILABLE" in r.stderr
    # The CLI and its client processes inherited the tag; no client may survive the CLI.
    left = _tagged(tag)
    clients = [p for p in left if "multiprocessing.spawn" in " ".join(p.cmdline())]
    # Python's own resource tracker exits when it reads EOF from the exited CLI: a moment.
    _, alive = psutil.wait_procs(left, timeout=10)
    for p in alive:
        p.kill()
    assert clients == [] and alive == [], [p.cmdline() for p in left]


def _calls_served(cluster) -> float:
    """Gets and writes the cluster's shards have served so far (their Stats totals)."""
    from router import cluster_state as cs
    from router.client import Client

    with Client(cs.read_state(cluster["data_dir"])["router_address"], retries=4) as c:
        totals = c.stats()["totals"]
    return totals.get("gets", 0) + totals.get("writes", 0)


@contextlib.contextmanager
def _bench_running(cluster, *argv):
    """Start `sievekv bench --config ... --clients 2 --quiet ARGV` tagged, wait until its two
    client processes run and are past their common start, yield (cli Popen, clients); on the
    way out kill whatever of it is left."""
    tag = uuid.uuid4().hex
    before = _calls_served(cluster)
    env = dict(os.environ, PYTHONPATH=ROOT, SIEVEKV_BENCH_TEST_TAG=tag)
    env.pop("SIEVEKV_CONFIG", None)
    cli = subprocess.Popen([sys.executable, "-m", "router.cli", "bench", "--config",
                            cluster["conf"], "--clients", "2", "--quiet", *argv], cwd=ROOT,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        clients = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(clients) < 2:
            clients = [p for p in _tagged(tag) if "multiprocessing.spawn" in " ".join(p.cmdline())]
            time.sleep(0.2)
        assert len(clients) == 2, "the clients never started"
        # Inside the run once the shards count calls: the command sends "go" only after every
        # client is ready (a fixed sleep was not enough on a loaded machine: a client killed
        # before it was ready makes the run fail as a whole, exit 1).
        deadline = time.monotonic() + 120
        while _calls_served(cluster) <= before + 20:
            assert time.monotonic() < deadline, "the bench never started calling"
            assert cli.poll() is None, cli.communicate()
            time.sleep(0.2)
        yield cli, clients
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.communicate(timeout=30)
        for p in _tagged(tag):
            p.kill()


def test_clients_exit_when_the_bench_command_is_killed(cluster):
    """SIGKILL of the CLI mid-run (no chance to stop its clients): each client notices its
    parent is gone and exits, instead of calling on to a deadline a minute away."""
    with _bench_running(cluster, "--seconds", "60") as (cli, clients):
        cli.kill()
        cli.communicate(timeout=30)
        _, alive = psutil.wait_procs(clients, timeout=30)
        assert alive == [], [p.pid for p in alive]


def test_a_client_killed_mid_run_gives_the_others_numbers_and_exit_4(cluster):
    with _bench_running(cluster, "--seconds", "4", "--json") as (cli, clients):
        clients[0].kill()
        out, err = cli.communicate(timeout=120)
        assert cli.returncode == 4, (cli.returncode, err)
        assert err.count("\n") == 1 and "1 of 2 clients gave no result" in err, err
        doc = json.loads(out)
        assert len(doc["per_client"]) == 1 and doc["total"]["calls"] > 0
        assert len(doc["lost_clients"]) == 1


def test_no_state_file_exits_3(tmp_path):
    r = sievekv("bench", "--seconds", "0.5", "--data-dir", str(tmp_path))
    assert r.returncode == 3 and r.stderr.count("\n") == 1, r.stderr


# -- result documents -------------------------------------------------------------------------

def _child(ops: dict, end: float) -> dict:
    calls = sum(len(o["latencies"]) + sum(o["errors"].values()) for o in ops.values())
    return {"ops": ops, "calls": calls, "end": end}


def _op(latencies, keys=None, found=0, errors=None, first=None) -> dict:
    return {"latencies": list(latencies), "keys": len(latencies) if keys is None else keys,
            "found": found, "errors": errors or {}, "first_error": first or {}}


SETUP = {"op": "get", "clients": 2, "seconds": 2.0, "keys": 10, "value_size": 100,
         "batch": 100, "sync": False, "preload": False, "router": "127.0.0.1:1"}


def test_nearest_rank_picks_a_measured_value():
    xs = [float(i) for i in range(1, 101)]
    assert [nearest_rank(xs, p) for p in (50, 90, 99, 100)] == [50.0, 90.0, 99.0, 100.0]
    assert nearest_rank([7.0], 50) == 7.0


def test_summarize_merges_clients_over_one_window():
    a = _child({"get": _op([0.001] * 30, found=30)}, end=102.0)
    b = _child({"get": _op([0.003] * 10, found=5, errors={"UNAVAILABLE": 2},
                           first={"UNAVAILABLE": "down"})}, end=101.0)
    doc = summarize(SETUP, [a, b], start_at=100.0, interrupted=False)
    get = doc["ops"]["get"]
    assert doc["elapsed"] == pytest.approx(2.0)  # the last call of any client ends the window
    assert get["calls"] == 40 and get["ops_per_s"] == pytest.approx(20.0)
    assert get["found_ratio"] == pytest.approx(35 / 40)
    assert get["errors"] == {"UNAVAILABLE": 2} and get["first_errors"] == {"UNAVAILABLE": "down"}
    assert get["latency_ms"]["p50"] == pytest.approx(1.0)
    assert get["latency_ms"]["p90"] == pytest.approx(3.0)  # 36th of 40: the slow client
    assert get["latency_ms"]["max"] == pytest.approx(3.0)
    assert [c["ops_per_s"] for c in doc["per_client"]] == pytest.approx([15.0, 5.0])
    assert (doc["client_ops_per_s_min"], doc["client_ops_per_s_max"]) == pytest.approx((5, 15))
    text = render(doc)
    assert "UNAVAILABLE 2" in text and "per client ops/s: min 5, max 15" in text
    assert all_failed(doc) is None


def test_every_call_failed_names_the_status_and_exits_by_it():
    a = _child({"get": _op([], keys=0, errors={"UNAVAILABLE": 5, "INTERNAL": 1},
                           first={"UNAVAILABLE": "router down", "INTERNAL": "bug"})}, end=101.0)
    doc = summarize(SETUP, [a], start_at=100.0, interrupted=False)
    assert doc["ops"]["get"]["latency_ms"] is None and doc["elapsed"] == pytest.approx(1.0)
    err = all_failed(doc)
    assert err is not None and err.code == 3
    assert str(err) == "every call failed: UNAVAILABLE: router down"
    b = _child({"put": _op([], keys=0, errors={"DATA_LOSS": 3}, first={"DATA_LOSS": "crc"})},
               end=101.0)
    err = all_failed(summarize(dict(SETUP, op="put"), [b], 100.0, False))
    assert err.code == 1 and "DATA_LOSS: crc" in str(err)
    assert "-" in render(summarize(SETUP, [a], 100.0, False))  # no latency: dashes



def test_reads_that_found_nothing_point_at_preload():
    a = _child({"get": _op([0.001] * 4, found=0)}, end=101.0)
    text = render(summarize(SETUP, [a], 100.0, False))
    assert "--preload writes them first" in text
    preloaded = render(summarize(dict(SETUP, preload=True), [a], 100.0, False))
    assert "--preload" not in preloaded  # preloaded and still absent: not a hint to give
    b = _child({"get": _op([0.001] * 4, found=1)}, end=101.0)
    assert "--preload" not in render(summarize(SETUP, [b], 100.0, False))
