"""A SIGTERM to the pytest process runs the teardown of every fixture, as Ctrl-C does.

Python's default action for SIGTERM ends the process at once, so a test run stopped by a CI
timeout or ``kill`` left behind what its fixtures would have stopped: the ``cluster start``
daemons of the CLI tests (detached by design; their fixtures run ``cluster stop``) and any
process a fixture started without ``--exit-with-parent``. :func:`install` turns the first
SIGTERM into KeyboardInterrupt, which pytest answers by tearing down every fixture set up so
far and exiting 2; later SIGTERMs are ignored so that they cannot cut that teardown short
(SIGKILL still ends it). A process forked from the test process without exec gets the default
action back, so a test's forked child still dies of SIGTERM.
"""

from __future__ import annotations

import os
import signal


def install() -> None:
    """Make the first SIGTERM to this process a KeyboardInterrupt. Main thread only."""
    owner = os.getpid()

    def on_sigterm(signum, frame):
        if os.getpid() != owner:  # a fork of the test process: die as SIGTERM means
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # let the teardown finish
        raise KeyboardInterrupt("SIGTERM: tearing down the fixtures")

    signal.signal(signal.SIGTERM, on_sigterm)
