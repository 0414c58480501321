"""The shard process raises its soft open-file limit at startup (shard/worker.py
raise_open_file_limit): every open table holds up to three descriptors."""

import os
import resource
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _soft_nofile(pid: int) -> int:
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                return int(line.split()[3])
    raise AssertionError("no 'Max open files' line")


def test_shard_raises_a_low_soft_open_file_limit_to_the_hard_limit(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = 256
    expected = hard if hard != resource.RLIM_INFINITY else max(low, 1 << 20)
    port_file = tmp_path / "port"

    # The limit is lowered by a fresh interpreter that then execs the shard (same pid), not
    # by preexec_fn: that forces a fork running Python in this pytest process, where earlier
    # tests' gRPC objects live, and gRPC's fork handlers then restart its poller in the child,
    # which aborts on the epoll descriptor close_fds closed (SIGABRT before exec, seen in a
    # full run: "Epoll1Poller ... epoll_wait error: Bad file descriptor"; grpc/grpc#43055).
    shard = [sys.executable, "-m", "shard", "--data-dir", str(tmp_path / "d"), "--listen",
             "127.0.0.1:0", "--port-file", str(port_file), "--log-level", "WARNING"]
    lower_then_exec = ("import os, resource, sys; "
                       f"resource.setrlimit(resource.RLIMIT_NOFILE, ({low}, {hard})); "
                       "os.execv(sys.executable, sys.argv[1:])")
    p = subprocess.Popen([sys.executable, "-c", lower_then_exec, *shard],
                         cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert p.poll() is None, p.stderr.read().decode()
            assert time.monotonic() < deadline, "shard did not start"
            time.sleep(0.05)
        assert _soft_nofile(p.pid) == expected > low
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    assert p.returncode == 0
