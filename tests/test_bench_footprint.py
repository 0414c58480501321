"""bench/shard_footprint.py runs end to end at a tiny size and prints its report.

A bench, not a test of memory: nothing here looks at a figure's size or at a time. It checks
that the script starts a real shard, writes and reads through it (every answer checked by
the script) with memtables small enough that flushes run, prints each line of its report,
and stops the shard; the test kills the shard itself if the script left it running.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "bench", "shard_footprint.py")


def test_footprint_bench_runs_end_to_end(tmp_path):
    argv = [sys.executable, SCRIPT, "--keys", "3000", "--batch", "500", "--gets", "50",
            "--multigets", "5", "--engine-option", "memtable_bytes=65536",
            "--out", str(tmp_path / "run")]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    out = ""
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            out += proc.communicate()[0] or ""
        m = re.search(r"^shard pid (\d+) ", out, re.M)
        if m and psutil.pid_exists(int(m.group(1))):
            try:  # the script's own cleanup failed: stop the shard's group here
                os.killpg(int(m.group(1)), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert proc.returncode == 0, out
    assert m, out
    for line in ("every answer checked", "run peak", "run final", "shard at start",
                 "largest table worker seen", "tables:", "engine accounts:",
                 "deploy/README formula before session 14:", "measured / formula, anonymous",
                 "measured / formula, rss less table pages", "deploy/README now: settled shard",
                 "shard stopped: exit code 0"):
        assert line in out, f"{line!r} missing from:\n{out}"
    # 3000 entries of ~356 accounted bytes fill several 64 KiB memtables: flushes ran (in a
    # table worker, unless the engine code on disk changed under the shard: then in its threads)
    tables = re.search(r"^tables: .* ([\d,]+) entries", out, re.M)
    assert tables and int(tables.group(1).replace(",", "")) > 0, out
    assert re.search(r"^run peak(\s+[\d.]+){7}\s+[0-2]$", out, re.M), out
    # the formula uses the options given: 3 x 64 KiB of memtables
    assert "memtables 0.2 +" in out, out
