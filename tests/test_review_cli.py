"""Review regressions in the CLI's argument checks and the size limits shared by the servers.

No cluster is needed: every case must be refused before anything is contacted.
"""

import pytest

from router.cli import app
from router.cli.exit_codes import USAGE
from router.config import ConfigError, loads
from shard import worker as shard_worker
from shard.limits import MAX_VALUE_BYTES_LIMIT, Limits
from engine.errors import InvalidArgumentError


def run(capsys, argv):
    code = app.main(argv)
    err = capsys.readouterr().err
    return code, err


@pytest.mark.parametrize("argv, needle", [
    # 99999 was passed to gRPC, which wrapped it to port 34463 and talked to whatever was there
    (["get", "--router", "127.0.0.1:99999", "k"], "1..65535"),  # said "out of range 0..65535" (0 is refused too)
    (["get", "--router", "127.0.0.1:0", "k"], "1..65535"),
    (["get", "--router", "nohost", "k"], "expected host:port"),
    # 0 silently meant "the default 30 s"; -1 failed every call as "unreachable" (exit 3)
    (["get", "--timeout", "0", "k"], "positive number of seconds"),
    (["get", "--timeout", "-1", "k"], "positive number of seconds"),
    (["get", "--timeout", "nan", "k"], "positive number of seconds"),
    (["cluster", "stop", "--timeout", "0"], "positive number of seconds"),
])
def test_bad_router_or_timeout_is_a_usage_error(capsys, argv, needle):
    code, err = run(capsys, argv)
    assert code == USAGE
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err


def test_bad_router_in_the_environment_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.setenv("SIEVEKV_ROUTER", "127.0.0.1:70000")
    code, err = run(capsys, ["get", "k"])
    assert code == USAGE
    assert err.startswith("sievekv: error: $SIEVEKV_ROUTER:")


def test_value_limit_is_capped_where_grpc_can_represent_it():
    Limits(max_value_bytes=MAX_VALUE_BYTES_LIMIT).grpc_options()
    # One more and gRPC's C core raised OverflowError when the server or channel was created,
    # after `config check` had said the config was fine.
    with pytest.raises(InvalidArgumentError, match="2 GiB"):
        Limits(max_value_bytes=MAX_VALUE_BYTES_LIMIT + 1)
    with pytest.raises(ConfigError, match=r"\[limits\] max_value_size: must be at most"):
        loads('[limits]\nmax_value_size = "3GiB"\n', source="c.toml")


def test_server_flag_over_the_value_cap_is_an_argument_error(capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        shard_worker.main(["--data-dir", str(tmp_path), "--max-value-bytes", str(3 << 30)])
    assert exc.value.code == 2
    assert "--max-value-bytes: must be in 0.." in capsys.readouterr().err


def _status_doc(recorded: str) -> dict:
    proc = {"name": "shard-0", "role": "shard", "shard": 0, "pid": None, "alive": False,
            "address": "127.0.0.1:1", "status": recorded, "health": "DOWN", "uptime_s": None,
            "restarts": 0, "last_exit": "exit code 0", "keys": None, "disk_bytes": None,
            "filter_resident_bytes": None}
    return {"cluster": "stopped", "router_address": "127.0.0.1:2", "data_dir": "/d",
            "supervisor": {"pid": None, "alive": False, "uptime_s": None}, "processes": [proc],
            "totals": {"keys": None, "disk_bytes": None, "filter_resident_bytes": None}}


@pytest.mark.parametrize("recorded, shown", [
    ("stopped", "stopped"),   # was shown as "dead" after every clean `cluster stop`
    ("failed", "failed"), ("backoff", "backoff"),
    ("serving", "dead"),      # recorded as running, pid gone: the supervisor died
])
def test_status_column_of_a_process_that_is_not_running(recorded, shown):
    from router.cli.status import render_text

    row = render_text(_status_doc(recorded)).splitlines()[2].split()
    assert row[0] == "shard-0" and row[5] == shown
