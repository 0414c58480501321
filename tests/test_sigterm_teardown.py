"""A pytest run stopped with SIGTERM tears its fixtures down (tests/sigterm.py), so the
processes they started do not outlive it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from .conftest import REPO, wait_until

INNER = '''
import os, subprocess, sys, time
import pytest

@pytest.fixture
def child():
    p = subprocess.Popen(["sleep", "600"], start_new_session=True)  # not in pytest's group
    with open(os.environ["CHILD_PID"], "w") as f:
        f.write(str(p.pid))
    yield p
    p.kill()
    p.wait()
    with open(os.environ["TORN_DOWN"], "w") as f:
        f.write("yes")

def test_waits(child):
    with open(os.environ["READY"], "w") as f:
        f.write("yes")
    time.sleep(600)
'''


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_this_run_turns_sigterm_into_a_teardown():
    assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN, None)


def test_sigterm_to_a_test_run_stops_what_its_fixtures_started(tmp_path):
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {REPO!r})
        from tests import sigterm
        sigterm.install()
    """))
    (tmp_path / "test_inner.py").write_text(INNER)
    files = {name: tmp_path / name.lower() for name in ("CHILD_PID", "TORN_DOWN", "READY")}
    env = dict(os.environ, **{k: str(v) for k, v in files.items()})
    inner = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              str(tmp_path / "test_inner.py")], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
    child = None
    try:
        wait_until(lambda: files["READY"].exists(), "the inner test to start")
        child = int(files["CHILD_PID"].read_text())
        assert _alive(child)
        inner.send_signal(signal.SIGTERM)
        out = inner.communicate(timeout=60)[0].decode(errors="replace")
        assert inner.returncode == 2, out  # pytest's "interrupted"
        assert files["TORN_DOWN"].read_text() == "yes", out
        assert not _alive(child), out
    finally:
        if inner.poll() is None:
            os.killpg(inner.pid, signal.SIGKILL)
            inner.wait()
        if child is not None and _alive(child):
            os.kill(child, signal.SIGKILL)
