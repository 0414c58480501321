"""Operator CLI gaps (session 2): ``put KEY -`` / ``--value-file``, ``load`` of a record or batch
over the cluster's limits, ``config show`` (and ``config default`` no longer ignoring --config
silently), and user mistakes that must be one line and a documented exit code.

The cluster tests run one real cluster (``sievekv cluster start``: supervisor, two shards, a
router) with a 64 KiB value limit, so the message limit is 1 MiB + 64 KiB; the module finalizer
stops it and SIGKILLs any recorded pid still alive, even when a test fails. Most commands run
in-process (``app.main``) for speed; the binary-safety test goes through a real pipe.
"""

import io
import json
import socket
import sys
import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.cli import app
from router.cli.exit_codes import OK, UNREACHABLE, USAGE
from router.cli.sizes import mutation_bytes, record_problem, value_over_limit
from router.wire_sizes import put_request_bytes
from router.config import default_config_text
from shard.limits import VALUE_LIMIT_SETTING, Limits
from sievekv_proto import sievekv_pb2 as pb
from engine.errors import InvalidArgumentError

from .test_cli_e2e import cli_env_cleared  # noqa: F401 (a fixture, used by pytestmark)
from .test_cli_e2e import cluster_from_text, sievekv

LIMIT = 64 * 1024
MESSAGE_LIMIT = LIMIT + (1 << 20)
CONF = """
[cluster]
data_dir = "data"
[router]
listen = "127.0.0.1:0"
[shards]
count = 2
base_port = 0
[limits]
max_value_size = "64KiB"
[supervisor]
start_timeout = 60.0
stop_timeout = 10.0
"""


pytestmark = pytest.mark.usefixtures("cli_env_cleared")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    return cluster_from_text(CONF, tmp_path_factory, request, "session2")


@pytest.fixture
def cli(monkeypatch, capsysbinary):
    """``cli(*argv, stdin=b"")`` runs app.main in-process: (exit code, stdout bytes, stderr)."""
    def run(*argv, stdin: bytes | None = b""):
        monkeypatch.setattr(sys, "stdin", None if stdin is None else
                            io.TextIOWrapper(io.BytesIO(stdin)))
        code = app.main([str(a) for a in argv])
        out, err = capsysbinary.readouterr()
        return code, out, err.decode("utf-8", "replace")
    return run


def one_error_line(err: str) -> bool:
    return (err.startswith("sievekv: error: ") and err.count("\n") == 1
            and "Traceback" not in err and "internal error" not in err)


def dead_router() -> str:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


# -- wire sizes (pure) -------------------------------------------------------------------------

@given(st.binary(min_size=1, max_size=300), st.binary(max_size=300),
       st.sampled_from([None, True, False]))
def test_sizes_match_the_protobuf_encoding(key, value, sync):
    m = pb.Mutation(key=key, value=value)
    assert pb.WriteRequest(mutations=[m]).ByteSize() == mutation_bytes(len(key), len(value))
    assert (pb.PutRequest(key=key, value=value, sync=sync).ByteSize()
            == put_request_bytes(len(key), len(value), sync))


def test_sizes_of_large_fields_match_the_protobuf_encoding():
    for n in (127, 128, 16383, 16384, (1 << 21) - 1, 1 << 21):
        assert pb.WriteRequest(mutations=[pb.Mutation(key=b"k", value=bytes(n))]).ByteSize() \
            == mutation_bytes(1, n)


def test_value_message_is_the_servers():
    limits = Limits(max_value_bytes=10)
    with pytest.raises(InvalidArgumentError) as info:
        limits.check_value(b"x" * 11)
    assert value_over_limit(11, limits) == str(info.value)


def test_record_problem_names_each_limit():
    limits = Limits(max_value_bytes=10)
    assert record_problem(b"k", b"v" * 10, limits) is None
    assert record_problem(b"k", b"v" * 11, limits).startswith("value is 11 bytes")
    assert record_problem(b"k" * 70000, b"", limits).startswith("key is 70000 bytes")
    # a key limit past the message limit: only the message check can catch the record
    wide = Limits(max_key_bytes=2 << 20, max_value_bytes=0)
    assert "over the gRPC message limit of 1048576 bytes" in record_problem(
        b"k" * (3 << 19), b"", wide)


# -- put: the value from stdin or a file -------------------------------------------------------

