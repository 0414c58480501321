"""The CLI's pure parts: encodings, the record formats of load/scan, tables, argument and
usage errors (one line, exit 2), and commands that need no cluster."""

import io
import json
import tomllib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.cli import app, codec, records, table
from router.cli.exit_codes import NOT_FOUND, UNREACHABLE, USAGE
from router.config import default_config_text


# -- codec ----------------------------------------------------------------------------------

@given(st.binary(), st.sampled_from(["hex", "base64"]))
def test_binary_encodings_round_trip(b, enc):
    assert codec.decode(codec.encode(b, enc), enc) == b


@given(st.text())
def test_text_round_trips_utf8(s):
    b = s.encode("utf-8", "surrogatepass")
    try:
        s2 = codec.encode(b, "text")
    except ValueError:
        return  # lone surrogates are not UTF-8 text: refused, not mangled
    assert codec.decode(s2, "text") == b


@pytest.mark.parametrize("s, enc, msg", [
    ("xyz", "hex", "not valid hex"), ("abc", "hex", "not valid hex"),
    ("a2V5!", "base64", "not valid base64"), ("a2V", "base64", "not valid base64"),
])
def test_bad_encoded_input_is_a_value_error(s, enc, msg):
    with pytest.raises(ValueError, match=msg):
        codec.decode(s, enc)


def test_non_utf8_is_never_silently_replaced():
    with pytest.raises(ValueError, match="use --encoding hex or base64"):
        codec.encode(b"\xff\xfe", "text")


# -- records -----------------------------------------------------------------------------------

def _load(data: bytes, fmt: str, enc: str):
    return list(records.iter_records(io.BytesIO(data), fmt, enc))


@given(st.lists(st.tuples(st.binary(min_size=1), st.binary()), max_size=20),
       st.sampled_from(["tsv", "jsonl"]), st.sampled_from(["hex", "base64"]))
def test_scan_output_loads_back_for_any_bytes(pairs, fmt, enc):
    data = b"".join(records.format_record(k, v, fmt, enc) for k, v in pairs)
    assert [(k, v) for _, k, v in _load(data, fmt, enc)] == pairs


_safe = st.text(st.characters(blacklist_characters="\t\n\r", blacklist_categories=("Cs",)),
                min_size=1).filter(lambda s: s.strip() != "")


@given(st.lists(st.tuples(_safe, _safe), max_size=20), st.sampled_from(["tsv", "jsonl"]))
def test_text_records_round_trip(pairs, fmt):
    pairs = [(k.encode(), v.encode()) for k, v in pairs]
    data = b"".join(records.format_record(k, v, fmt, "text") for k, v in pairs)
    assert [(k, v) for _, k, v in _load(data, fmt, "text")] == pairs


def test_tsv_details():
    got = _load(b"a\tb\tc\r\n\n  \nk\t\n", "tsv", "text")
    assert got == [(1, b"a", b"b\tc"), (4, b"k", b"")]  # split at the first tab; CRLF; blanks
    with pytest.raises(ValueError, match=r"^line 2: expected KEY<TAB>VALUE"):
        _load(b"a\tb\nno tab here\n", "tsv", "text")
    with pytest.raises(ValueError, match=r"^line 1: empty key"):
        _load(b"\tvalue\n", "tsv", "text")
    with pytest.raises(ValueError, match="line 1: not valid hex"):
        _load(b"zz\t00\n", "tsv", "hex")


def test_jsonl_details():
    got = _load(b'{"key": "k", "value": "v\\n\\t"}\n', "jsonl", "text")
    assert got == [(1, b"k", b"v\n\t")]
    for bad, msg in [(b'{"key": "k"}', "expected an object"), (b"[1]", "expected an object"),
                     (b'{"key": 1, "value": "v"}', "key and value must be JSON strings"),
                     (b"{nope", "invalid JSON")]:
        with pytest.raises(ValueError, match=f"line 1: {msg}"):
            _load(bad + b"\n", "jsonl", "text")


def test_text_tsv_refuses_what_it_cannot_carry():
    for k, v in [(b"a\tb", b"v"), (b"k", b"two\nlines"), (b"k", b"cr\r")]:
        with pytest.raises(ValueError, match="use --encoding hex or base64"):
            records.format_record(k, v, "tsv", "text")


def test_format_guess():
    assert records.guess_format("x.jsonl", b"") == "jsonl"
    assert records.guess_format("x.tsv", b"{") == "tsv"
    assert records.guess_format(None, b'  {"key"') == "jsonl"
    assert records.guess_format(None, b"k\tv") == "tsv"


# -- tables ------------------------------------------------------------------------------------

def test_table_aligns_numbers_right_and_text_left():
    out = table.render(["name", "n", "size"], [["a", 1, "1.0 KiB"], ["bbbb", 123, None]])
    assert out.splitlines() == ["name    n     size", "a       1  1.0 KiB", "bbbb  123        -"]


# -- the command line ------------------------------------------------------------------------

