"""Review regressions that need real shard and router processes (one small cluster)."""

from router.cli import app
from router.cli.exit_codes import PARTIAL
from router.client import Client

from .test_service_failures import start_cluster

def test_filters_with_a_dead_shard_prints_one_error_line_and_exits_4(procs, tmp_path, capsys):
    shards, router, _ = start_cluster(procs, str(tmp_path), 2)
    with Client(router.address, retries=0) as c:
        c.write([(b"k%d" % i, b"v") for i in range(50)])
        c.flush()
    shards[1].kill()
    code = app.main(["filters", "--router", router.address, "--timeout", "5"])
    out, err = capsys.readouterr()
    assert code == PARTIAL
    assert "s0 (" in out and "s1: no report" in out      # the live shard is still shown
    # Exit 4 used to come with nothing on stderr; docs/cli.md promises one error line.
    assert err.count("\n") == 1
    assert err.startswith("sievekv: error: FilterReport failed on 1 of 2 shards (s1)")
