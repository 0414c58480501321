"""`sievekv compact`: waits for every shard without the 30 s default deadline, shows progress
from each shard's ``stats()["compaction_running"]`` and prints one result line per shard;
`sievekv stats` shows a running compaction. The formatting is checked on stats documents, the
command on a real cluster (stopped by start_cluster's finalizer, even when a test fails)."""

import json
import os
import signal

import pytest

from router.cli.app import build_parser
from router.cli.report_cmds import compaction_progress, compaction_reasons, running_compaction

from .test_cli_e2e import cli_env_cleared  # noqa: F401 (a fixture, used by pytestmark)
from .test_cli_e2e import sievekv, state, two_shard_cluster
from .conftest import sigstop



pytestmark = pytest.mark.usefixtures("cli_env_cleared")
cluster = two_shard_cluster("compact")


RUNNING = {"level": 0, "output_level": 2, "manual": True, "input_bytes": 200 << 20,
           "written_bytes": 50 << 20, "seconds": 12.4}


def test_progress_line_of_running_compactions():
    shards = {"s1": {"compaction_running": None}, "s0": {"compaction_running": RUNNING}}
    assert running_compaction(shards["s0"]) == "L0->L2 25% (50.0 MiB of 200.0 MiB, 12 s)"
    assert running_compaction(shards["s1"]) == ""
    assert compaction_progress(shards) == "s0 L0->L2 25% (50.0 MiB of 200.0 MiB, 12 s)"
    both = dict(shards, s1={"compaction_running": dict(RUNNING, written_bytes=0)})
    assert compaction_progress(both).split("; ")[1].startswith("s1 L0->L2 0% ")


def test_progress_never_claims_done_while_running():
    # Output can exceed input (a larger format) or equal it: still at most 99% while it runs.
    over = {"compaction_running": dict(RUNNING, written_bytes=300 << 20)}
    assert " 99% " in running_compaction(over)
    empty = {"compaction_running": dict(RUNNING, input_bytes=0, written_bytes=0)}
    assert " 0% " in running_compaction(empty)


def test_compact_has_quiet_and_no_default_deadline():
    args = build_parser().parse_args(["compact", "--quiet"])
    assert args.quiet is True
    assert getattr(args, "timeout", None) is None  # cmd_compact then waits as long as it takes


def test_compact_on_a_cluster(cluster):
    cfg = ["--config", cluster["conf"]]
    lines = "".join(f"key{i:06d}\tvalue-{i}\n" for i in range(3000))
    r = sievekv("load", "-", "--format", "tsv", *cfg, input=lines)
    assert r.returncode == 0, r.stderr
    assert sievekv("flush", *cfg).returncode == 0
    r = sievekv("compact", *cfg)
    assert r.returncode == 0, r.stderr
    assert sorted(line.split()[1] for line in r.stdout.splitlines()) == ["compacted", "compacted"]
    assert "Traceback" not in r.stderr
    r = sievekv("compact", "--quiet", *cfg)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    r = sievekv("stats", "--json", *cfg)
    assert r.returncode == 0, r.stderr
    shards = json.loads(r.stdout)["shards"]
    assert len(shards) == 2
    assert all(s["compaction_running"] is None for s in shards.values())
    assert sum(s["compactions"] for s in shards.values()) >= 2
    assert all(s["compactions_by_reason"].get("manual", 0) >= 1 for s in shards.values())
    r = sievekv("stats", *cfg)
    assert r.returncode == 0, r.stderr
    for name in shards:  # one line per shard with its compactions by reason
        assert any(line.startswith(f"{name}: compactions ") and "manual " in line
                   for line in r.stdout.splitlines()), r.stdout
    r = sievekv("get", "key002999", *cfg)
    assert r.returncode == 0 and r.stdout.strip() == "value-2999"


def test_compact_deadline_says_the_shards_go_on(cluster):
    cfg = ["--config", cluster["conf"]]
    lines = "".join(f"late{i:06d}\tvalue-{i}\n" for i in range(2000))
    assert sievekv("load", "-", "--format", "tsv", *cfg, input=lines).returncode == 0
    # A millisecond is less than two hops plus a flush and a compaction take.
    r = sievekv("compact", "--timeout", "0.001", "--quiet", *cfg)
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and "gave up waiting after --timeout 0.001 s" in r.stderr
    assert "the shards go on compacting" in r.stderr


def test_compact_deadline_names_the_shard_still_compacting(cluster):
    # One shard never answers (stopped); the router gives up on it a little before the
    # client's deadline, so the other shard's result is printed and the late one is named.
    cfg = ["--config", cluster["conf"]]
    shard = next(p for p in state(cluster)["processes"] if p["name"] == "shard-1")
    # the router's channel to the shard is connected first (a stopped shard would otherwise
    # fail the connection attempt: UNAVAILABLE, another test)
    assert sievekv("stats", *cfg).returncode == 0
    sigstop(shard["pid"])
    try:
        r = sievekv("compact", "--timeout", "5", "--quiet", *cfg)
    finally:
        os.kill(shard["pid"], signal.SIGCONT)
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    assert r.stdout.splitlines() == ["shard-0    compacted", "shard-1    still compacting"]
    assert r.stderr.count("\n") == 1, r.stderr
    assert "gave up waiting for shard-1 after --timeout 5 s; they go on compacting" in r.stderr


def test_progress_and_stats_lines_name_the_reason():
    auto = {"compaction_running": dict(RUNNING, level=6, output_level=6, manual=False,
                                       reason="tombstones")}
    assert running_compaction(auto) == "L6->L6 tombstones 25% (50.0 MiB of 200.0 MiB, 12 s)"
    manual = {"compaction_running": dict(RUNNING, reason="manual")}  # compact's own progress
    assert running_compaction(manual) == "L0->L2 25% (50.0 MiB of 200.0 MiB, 12 s)"
    stats = {"compactions_by_reason": {"tombstones": 2, "l0-count": 1234},
             "tombstones_dropped": 180000}
    assert compaction_reasons(stats) == "l0-count 1,234, tombstones 2 (180,000 tombstones dropped)"
    assert compaction_reasons({"compactions_by_reason": {}}) == ""
    assert compaction_reasons({"compactions_by_reason": {"l1-size": 1}}) == "l1-size 1"


def test_stats_line_of_a_shard_whose_writes_are_held_to_a_rate():
    from router.cli.report_cmds import write_slowdown

    held = {"write_stall": {"delayed": True, "delayed_write_rate": 3 * 1024 * 1024},
            "levels": [{"level": 0, "tables": 22}, {"level": 1, "tables": 9}]}
    assert write_slowdown(held) == (
        "writes held to 3.0 MiB/s (L0 holds 22 tables, at its slowdown trigger: compactions "
        "are behind; the rate follows them)")
    assert write_slowdown({"write_stall": {"delayed": False, "delayed_write_rate": 1}}) == ""
    assert write_slowdown({}) == ""  # a shard of an older version: no such field