def _run(capsys, *argv):
    code = app.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv", [
    ["frobnicate"], ["get"], ["scan", "--limit", "many"], ["put", "k", "v", "--encoding", "rot13"],
    ["cluster", "restart", "--shard", "x"], ["cluster"], ["--bogus"],
])
def test_usage_errors_are_one_line_and_exit_2(capsys, argv):
    code, out, err = _run(capsys, *argv)
    assert code == USAGE
    assert err.startswith("sievekv: error: ") and err.count("\n") == 1


def test_help_documents_the_exit_codes(capsys):
    with pytest.raises(SystemExit) as ei:
        app.main(["--help"])
    assert ei.value.code == 0
    out = capsys.readouterr().out
    assert "exit codes:" in out and "5  not found" in out and "3  cluster unreachable" in out


def test_config_default_prints_the_embedded_file(capsys):
    code, out, _ = _run(capsys, "config", "default")
    assert code == 0 and out == default_config_text()
    tomllib.loads(out)


def test_config_check(capsys, tmp_path):
    good = tmp_path / "good.toml"
    good.write_text('[shards]\ncount = 2\n[cluster]\ndata_dir = "d"\n')
    code, out, _ = _run(capsys, "config", "check", "--config", str(good))
    assert code == 0
    doc = json.loads(out)
    assert doc["data_dir"] == str(tmp_path / "d") and len(doc["shards"]) == 2
    bad = tmp_path / "bad.toml"
    bad.write_text("[shards]\ncount = -1\n")
    code, out, err = _run(capsys, "config", "check", "--config", str(bad))
    assert code == USAGE and out == ""
    assert err == f"sievekv: error: config {bad}: [shards] count: must be in 1..16384, got -1\n"


def test_commands_without_a_cluster_say_so_in_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("SIEVEKV_ROUTER", raising=False)
    monkeypatch.delenv("SIEVEKV_CONFIG", raising=False)
    for argv in (["get", "k"], ["cluster", "status"], ["cluster", "stop"], ["filters"]):
        code, out, err = _run(capsys, *argv, "--data-dir", str(tmp_path))
        assert code == UNREACHABLE, argv
        assert err.startswith("sievekv: error: no cluster state at") and err.count("\n") == 1


def test_unreachable_router_is_exit_3(capsys, monkeypatch):
    import socket
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out, err = _run(capsys, "get", "k", "--router", f"127.0.0.1:{port}", "--timeout", "1")
    assert code == UNREACHABLE and err.startswith("sievekv: error: get: ")
    assert NOT_FOUND != UNREACHABLE


# -- report rendering (shapes of engine/reports.py; numbers made up) ---------------------------

def _table(n, level, keys, resident, neg, pos, tp):
    return {"file_number": n, "level": level, "keys": keys, "bits_per_key": 10.0,
            "expected_fpr": 0.0096, "filter_bytes": 4096, "filter_index_bytes": 27,
            "mapped_bytes": resident, "resident_bytes": resident, "partitions": 1,
            "partitions_touched": 1 if resident else 0, "negatives": neg, "positives": pos,
            "true_positives": tp, "false_positives": pos - tp}


def _shard_report(tables):
    from router.cli.filters import SUM_FIELDS
    tot = {f: sum(t.get(f, 0) for t in tables) for f in SUM_FIELDS if f != "tables"}
    tot["tables"] = len(tables)
    return {"policy": "blocked-bloom", "levels": [{"level": 0, "totals": tot, "tables": tables}],
            "totals": tot, "budget": {"budget_bytes": None}, "cap": {"cap_bytes": 1 << 20,
                                                                     "evictions": 3}}


def test_filters_totals_and_text_with_a_missing_shard():
    from router.cli import filters
    shards = {"shard-0": _shard_report([_table(7, 0, 100, 4096, 10, 5, 4),
                                        _table(9, 0, 300, 0, 30, 0, 0)]),
              "shard-1": _shard_report([_table(3, 0, 50, 4096, 0, 2, 2)])}
    tot = filters.cluster_totals(shards)
    assert (tot["keys"], tot["resident_bytes"], tot["tables"]) == (450, 8192, 3)
    assert tot["observed_fpr"] == 1 / 41 and tot["evictions"] == 6
    doc = {"shards": shards, "cluster_totals": tot,
           "sections": {"shard-0": {"address": "a:1", "ok": True},
                        "shard-1": {"address": "b:2", "ok": True},
                        "shard-2": {"address": "c:3", "ok": False, "error": "UNAVAILABLE"}}}
    text = filters.render_text(doc, tables=True)
    assert "shard-2: no report: UNAVAILABLE" in text
    assert "budget off, cap 1.0 MiB, evictions 3" in text
    assert "000007" in text and "000009" in text  # --tables rows
    assert "resident 8.0 KiB" in text and "3 tables, 450 keys" in text


