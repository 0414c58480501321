"""The CLI's readers work on descriptors numbered 1024 and up.

``select.select`` refuses them ("filedescriptor out of range"), and a process reaches them
easily: an engine raises its open-file limit for its tables (engine/open_files.py), and a test
run once held 1,300 files. `cluster start` then failed while reading the supervisor's events
(session 15). router/cli/lifecycle.py and router/supervisor.py poll instead.
"""

from __future__ import annotations

import os
import resource
import time

import pytest

from router.cli.lifecycle import _events


@pytest.fixture
def high_fd():
    """A pipe's read end moved to descriptor 1500, and its write end; both closed after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1600:
        if hard != resource.RLIM_INFINITY and hard < 1600:
            pytest.skip(f"the hard open-file limit ({hard}) is below 1600")
        resource.setrlimit(resource.RLIMIT_NOFILE, (1600, hard))
    r, w = os.pipe()
    fd = os.dup2(r, 1500)
    os.close(r)
    try:
        yield fd, w
    finally:
        for d in (fd, w):
            try:
                os.close(d)
            except OSError:
                pass
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_supervisor_events_are_read_from_a_descriptor_past_1023(high_fd):
    fd, w = high_fd
    os.write(w, b'{"event": "up", "n": 1}\n{"event": "ready"}\n')
    os.close(w)
    assert list(_events(fd, time.monotonic() + 10)) == [{"event": "up", "n": 1},
                                                        {"event": "ready"}]
