"""The restart policy as pure logic (no clock, no processes), and the state-file helpers."""

import doctest
import os
import subprocess
import sys

from router import cluster_state as cs
from router import restart_policy
from router.restart_policy import RestartPolicy, RestartTracker


def test_doctests():
    assert doctest.testmod(restart_policy).failed == 0


def test_backoff_doubles_up_to_the_cap_then_gives_up():
    t = RestartTracker(RestartPolicy(delay=1, delay_max=5, max_restarts=5, window=100))
    assert [t.on_crash(x) for x in range(5)] == [1, 2, 4, 5, 5]
    assert not t.gave_up
    assert t.on_crash(5) is None and t.gave_up


def test_old_crashes_are_forgotten():
    t = RestartTracker(RestartPolicy(delay=1, delay_max=60, max_restarts=2, window=10))
    assert t.on_crash(0) == 1 and t.on_crash(1) == 2
    assert t.recent_crashes(10.5) == 1  # the crash at 0 left the window
    assert t.on_crash(10.5) == 2  # one old crash still counts
    assert t.on_crash(30) == 1  # a quiet period starts over


def test_zero_restarts_gives_up_at_the_first_crash_and_reset_forgets():
    t = RestartTracker(RestartPolicy(delay=1, delay_max=1, max_restarts=0, window=10))
    assert t.on_crash(0) is None
    t.reset()
    assert not t.gave_up and t.recent_crashes(0) == 0


def test_state_file_round_trip_is_atomic(tmp_path):
    d = str(tmp_path)
    doc = {"state": "running", "processes": [], "supervisor": {"pid": os.getpid()}}
    cs.write_state(d, doc)
    got = cs.read_state(d)
    assert got["state"] == "running" and got["version"] == cs.STATE_VERSION
    assert [n for n in os.listdir(d)] == [cs.STATE_FILE]  # no temporary left behind


def test_missing_or_damaged_state_file_is_a_one_line_error(tmp_path):
    try:
        cs.read_state(str(tmp_path))
        raise AssertionError("expected StateError")
    except cs.StateError as exc:
        assert "no cluster state at" in str(exc)
    (tmp_path / cs.STATE_FILE).write_text("{not json")
    try:
        cs.read_state(str(tmp_path))
        raise AssertionError("expected StateError")
    except cs.StateError as exc:
        assert "cannot read cluster state" in str(exc)


def test_pid_alive_checks_identity_not_just_the_number():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        ct = cs.process_identity(p.pid)
        assert cs.pid_alive(p.pid, ct)
        assert not cs.pid_alive(p.pid, ct - 10)  # same number, another process
    finally:
        p.kill()
        p.wait()
    assert not cs.pid_alive(p.pid, ct)
    assert not cs.pid_alive(None, None)