def test_put_dash_stores_stdins_raw_bytes(cluster):
    data = b"\x00\xff\r\nline two\n-\t\n"  # NUL, non-UTF-8, CRLF, trailing newline
    r = sievekv("put", "-e", "hex", "733a00", "-", "--config", cluster["conf"], input=data)
    assert (r.returncode, r.stdout, r.stderr) == (0, b"OK\n", b"")
    r = sievekv("get", "-e", "hex", "733a00", "--config", cluster["conf"], input=b"")
    assert r.stdout == (data.hex() + "\n").encode()
    # text key, text value with a trailing newline: kept, not stripped and not decoded
    r = sievekv("put", "s:text", "-", "--config", cluster["conf"], input=b"caf\xc3\xa9\n\n")
    assert r.returncode == 0
    r = sievekv("get", "s:text", "--config", cluster["conf"], input=b"")
    assert r.stdout == b"caf\xc3\xa9\n\n" + b"\n"


def test_put_value_file_and_a_literal_dash(cluster, cli, tmp_path):
    conf = cluster["conf"]
    assert cli("put", "s:dash1", "-", "--config", conf, stdin=b"-")[0] == OK
    assert cli("get", "s:dash1", "--config", conf)[1] == b"-\n"
    f = tmp_path / "v"
    f.write_bytes(b"-")
    assert cli("put", "s:dash2", "--value-file", f, "--config", conf)[0] == OK
    assert cli("get", "s:dash2", "--config", conf)[1] == b"-\n"
    assert cli("put", "s:dash3", "--value-file", "-", "--config", conf, stdin=b"\x01-")[0] == OK
    assert cli("get", "-e", "hex", "733a6461736833", "--config", conf)[1] == b"012d\n"
    assert cli("put", "--config", conf, "s:dash4", "--", "-x")[0] == OK
    assert cli("get", "s:dash4", "--config", conf)[1] == b"-x\n"
    for argv, needle in [
        (["put", "s:k", "v", "--value-file", f], "not both"),
        (["put", "s:k"], "missing VALUE"),
        (["put", "s:k", "--value-file", tmp_path / "absent"], "cannot read"),
        (["put", "s:k", "--value-file", tmp_path], "cannot read"),
    ]:
        code, out, err = cli(*argv, "--config", conf)
        assert code == USAGE and one_error_line(err) and needle in err, (argv, err)
    code, _, err = cli("put", "s:k", "-", "--config", conf, stdin=None)  # stdin closed
    assert code == USAGE and one_error_line(err) and "no standard input" in err


def test_put_over_the_value_limit_is_the_servers_invalid_argument(cluster, cli):
    conf = cluster["conf"]
    assert cli("put", "s:max", "-", "--config", conf, stdin=b"m" * LIMIT)[0] == OK
    assert cli("get", "s:max", "--config", conf)[1] == b"m" * LIMIT + b"\n"
    for n in (LIMIT + 1, 3 << 20):  # the server says it; past the message limit the CLI does
        code, out, err = cli("put", "s:big", "-", "--config", conf, stdin=b"b" * n)
        assert code == USAGE and out == b""
        assert err == (f"sievekv: error: put: INVALID_ARGUMENT: value is {n} bytes, over the "
                       f"value limit of {LIMIT} bytes {VALUE_LIMIT_SETTING}\n")
    # on the command line too (the argument is sent, the router refuses it)
    code, _, err = cli("put", "s:big", "a" * (LIMIT + 1), "--config", conf)
    assert code == USAGE and "value is 65537 bytes, over the value limit of 65536" in err
    assert cli("get", "s:big", "--config", conf)[0] == 5  # nothing was stored
    # a router address with no state file: the CLI assumes the default limit; the router's
    # own refusal is still one line and exit 2
    code, _, err = cli("put", "s:big", "-", "--router", cluster["router"], "--data-dir",
                       cluster["dir"] / "nowhere", stdin=b"b" * (2 << 20))
    assert code == USAGE and one_error_line(err) and "RESOURCE_EXHAUSTED" in err


# -- load: records and batches over the limits -------------------------------------------------

