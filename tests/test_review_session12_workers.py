"""Session 12 review of the table worker protocol (f07d0ef CODE_FINGERPRINT handshake, 4e7c9f1
columns sent out of band, 992be59 disabled in stats). Each finding was a strict xfail stating the
bug, now fixed; real worker processes, no timing."""

import json
import os
import py_compile
import shutil
import subprocess
import sys

import engine
from engine.table_workers import WorkerPool


def job_engine_file():
    """Which engine package the worker runs (a job, run in the worker)."""
    return os.path.abspath(sys.modules["engine"].__file__)


# Fixed in session 12; was a strict xfail: (
#   "engine/table_workers.py _spawn_one starts the worker with `python -c`, which puts the "
#   "working directory ('') before PYTHONPATH on sys.path: a process whose cwd holds another "
#   "`engine` package (e.g. `sievekv serve` run from inside another checkout) gets workers that "
#   "import that one; the fingerprint refuses them, and the pool is disabled for good with the "
#   "false reason 'the engine code on disk changed since this process started' (nothing "
#   "changed; a restart does not help): the worker should import its owner's package"))
def test_a_worker_imports_its_owners_engine_not_one_in_the_working_directory(tmp_path,
                                                                             monkeypatch):
    other = tmp_path / "engine"  # another checkout's (older) engine, in the cwd
    shutil.copytree(os.path.dirname(engine.__file__), other,
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(other / "memtable.py", "a") as f:
        f.write("\n# another version\n")
    monkeypatch.chdir(tmp_path)
    pool = WorkerPool(1, spawn_retry_s=0.0)
    try:
        assert pool.call("owner", job_engine_file) == os.path.abspath(engine.__file__)
        assert pool.disabled is None
    finally:
        pool.close()


_SOURCELESS_CHILD = r"""
import json, logging, os, sys
logging.basicConfig(level=logging.WARNING, format="%(name)s %(message)s")
from engine import DB
db = DB.open(sys.argv[1], table_workers=1, disable_auto_compactions=True)
db.put(b"a", b"1")
# The package on disk is upgraded under the running process: memtable.pyc is replaced by
# another version's.
target = os.path.join(os.path.dirname(sys.modules["engine"].__file__), "memtable.pyc")
os.replace(sys.argv[2], target)
db.put(b"b", b"2")
db.flush()
print(json.dumps({"tw": db.stats()["table_workers"], "file": sys.modules["engine"].__file__}))
db.close()
"""


# Fixed in session 12; was a strict xfail: (
#   "engine/table_workers.py code_fingerprint hashes only *.py files found by os.walk: for an "
#   "engine installed without sources (compileall -b, .pyc only) or imported from a zip "
#   "(zipimport: os.walk of a path inside the zip yields nothing) CODE_FINGERPRINT is the same "
#   "constant for every version, so an upgrade in place is never refused and a new worker runs "
#   "the new code on jobs sent in the old code's terms (the module docstring promises 'the same "
#   "engine code as its owner, or none')"))
def test_an_engine_installed_without_sources_upgraded_in_place_is_refused(tmp_path):
    src = os.path.dirname(engine.__file__)
    pkg = tmp_path / "pkg" / "engine"
    shutil.copytree(src, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    for root, _dirs, files in os.walk(pkg):  # a sourceless install: .pyc beside, no .py
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                py_compile.compile(path, cfile=path + "c", doraise=True)
                os.remove(path)
    newer = tmp_path / "memtable_v2.py"  # the next version's memtable, compiled
    with open(os.path.join(src, "memtable.py")) as f:
        newer.write_text(f.read() + "\n# the next version\n")
    py_compile.compile(str(newer), cfile=str(tmp_path / "memtable_v2.pyc"), doraise=True)
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "pkg"))
    r = subprocess.run([sys.executable, "-c", _SOURCELESS_CHILD, str(tmp_path / "db"),
                        str(tmp_path / "memtable_v2.pyc")],
                       capture_output=True, text=True, env=env, timeout=300, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["file"].startswith(str(pkg)) and out["file"].endswith(".pyc"), out
    tw_stats = out["tw"]
    assert tw_stats["fallbacks_no_worker"] == 1 and tw_stats["jobs_in_process"] == 0, out
    assert tw_stats["disabled"], out
