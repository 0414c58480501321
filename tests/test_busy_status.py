"""A server out of a resource for now (a full disk, its limit of scans at once) answers
RESOURCE_EXHAUSTED, and the CLI exits 7 (BUSY: the same command may succeed later), while a
message or answer over a size limit stays a usage error (exit 2: asking again fails again).

Before session 6 a full disk was INTERNAL (a broken server, to a caller) and every
RESOURCE_EXHAUSTED was exit 2, so a script could not tell "retry later" from "your input is
too big".
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import grpc

from engine.errors import ResultTooLargeError, StorageIOError
from router.cli.exit_codes import BUSY, ERROR, USAGE, code_for_grpc
from router.client import Client
from shard.status import status_of
from sievekv_proto import sievekv_pb2 as pb
from sievekv_proto import sievekv_pb2_grpc as pbg

from .conftest import start_router_process, start_shard_process, wait_until, write_cluster_map

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RE = grpc.StatusCode.RESOURCE_EXHAUSTED


def test_a_full_disk_or_quota_is_resource_exhausted_and_other_io_errors_internal():
    for code in (errno.ENOSPC, errno.EDQUOT):
        exc = StorageIOError(f"DB refuses writes until a flush succeeds ([Errno {code}] "
                             f"{os.strerror(code)})", path="/d", errno_=code)
        status, details = status_of(exc)
        assert status == RE and os.strerror(code) in details
    assert status_of(StorageIOError("fsync failed", errno_=errno.EIO))[0] == grpc.StatusCode.INTERNAL
    assert status_of(StorageIOError("no errno"))[0] == grpc.StatusCode.INTERNAL


def test_resource_exhausted_is_busy_unless_it_is_about_a_size_limit():
    busy = [
        "shard s0 serves at most 8 scans at once (half its handler threads) and that many "
        "are open; retry later",
        "the router serves at most 4 scans at once (half its handler threads) and that many "
        "are open; retry later",
        "shard s1 at 127.0.0.1:5001: [Errno 28] DB refuses writes until a flush succeeds "
        "([Errno 28] No space left on device); it retries by itself, and with each write: /d",
        f"[Errno {errno.EDQUOT}] {os.strerror(errno.EDQUOT)}",  # "quota exceeded" is not a size
        "",
    ]
    for details in busy:
        assert code_for_grpc(RE, details) == BUSY, details
    too_big = [
        "Received message larger than max (4194400 vs. 4194304)",
        "Sent message larger than max (5242880 vs. 4194304)",
        str(ResultTooLargeError("the values found exceed 1048576 bytes by key 3 (1048600 "
                                "bytes); ask for fewer keys at a time")),
    ]
    for details in too_big:
        assert code_for_grpc(RE, details) == USAGE, details
    assert code_for_grpc(grpc.StatusCode.INTERNAL, "x") == ERROR


def test_sievekv_scan_exits_7_while_the_router_serves_its_limit_of_scans(procs, tmp_path):
    shard = start_shard_process(procs, str(tmp_path / "s0"), name="s0")
    map_path = write_cluster_map(str(tmp_path / "cluster.toml"), [shard])
    router = start_router_process(procs, map_path, extra=("--workers", "2"))  # 1 scan at once
    with Client(router.address, retries=0) as c:
        with c.batch(max_mutations=200) as b:
            for i in range(2000):  # 8 MB: far more than the holder's 64 KiB window takes
                b.put(b"k%05d" % i, b"v" * 4096)
    # The holder reads one message and stops: without BDP probing its receive window stays at
    # 64 KiB, so the router's handler blocks sending and keeps its only scan slot.
    holder = grpc.insecure_channel(router.address, options=[("grpc.http2.bdp_probe", 0)])
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("SIEVEKV_ROUTER", None)
    env.pop("SIEVEKV_CONFIG", None)

    def run_scan():
        return subprocess.run(
            [sys.executable, "-m", "router.cli", "scan", "--limit", "1", "--router",
             router.address, "--data-dir", str(tmp_path / "nowhere")],
            capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)

    try:
        stream = pbg.KVStub(holder).Scan(pb.ScanRequest())
        assert len(next(stream).keys) > 0
        refused = wait_until(lambda: (lambda r: r if r.returncode != 0 else None)(run_scan()),
                             "a second scan to be refused")
        assert refused.returncode == BUSY, refused.stderr
        assert refused.stdout == ""
        err = refused.stderr
        assert err.startswith("sievekv: error: ") and err.count("\n") == 1, err
        assert "RESOURCE_EXHAUSTED" in err and "at most 1 scans at once" in err
        assert "Traceback" not in err
        stream.cancel()
        # Once the holder is gone the same command succeeds: BUSY meant "retry later".
        ok = wait_until(lambda: (lambda r: r if r.returncode == 0 else None)(run_scan()),
                        "the scan slot to be free again")
        assert ok.stdout.startswith("k00000\t")
    finally:
        holder.close()