def test_load_names_the_over_size_record_and_keeps_what_came_before(cluster, cli):
    conf = cluster["conf"]
    good = b"".join(b"l1:%d\tv%d\n" % (i, i) for i in range(1, 6))
    data = good + b"l1:big\t" + b"x" * (2 << 20) + b"\nl1:7\tv7\n"
    code, out, err = cli("load", "--format", "tsv", "--config", conf, stdin=data)
    assert code == USAGE and one_error_line(err), err
    assert err == ("sievekv: error: stdin: line 6: record too large: value is 2097152 bytes, "
                   f"over the value limit of {LIMIT} bytes {VALUE_LIMIT_SETTING}; as a Write the "
                   f"record is 2097170 bytes, over the gRPC message limit of {MESSAGE_LIMIT} "
                   "bytes; the 5 record(s) before it were loaded\n")
    assert cli("get", "l1:5", "--config", conf)[1] == b"v5\n"
    assert cli("get", "l1:7", "--config", conf)[0] == 5  # nothing after it was sent
    # over the value limit but within a message: still caught before sending, line named
    data = b'{"key": "l2:1", "value": "a"}\n{"key": "l2:2", "value": "b"}\n' \
           b'{"key": "l2:3", "value": "' + b"y" * (LIMIT + 1) + b'"}\n'
    code, _, err = cli("load", "--config", conf, stdin=data)
    assert code == USAGE and one_error_line(err)
    assert (f"stdin: line 3: record too large: value is {LIMIT + 1} bytes, over the value limit "
            f"of {LIMIT} bytes") in err and err.endswith("the 2 record(s) before it were loaded\n")
    assert cli("get", "l2:2", "--config", conf)[1] == b"b\n"
    code, _, err = cli("load", "--format", "tsv", "--config", conf,
                       stdin=b"l3:1\tv\n" + b"k" * 70000 + b"\tv\n")
    assert code == USAGE and "line 2: record too large: key is 70000 bytes" in err