def test_status_text_marks_dead_and_failed_processes():
    from router.cli import status
    st = {"cluster": "degraded", "data_dir": "/d", "router_address": "h:1", "error": None,
          "supervisor": {"pid": 10, "alive": True, "uptime_s": 61},
          "totals": {"keys": 5, "disk_bytes": 2048, "filter_resident_bytes": None},
          "processes": [
              {"name": "shard-0", "role": "shard", "shard": 0, "pid": 11, "alive": True,
               "address": "h:2", "status": "serving", "health": "SERVING", "uptime_s": 60,
               "restarts": 0, "keys": 5, "disk_bytes": 2048, "filter_resident_bytes": None,
               "last_exit": None},
              {"name": "shard-1", "role": "shard", "shard": 1, "pid": 12, "alive": False,
               "address": "h:3", "status": "failed", "health": "DOWN", "uptime_s": None,
               "restarts": 5, "keys": None, "disk_bytes": None, "filter_resident_bytes": None,
               "last_exit": "exit code 1"}]}
    text = status.render_text(st)
    lines = text.splitlines()
    assert lines[0] == "cluster degraded: router h:1, data /d, supervisor pid 10 up 1m01s"
    assert lines[3].split()[:7] == ["shard-1", "shard", "1", "-", "h:3", "failed", "DOWN"]
    assert lines[-1] == "shard-1: last exit exit code 1"


def test_cluster_stop_timeout_may_come_before_or_after_the_command():
    from router.cli.app import build_parser

    parse = build_parser().parse_args
    assert parse(["--timeout", "5", "cluster", "stop"]).timeout == 5.0  # was dropped (None)
    assert parse(["cluster", "stop", "--timeout", "4"]).timeout == 4.0
    assert not hasattr(parse(["cluster", "stop"]), "timeout")  # the config's stop_timeout


def test_a_final_progress_line_equal_to_the_last_one_shown_is_not_printed_twice(capsys):
    from router.cli.progress import StatusLine

    line = StatusLine(plain_every=0.0)  # stderr is not a terminal under capsys
    line.show("loaded 2 records (4 B) in 5.8s, 0.3 records/s")
    line.show("loaded 2 records (4 B) in 5.8s, 0.3 records/s", final=True)
    line.show("loaded 3 records (6 B) in 5.9s, 0.5 records/s", final=True)
    assert capsys.readouterr().err.splitlines() == [
        "loaded 2 records (4 B) in 5.8s, 0.3 records/s",
        "loaded 3 records (6 B) in 5.9s, 0.5 records/s"]


@pytest.mark.parametrize("argv, needle", [
    (["--router", "127.0.0.1:5", "cluster", "status"], "--router does not apply to 'cluster status'"),
    (["--timeout", "3", "cluster", "start"], "--timeout does not apply to 'cluster start'"),
    (["--router", "127.0.0.1:5", "config", "default"], "--router does not apply to 'config default'"),
])
def test_an_option_before_the_command_that_the_command_does_not_take_is_refused(capsys, argv,
                                                                                  needle):
    """It was accepted and silently ignored (the same option after the name was refused)."""
    code, out, err = _run(capsys, *argv)
    assert code == USAGE and out == ""
    assert err.strip() == f"sievekv: error: {needle}"


def test_stats_table_says_when_a_shards_table_workers_are_off(monkeypatch, capsys):
    """`sievekv stats` (table output) names a shard whose table workers are off (the engine
    code on disk changed under it: engine/table_workers.py) with the engine's reason; a shard
    whose workers run prints no such line."""
    import argparse

    from router.cli import report_cmds

    reason = ("the engine code on disk changed since this process started (...); table jobs "
              "run in the DB's threads until the process restarts")
    doc = {"shards": {"s0": {"table_workers": {"disabled": reason}},
                      "s1": {"table_workers": {"disabled": None}}},
           "sections": {"s0": {"ok": True}, "s1": {"ok": True}}}
    monkeypatch.setattr(report_cmds, "_report", lambda args, what: doc)
    assert report_cmds.cmd_stats(argparse.Namespace(json=False)) == 0
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if "table workers off" in ln]
    assert line.startswith("s0: table workers off") and reason in line, out


def test_stats_table_shows_each_shards_running_table_workers(monkeypatch, capsys):
    """The WORKERS column is `table_workers.running` (processes alive beside the shard, each
    with its own memory); a shard whose stats predate the field shows "-"."""
    import argparse

    from router.cli import report_cmds

    doc = {"shards": {"s0": {"table_workers": {"running": 2}}, "s1": {"table_workers": {}}},
           "sections": {"s0": {"ok": True}, "s1": {"ok": True}}}
    monkeypatch.setattr(report_cmds, "_report", lambda args, what: doc)
    assert report_cmds.cmd_stats(argparse.Namespace(json=False)) == 0
    header, s0, s1 = capsys.readouterr().out.splitlines()[:3]
    assert header.split()[-1] == "WORKERS" and s0.split()[-1] == "2" and s1.split()[-1] == "-"
