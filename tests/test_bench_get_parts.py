"""bench/get_parts.py runs end to end at a tiny size and prints every step of its report.

A bench, not a test of speed: nothing here looks at a time. The script reaches into Table's
internals (the filter, the index, the mapping) to time each step of a get alone; this test
fails when those change under it, instead of the bench breaking unseen.
"""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "bench", "get_parts.py")
STEPS = ("DB.get", "Table.get", "range", "partition", "probe", "index", "copy", "crc", "find",
         "find - crc")


def test_get_parts_bench_runs_end_to_end(tmp_path):
    r = subprocess.run([sys.executable, SCRIPT, "--keys", "20000", "--rounds", "1",
                        "--sample", "640", "--block-sizes", "2048", "--dir", str(tmp_path)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {line[:12].strip(): line[12:].split() for line in r.stdout.splitlines()}
    for step in STEPS:
        assert len(rows.get(step, ())) == 3, (step, r.stdout)  # cold, warm, cold - warm
    assert any(line.split()[:1] == ["2048"] for line in r.stdout.splitlines()), r.stdout
    assert os.listdir(tmp_path) == []  # its DBs removed
