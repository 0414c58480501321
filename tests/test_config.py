"""The cluster config: defaults, validation (one readable line naming file and option), and
agreement between the embedded default file and the engine's own option defaults."""

import dataclasses
import os
import tomllib

import pytest

from engine.options import Options
from router import config as c
from router.humanize import format_bytes, format_counted, format_duration, parse_size


def test_embedded_default_describes_a_four_shard_cluster(tmp_path):
    cfg = c.load(cwd=str(tmp_path))
    assert cfg.source == c.DEFAULT_CONFIG_NAME
    assert cfg.data_dir == os.path.join(str(tmp_path), "sievekv-data")
    assert cfg.router.address == "127.0.0.1:50051"
    assert [s.address for s in cfg.shards] == [f"127.0.0.1:{50061 + i}" for i in range(4)]
    assert cfg.shards[0].slot_start == 0 and cfg.shards[-1].slot_end == c.NUM_SLOTS - 1
    for a, b in zip(cfg.shards, cfg.shards[1:]):
        assert b.slot_start == a.slot_end + 1
    Options.from_kwargs(**cfg.engine)  # the engine accepts what the config produced


def test_default_file_documents_every_engine_option_with_the_engine_default():
    doc = tomllib.loads(c.default_config_text())
    text = c.default_config_text()
    engine = c.load().engine
    for f in dataclasses.fields(Options):
        if f.name in c.ENGINE_HIDDEN:
            continue
        assert f.name in doc["engine"], f"[engine] {f.name} missing from default_config.toml"
        assert engine[f.name] == f.default, f"[engine] {f.name}: default differs from the engine's"
    assert engine["max_value_size"] == Options.max_value_size
    # every option line is preceded by a comment line
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line and not line.startswith(("#", "[")):
            assert lines[i - 1].startswith("#"), f"undocumented option: {line}"


def test_relative_data_dir_is_taken_from_the_config_files_directory(tmp_path):
    (tmp_path / "conf").mkdir()
    p = tmp_path / "conf" / "c.toml"
    p.write_text('[cluster]\ndata_dir = "d"\n')
    cfg = c.load(str(p), cwd="/")
    assert cfg.data_dir == str(tmp_path / "conf" / "d")
    assert c.load(str(p), data_dir="x", cwd=str(tmp_path)).data_dir == str(tmp_path / "x")


def test_partial_file_takes_defaults_and_sizes_parse():
    cfg = c.loads('[shards]\ncount = 3\nbase_port = 7000\n[engine]\nmemtable_bytes = "1MiB"\n'
                  'bits_per_key_per_level = [10, 8]\nfilter_memory_cap = "2MB"\n')
    assert [s.port for s in cfg.shards] == [7000, 7001, 7002]
    assert [(s.slot_start, s.slot_end) for s in cfg.shards] == [(0, 5460), (5461, 10921),
                                                               (10922, 16383)]
    assert cfg.engine["memtable_bytes"] == 1 << 20
    assert cfg.engine["bits_per_key_per_level"] == [10.0, 8.0]
    assert cfg.engine["filter_memory_cap"] == 2 << 20
    assert cfg.engine["filter_memory_budget"] is None
    assert c.from_dict(cfg.to_dict()) == cfg


def test_explicit_shards_with_slot_ranges():
    cfg = c.loads('[[shard]]\nlisten = "127.0.0.1:7001"\nslots = [0, 99]\nmetrics_port = 9001\n'
                  '[[shard]]\nlisten = "127.0.0.1:7002"\nslots = [100, 16383]\n')
    assert len(cfg.shards) == 2
    assert (cfg.shards[0].slot_end, cfg.shards[1].slot_start) == (99, 100)
    assert cfg.shards[0].metrics_port == 9001 and cfg.shards[1].metrics_port == 0


@pytest.mark.parametrize("text, where", [
    ("[shards]\ncount = 0", "[shards] count: must be in 1..16384, got 0"),
    ('[router]\nlisten = "nohost"', "[router] listen: expected host:port"),
    ('[router]\nlisten = "h:99999"', "out of range"),
    ("[routr]\n", "[routr]: unknown section"),
    ("[engine]\nmemtable_size = 1", "[engine] memtable_size: unknown option"),
    ('[engine]\nmemtable_bytes = "4XB"', "[engine] memtable_bytes: expected a size"),
    ("[engine]\nl0_stop_trigger = 1", "[engine]: options must satisfy"),
    ('[engine]\nbits_per_key = "ten"', "bits_per_key must be a float"),
    ("[engine]\nsync = 1", "sync must be a bool"),
    ('[router]\nlisten = "127.0.0.1:50061"', "uses port 50061, already used by"),
    ("[[shard]]\nslots = [0, 10]\n[[shard]]\nslots = [12, 16383]", "leaves a gap"),
    ("[[shard]]\nslots = [0, 10]\n[[shard]]\nslots = [5, 16383]", "overlaps the previous"),
    ("[[shard]]\nslots = [0, 10]\n[[shard]]\nslots = [11, 100]", "must end at 16383"),
    ("[[shard]]\nslots = [0, 10]\n[[shard]]\n", "[shard 1] slots: missing"),
    ("[shards]\ncount = 3\n[[shard]]\n[[shard]]\n", "count: is 3 but there are 2"),
    ("[supervisor]\nstart_timeout = 0", "start_timeout: must be a finite number > 0"),
    ("[limits]\nmax_key_size = 10", "[limits] max_key_size: unknown option"),
    ("[cluster\n", "invalid TOML"),
    ("[router]\nworkers = 0", "[router] workers: must be in 1..1024, got 0"),
    ("[router]\nworkers = 8\nmax_calls_per_shard = 9", "max_calls_per_shard: must be in 0..8, got 9"),
])
def test_bad_config_is_one_line_naming_the_option(text, where):
    with pytest.raises(c.ConfigError) as ei:
        c.loads(text, source="my.toml")
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith("config my.toml: ")
    assert where in msg


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(c.ConfigError, match="cannot read"):
        c.load(str(tmp_path / "nope.toml"))


def test_humanize_round_numbers():
    assert parse_size("64MiB") == 64 << 20 and parse_size("64mb") == 64 << 20
    assert parse_size(" 1.5 KiB ") == 1536 and parse_size(0) == 0
    for bad in ("-1", -1, "1.3b", True, "lots", 1.5):
        with pytest.raises(ValueError):
            parse_size(bad)
    assert format_bytes(None) == "-" and format_bytes(1 << 20) == "1.0 MiB"
    assert format_duration(3725) == "1h02m"


def test_counts_of_one_read_singular():
    # Session 20 review: the CLI said "L0 1 tables", "loaded 1 records", "(1 shards, ...".
    assert format_counted(1, "table") == "1 table" and format_counted(0, "table") == "0 tables"
    assert format_counted(1234, "record") == "1,234 records"
    assert format_counted(2, "index", "indexes") == "2 indexes"


def test_router_threads_and_call_slots_reach_the_router_command_line():
    from router import launch

    argv = launch.router_spec(c.loads("")).argv
    assert argv[argv.index("--workers") + 1] == "32"
    assert "--max-calls-per-shard" not in argv  # 0: the router's own default (workers / 4)
    cfg = c.loads("[router]\nworkers = 64\nmax_calls_per_shard = 16\n")
    assert (cfg.router.workers, cfg.router.max_calls_per_shard) == (64, 16)
    assert c.from_dict(cfg.to_dict()) == cfg
    argv = launch.router_spec(cfg).argv
    assert argv[argv.index("--workers") + 1] == "64"
    assert argv[argv.index("--max-calls-per-shard") + 1] == "16"
