"""Review regressions: engine options that validated but broke the DB at its first flush."""

import math

import pytest

import engine
from engine.errors import InvalidArgumentError
from engine.options import Options
from router.config import ConfigError, loads


@pytest.mark.parametrize("kw", [
    {"filter_policy": "nope"},                       # opened, then every flush failed
    {"bits_per_key": 100.0},                         # over the filters' 64 bits/key maximum
    {"bits_per_key_per_level": [10.0, 65.0]},
    {"bits_per_key": math.nan},                      # NaN compared false against every bound
    {"bits_per_key_per_level": [math.nan]},
    {"slowdown_sleep_s": math.inf},
])
def test_db_open_rejects_filter_options_it_cannot_build(tmp_path, kw):
    with pytest.raises(InvalidArgumentError):
        engine.DB.open(str(tmp_path / "db"), table_workers=0, **kw)


@pytest.mark.parametrize("kw", [
    {"filter_policy": "bloom"}, {"filter_policy": "sievekv.BlockedBloomFilter.v1"},
    {"bits_per_key": 0.5},                            # below the minimum: no filter, as documented
    {"filter_policy": None, "bits_per_key": 100.0},   # no filters: bits unused
])
def test_valid_filter_options_still_accepted(kw):
    Options.from_kwargs(**kw)


def test_db_with_rejected_policy_never_got_to_accept_writes(tmp_path):
    # Before the fix the DB opened, took the write, and refused writes after the flush failed.
    path = str(tmp_path / "db")
    with pytest.raises(InvalidArgumentError, match="unknown filter policy 'nope'"):
        engine.DB.open(path, filter_policy="nope", table_workers=0)
    with engine.DB.open(path, table_workers=0) as db:
        db.put(b"k", b"v")
        db.flush()
        assert db.get(b"k") == b"v"


@pytest.mark.parametrize("text, needle", [
    ('[engine]\nfilter_policy = "nope"\n', "unknown filter policy 'nope'"),
    ("[engine]\nbits_per_key = 65\n", "maximum of 64"),
    ("[engine]\nbits_per_key = nan\n", "finite"),
])
def test_config_check_rejects_what_the_shard_could_not_build(text, needle):
    with pytest.raises(ConfigError, match=needle):
        loads(text, source="c.toml")


def test_skipping_filter_checks_is_explicit():
    # The CLI reads a config only for its data_dir without importing numpy; cluster start and
    # config check use the full validation above.
    opts = Options.from_kwargs(check_filters=False, filter_policy="nope")
    assert opts.filter_policy == "nope"
