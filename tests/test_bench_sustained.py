"""bench/sustained_fill.py runs end to end at a tiny size and prints its report.

A bench, not a test of speed: nothing here looks at a rate or a time. It checks that the
script fills a real engine.DB in a child process with memtables small enough that flushes and
compactions run, samples windows, drains, reads a sample of keys back (the script exits
non-zero on a wrong value), and prints each line of its report; and that a bad command line
gets one readable line and exit code 2, not a traceback.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "bench", "sustained_fill.py")


def _run(*argv, timeout=120):
    return subprocess.run([sys.executable, SCRIPT, *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def test_sustained_fill_runs_end_to_end(tmp_path):
    # 20,000 entries of 292 accounted bytes fill ~22 memtables of 256 KiB: L0 passes its
    # compaction trigger, so flushes and compactions both run during the puts or the drain.
    proc = _run("--keys", "20000", "--window", "0.5", "--engines", "sievekv",
                "--engine-option", "memtable_bytes=262144", "--dir", str(tmp_path),
                "--json", str(tmp_path / "out.json"))
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    for line in ("sustained_fill: 20,000 puts", "sievekv: engine defaults + memtable_bytes=262144",
                 "load average (1/5/15 min): sievekv before", "sievekv per window",
                 "RSS MiB  compaction running",
                 "puts/s, whole run", "puts/s, last half (sustained)", "puts/s, with the drain",
                 "seconds: drain after the last put", "write stall seconds", "flushes",
                 "compactions", "MiB written: flushes", "MiB written: compactions",
                 "write amplification *", "peak RSS MiB **", "CPU s: puts + drain ***",
                 "2,000 sampled keys read back right"):
        assert line in out, f"{line!r} missing from:\n{out}"
    assert "rocksdb" not in out.split("sievekv per window")[1], out  # one engine only
    rows = re.findall(r"^\s+[\d.]+\s+[\d.]+ (put|drain)\s", out, re.M)
    assert rows and rows[-1] == "drain", out  # the last row ends with the drain
    flushes = int(re.search(r"^flushes\s+(\d+)", out, re.M).group(1))
    compactions = int(re.search(r"^compactions\s+(\d+)", out, re.M).group(1))
    wa = float(re.search(r"^write amplification \*\s+([\d.]+)", out, re.M).group(1))
    assert flushes >= 10 and compactions >= 1, out
    assert wa >= 1.0, out  # every byte put was written at least once by a flush
    assert (tmp_path / "out.json").exists()
    assert os.listdir(tmp_path) == ["out.json"], os.listdir(tmp_path)  # the DBs are removed


def test_sustained_fill_bad_arguments_exit_2():
    for argv, msg in ((["--engines", "sievekv,foo"], "--engines: expected"),
                      (["--engine-option", "memtable_bytes=abc"], "expected int"),
                      (["--engine-option", "no_such=1"], "no such engine option"),
                      (["--engine-option", "memtable_bytes=5"], "memtable_bytes must be >= 1024"),
                      (["--keys", "1"], "--keys must be at least 2")):
        proc = _run(*argv, timeout=60)
        assert proc.returncode == 2, (argv, proc.stderr)
        assert msg in proc.stderr and "Traceback" not in proc.stderr, (argv, proc.stderr)