def test_load_cuts_batches_by_their_size_on_the_wire(cluster, cli):
    # 110,000 puts of 10-byte keys and empty values: 1.1 MB of keys but 1.5 MB of protobuf,
    # over the 1.06 MiB message limit if batched by key and value bytes alone.
    n = 110_000
    data = b"".join(b"w:%08d\t\n" % i for i in range(n))
    code, _, err = cli("load", "--format", "tsv", "--batch", 1_000_000, "--quiet",
                       "--config", cluster["conf"], stdin=data)
    assert (code, err) == (OK, "")
    assert mutation_bytes(10, 0) * n > MESSAGE_LIMIT
    for i in (0, n // 2, n - 1):
        code, out, _ = cli("get", "-e", "hex", (b"w:%08d" % i).hex(), "--config", cluster["conf"])
        assert (code, out) == (OK, b"\n")


# -- config show / default ---------------------------------------------------------------------

RICH = textwrap.dedent("""
    [cluster]
    data_dir = "d ir/with \\"quotes\\" and \\\\ backslash é"
    [router]
    listen = "[::1]:0"
    processes = 3
    metrics_port = 9100
    [shards]
    count = 3
    host = "::1"
    [[shard]]
    listen = "127.0.0.1:7001"
    slots = [0, 99]
    [[shard]]
    listen = "127.0.0.2:7005"
    slots = [100, 16000]
    metrics_port = 9201
    [[shard]]
    slots = [16001, 16383]
    [engine]
    sync = true
    memtable_bytes = 1000001
    bits_per_key = 7
    bits_per_key_per_level = [4, 6.5, 0]
    filter_policy = "off"
    filter_memory_budget = "3MiB"
    slowdown_sleep_s = 1e-5
    [limits]
    max_value_size = "1GiB"
    [supervisor]
    restart_delay = 0
    max_restarts = 0
""")


def _resolved(cli, *argv) -> dict:
    code, out, err = cli("config", "check", *argv)
    assert code == OK, err
    doc = json.loads(out)
    doc.pop("source")
    return doc


@pytest.mark.parametrize("text", [None, RICH, '[shards]\ncount = 1\nbase_port = 65535\n'],
                         ids=["embedded", "rich", "one-shard"])
def test_config_show_round_trips_through_config_check(cli, tmp_path, text):
    src = []
    if text is not None:
        (tmp_path / "src.toml").write_text(text)
        src = ["--config", tmp_path / "src.toml"]
    code, shown, err = cli("config", "show", *src)
    assert (code, err) == (OK, "")
    copy = tmp_path / "elsewhere" / "shown.toml"
    copy.parent.mkdir()
    copy.write_bytes(shown)
    assert _resolved(cli, "--config", copy) == _resolved(cli, *src)
    again = cli("config", "show", "--config", copy)[1]  # a fixed point, but for the header
    assert again.split(b"\n", 1)[1] == shown.split(b"\n", 1)[1]


def test_config_show_resolves_flag_then_environment_then_default(cli, tmp_path, monkeypatch):
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.write_text('[cluster]\ndata_dir = "da"\n[shards]\ncount = 2\n')
    b.write_text('[cluster]\ndata_dir = "db"\n')
    monkeypatch.setenv("SIEVEKV_CONFIG", str(a))
    out = cli("config", "show")[1].decode()
    assert f"resolved from {a}" in out and f'data_dir = "{tmp_path / "da"}"' in out
    assert out.count("[[shard]]") == 2
    out = cli("config", "show", "--config", b)[1].decode()
    assert f"resolved from {b}" in out and f'data_dir = "{tmp_path / "db"}"' in out
    out = cli("config", "show", "--config", b, "--data-dir", tmp_path / "dd")[1].decode()
    assert f'data_dir = "{tmp_path / "dd"}"' in out and "data_dir comes from --data-dir" in out
    monkeypatch.delenv("SIEVEKV_CONFIG")
    out = cli("config", "show")[1].decode()
    assert "resolved from <embedded default>" in out and out.count("[[shard]]") == 4
    code, out, err = cli("config", "show", "--config", tmp_path / "absent.toml")
    assert code == USAGE and out == b"" and one_error_line(err)


def test_config_default_prints_the_embedded_file_and_says_it_ignored_config(cli, tmp_path,
                                                                           monkeypatch):
    f = tmp_path / "c.toml"
    f.write_text("[shards]\ncount = 2\n")
    code, out, err = cli("config", "default", "--config", f)
    assert code == OK and out.decode() == default_config_text()
    assert err.count("\n") == 1 and "embedded default" in err and "config show" in err
    monkeypatch.setenv("SIEVEKV_CONFIG", str(f))
    assert str(f) in cli("config", "default")[2]
    monkeypatch.delenv("SIEVEKV_CONFIG")
    assert cli("config", "default")[2] == ""


# -- user mistakes: one line and a documented exit code, never a traceback ---------------------

CLIENT_COMMANDS = [["put", "k", "v"], ["put", "k", "-"], ["get", "k"], ["delete", "k"],
                   ["scan"], ["load", "--format", "tsv"], ["filters"], ["stats"], ["flush"],
                   ["compact"]]


@pytest.mark.parametrize("argv", CLIENT_COMMANDS, ids=" ".join)
def test_client_commands_with_nothing_listening_exit_3(cli, argv):
    code, out, err = cli(*argv, "--router", dead_router(), "--timeout", "2", stdin=b"k\tv\n")
    assert code == UNREACHABLE and one_error_line(err), err


@pytest.mark.parametrize("argv", [
    ["scan", "--limit", str(2**64)],           # was an internal error (protobuf uint64)
    ["get", "k", "--router", "[::1"],          # was exit 3: gRPC could not resolve it
    ["get", "k", "--router", "host:12:34"],
    ["get", "k", "--timeout", "1e12"],         # was exit 3: the deadline overflowed
    ["cluster", "stop", "--timeout", "1e12"],
    ["put", "k", "v", "--value-file", "/dev/null"], ["put", "k"],
    ["put", "k", "--value-file", "/nonexistent/v"],
    ["put", "", "v"], ["get", ""],
    ["put", "-e", "hex", "zz", "v"], ["put", "-e", "hex", "00", "zz"],
    ["scan", "--limit", "-1"], ["scan", "--start", "b", "--end", "a"], ["scan", "--limit", "x"],
    ["load", "--batch", "0"], ["load", "/nonexistent/f"], ["load", "--format", "xml"],
    ["load", "--format", "tsv"],               # stdin "no tab": a bad input line
    ["filters", "--tables", "extra"], ["stats", "--timeout", "-5"],
    ["get", "k", "--config", "/nonexistent.toml"], ["config", "check", "--config", "/"],
    ["config"], ["config", "frob"],
], ids=" ".join)
def test_bad_arguments_are_one_line_and_exit_2(cli, argv):
    router = ["--router", dead_router(), "--timeout", "2"]
    extra = router if argv[0] not in ("config", "cluster") and "--router" not in argv else []
    code, out, err = cli(*argv, *extra, stdin=b"no tab\n")
    assert code == USAGE and one_error_line(err), err
