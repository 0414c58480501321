"""What a first-time operator's walkthrough of the README found (session 3).

* ``--help`` lists every exit code the docs promise, 130 (interrupted) included.
* A text TSV line whose key is whitespace (``" \\t "``, as ``scan`` writes key ``b" "``) is a
  record, not a blank line: ``load`` used to skip it silently.
* ``scan`` that cannot write a record says which field is the problem (it blamed the key for a
  value's newline).
* Ctrl-C during ``load`` says how many records are loaded and the line to resume from (it said
  only "interrupted").
* ``cluster restart --shard N`` with no shard N is a usage error naming the shards (it said
  "no process named 'shard--1'").
* ``cluster stop`` of a cluster that is already stopped says so (it claimed the supervisor was
  not running and that it was stopping the processes directly).

The cluster tests share one real cluster (``sievekv cluster start``: supervisor, two shards and
a router on free ports); test_cli_e2e.start_cluster registers a finalizer that stops it and
SIGKILLs any recorded pid still alive, even when a test fails. The load test's own CLI process
is killed in a ``finally``.
"""

import io
import os
import signal
import subprocess
import sys
import time

import pytest

from router.cli import app, records
from router.cli.exit_codes import INTERRUPTED, OK, USAGE
from router.client import Client

from .test_cli_e2e import cli_env_cleared  # noqa: F401 (a fixture, used by pytestmark)
from .test_cli_e2e import ROOT, sievekv, two_shard_cluster



pytestmark = pytest.mark.usefixtures("cli_env_cleared")
cluster = two_shard_cluster("session3")


def run(cluster, *argv, **kw):
    return sievekv(*argv, "--config", cluster["conf"], **kw)


def one_error_line(err: str) -> bool:
    return (err.startswith("sievekv: error: ") and err.count("\n") == 1
            and "Traceback" not in err and "internal error" not in err)


# -- no cluster needed -----------------------------------------------------------------------

def test_help_lists_the_interrupted_exit_code(capsys):
    with pytest.raises(SystemExit):
        app.main(["--help"])
    out = capsys.readouterr().out
    assert "130  interrupted" in out
    assert "5  not found" in out and "6  conflict" in out


def test_a_tsv_record_with_a_whitespace_key_loads_back():
    line = records.format_record(b" ", b" ", "tsv", "text")
    got = list(records.iter_records(io.BytesIO(line + b"  \n\n"), "tsv", "text"))
    assert got == [(1, b" ", b" ")]  # the record; the blank lines after it are skipped


@pytest.mark.parametrize("key, value, fmt, problem", [
    (b"photo:1", b"a\nb", "tsv", "its value has a newline, which text TSV cannot carry"),
    (b"k\tx", b"v", "tsv", "its key has a tab, which text TSV cannot carry"),
    (b"k", b"v\r", "tsv", "its value ends with a carriage return"),
    (b"k", b"\xff", "jsonl", "its value is not UTF-8 text, which JSON output needs"),
    (b"\xfe", b"v", "jsonl", "its key is not UTF-8 text, which JSON output needs"),
])
def test_an_unwritable_record_names_the_field(key, value, fmt, problem):
    with pytest.raises(ValueError) as info:
        records.format_record(key, value, fmt, "text")
    assert f"the record with key {key!r}: {problem}" in str(info.value)
    assert "use --encoding hex or base64" in str(info.value)


# -- with a cluster --------------------------------------------------------------------------

def test_scan_names_the_value_that_tsv_cannot_carry(cluster):
    assert run(cluster, "put", "s3:nl", "-", input=b"two\nlines").returncode == OK
    r = run(cluster, "scan", "--start", "s3:", "--end", "s3;")
    assert r.returncode == USAGE and one_error_line(r.stderr), r.stderr
    assert "scan stopped after 0 entries: the record with key b's3:nl': its value has a " \
           "newline" in r.stderr
    r = run(cluster, "scan", "--start", "73333a", "--end", "73333b", "-e", "hex", input=b"")
    assert r.returncode == OK and r.stdout == b"73333a6e6c\t74776f0a6c696e6573\n"


def test_ctrl_c_during_load_says_what_is_loaded_and_where_to_resume(cluster):
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("SIEVEKV_ROUTER", None)
    p = subprocess.Popen([sys.executable, "-m", "router.cli", "load", "-", "--format", "tsv",
                          "--batch", "2", "--config", cluster["conf"]],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env, cwd=ROOT)
    try:
        # Lines 1-2 make a batch that is sent; line 3 waits in the next batch while load
        # blocks reading line 4.
        p.stdin.write(b"ci:1\tv1\nci:2\tv2\nci:3\tv3\n")
        p.stdin.flush()
        with Client(cluster["router"]) as c:
            deadline = time.monotonic() + 60
            while c.get(b"ci:2") is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert c.get(b"ci:1") == b"v1" and c.get(b"ci:2") == b"v2"
        time.sleep(0.3)  # let the client see the Write's reply (both outcomes are checked)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    err = err.decode()
    assert p.returncode == INTERRUPTED and one_error_line(err), err
    done = ("sievekv: error: load interrupted: 2 records loaded, every record before input "
            "line 3; line 3 was read but not sent; resume from line 3\n")
    in_flight = ("sievekv: error: load interrupted: 0 records loaded, every record before "
                 "input line 1; lines 1-2 were being sent and may or may not be loaded; "
                 "resume from line 1\n")
    assert err in (done, in_flight)
    with Client(cluster["router"]) as c:
        assert c.get(b"ci:3") is None  # read, never sent


@pytest.mark.parametrize("shard", ["2", "-1"])
def test_restart_of_a_shard_that_does_not_exist_is_a_usage_error(cluster, shard):
    r = run(cluster, "cluster", "restart", "--shard", shard)
    assert r.returncode == USAGE and one_error_line(r.stderr), r.stderr
    assert f"--shard: no shard {shard} in this cluster (shards: 0..1)" in r.stderr


def test_stopping_a_stopped_cluster_says_it_is_already_stopped(cluster):
    # Last in this module: it stops the shared cluster.
    first = run(cluster, "cluster", "stop")
    assert first.returncode == OK, first.stderr
    again = run(cluster, "cluster", "stop")
    assert again.returncode == OK, again.stderr
    assert again.stderr == f"the cluster in {cluster['data_dir']} is already stopped\n"
    assert again.stdout.count("was not running") == 3  # two shards and the router
