"""Review of 012a3bf ("sievekv load sends a batch again while shards are busy, up to
--busy-wait seconds") and 6e82032 ("Write stalls move out of db.py into
engine/write_stall.py").

Checked and holds (plain tests below, or by reading / a run of the CLI as a process):

- Sending a batch again is safe in every case ``_busy`` lets through. ``load`` sends puts
  only, batches in input order, the next batch only once the current one is applied
  everywhere, so applying a batch (or a shard's part of it) twice stores the same values.
  A shard answers RESOURCE_EXHAUSTED that is not about a size only for WriteStalledError
  (a follower that left the queue, or a leader whose prepare gave up: nothing logged), for
  a full disk met while making room or in the recoverable failed state (nothing logged), or
  for a failed log append (a torn record that recovery drops); a failed log *fsync* is
  ``retryable=False`` and so INTERNAL, never retried. The router's "write not sent to any
  shard" (slots) is UNAVAILABLE or DEADLINE_EXCEEDED, not retried.
- What is never retried (``_busy`` run over real ClientErrors): a size-limit
  RESOURCE_EXHAUSTED ("larger than max"), UNAVAILABLE, DEADLINE_EXCEEDED, and a
  PartialWriteError whose unapplied shards include any of those; a PartialWriteError whose
  only unapplied shards are busy is retried. An unreachable router stops ``load`` at once
  (exit 3, no busy line).
- Ctrl-C during the backoff sleep: exit 130, the records of the applied batches counted,
  the batch being retried named "may or may not be loaded" (true: an earlier try may have
  applied some shards' parts) and the line to resume from is its first line.
- ``--busy-wait`` nan and negative numbers exit 2 with one line, before anything is read or
  sent; 0 stops at the first busy answer (exit 7 when nothing was loaded, 4 after earlier
  batches, both as docs/cli.md says); the wait is per batch ("in a row").
- Progress: on a terminal the busy line is written whole over the rewritten progress line
  and ends it; the final "loaded N records (SIZE) in Ts, R records/s" follows a retry;
  ``--quiet`` leaves the busy lines out too (``_Progress.waiting``'s docstring says so).
- 6e82032 is a pure move: the six methods' source is identical to the parent's DB methods
  (compared with ast), every module-level name they use is imported in write_stall.py,
  db.py lost no import it still needs, ``DB.__mro__`` is (DB, Background, WriteStalls,
  object) and neither DB nor Background defines any of the six names, so every one
  resolves to WriteStalls. The only stale pointer is finding 5 (the review notes of
  sessions 5, 16 and 17c name ``_make_room_for_write`` where it was then: history).

Findings (strict xfails when written; all fixed in session 17, now plain tests):

1. After a retry, the failure report forgets what an earlier try applied. ``send()`` keeps
   only the last ClientError: a batch whose first try was applied by shard s0 and refused
   as busy by s1, and whose next try both refused as busy, stops with exit 7 and "the 0
   records before line 1 are loaded", without "shards s0 applied their part" — although
   s0 holds its 50 records. docs/cli.md: exit 4 "if anything was loaded", and the report
   "says which shards applied their part of the failed batch". The same happens when the
   last try fails otherwise (s0 DEADLINE_EXCEEDED: exit 3).
2. Without a terminal, repeated busy lines are dropped. ``waiting`` shows its line with
   ``final=True``, and StatusLine skips a final line equal to the last one shown: once the
   delay reaches 5 s every line is the same (the reason is cut at 200 characters before its
   varying timeout, finding 3; a full disk's message does not vary either), so a log shows
   0.5, 1, 2, 4 and one 5 s line and then nothing until the load ends or stops. Seen with
   the CLI as a process: ``--busy-wait 19`` waited six times and wrote five lines.
   docs/cli.md: "with a line on stderr each time".
3. The busy line cuts the reason at 200 characters, mid-word. ``details`` is the router's
   summary ("write failed on 1 of 1 shard(s) (applied on: none): shard s0 at HOST:PORT:
   ..."), so the shard's own reason loses its end: "... and it would wait past its timeout
   o); sending the batch again in 0.5s". docs/cli.md shows the line as
   "(write not applied: the DB holds writes (L0 holds 36 tables, ...))".
4. ``--busy-wait inf`` (or 1e400) is accepted and retries for ever; the check
   ``not busy_wait >= 0`` refuses only nan and negatives. docs/cli.md promises "at most
   --busy-wait seconds"; ``--timeout`` refuses anything over 1000000. Either refuse
   non-finite values (exit 2) or document inf as "no limit" (then drop this test).
5. engine/write_controller.py still says "(engine/db.py ``_slowdown_wait``)"; the method
   is in engine/write_stall.py now (line 33 of the same docstring was updated).

Noted, no test:

- A concurrent writer's value for a key of a batch that a shard applied and then gets again
  on a retry is overwritten a second time; ``load`` overwrites such keys anyway.
- ``trailers.fit`` clears per-shard messages of a cluster with dozens of failing shards;
  ``_busy`` then reads an empty message as busy, whatever it said (a size limit). Only a
  Write spanning 40-odd failing shards can meet it, and ``load`` keeps batches at 1 MiB.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading

from router.cli import data_cmds
from router.cluster_map import ClusterMap
from router.slots import SLOT_COUNT, slot_of
from shard.server import create_server

from .conftest import free_port, poll_until, start_router_process
from .test_load_busy import _cli, _input, _serve_stopped
from .test_review_session16 import _at_slowdown
from .test_write_timeout import _stopped

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIG = "x" * 2000  # 50 such records fill a 64 KiB memtable


@contextlib.contextmanager
def _room_once(path):
    """A DB with L0 at l0_stop_trigger (compactions held off) and an empty memtable: writes
    are taken until the memtable is full, then held (slowdowns off). Yields (db, release)."""
    with _at_slowdown(path, memtable_bytes=64 * 1024, l0_stop_trigger=2,
                      slowdown_sleep_s=0) as held:
        yield held


@contextlib.contextmanager
def _served(tmp_path, procs, dbs):
    """Each DB served in this process as shard s<i>, an even map, a router process."""
    servers, shards = [], []
    try:
        for i, db in enumerate(dbs):
            server, port = create_server(db, "127.0.0.1:0", name=f"s{i}")
            server.start()
            servers.append(server)
            shards.append((f"s{i}", f"127.0.0.1:{port}"))
        path = tmp_path / "cluster.toml"
        path.write_text(ClusterMap.even(shards).to_toml())
        yield start_router_process(procs, str(path))
    finally:
        for server in servers:
            server.stop(0)


def _keys_of(n_shards: int, shard: int, count: int) -> list[str]:
    keys, i = [], 0
    while len(keys) < count:
        key = b"key%06d" % i
        i += 1
        if slot_of(key) * n_shards // SLOT_COUNT == shard:
            keys.append(key.decode())
    return keys


def _load(router_address: str, path, *args: str, interrupt_when_busy: bool = False):
    """Run ``sievekv load`` as a process; (exit code, stderr lines). With
    ``interrupt_when_busy``, SIGINT once it says a shard is busy."""
    cli = _cli(router_address, "load", str(path), *args)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(cli.stderr), daemon=True)
    reader.start()
    try:
        if interrupt_when_busy:
            assert poll_until(lambda: any("a shard is busy" in ln for ln in lines), 60.0), lines
            cli.send_signal(signal.SIGINT)
        rc = cli.wait(120)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        reader.join(10)
    return rc, lines


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("SIEVEKV_ROUTER", None)
    env.pop("SIEVEKV_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "router.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


# -- holds ------------------------------------------------------------------------------------

def test_ctrl_c_during_the_backoff_names_the_batch_and_where_to_resume(procs, tmp_path):
    inp = tmp_path / "in.tsv"
    inp.write_text("".join(f"key{i:04d}\t{BIG}\n" for i in range(300)))
    with _room_once(tmp_path / "db") as (db, _release), _served(tmp_path, procs, [db]) as router:
        # Batch 1 fills the memtable; batch 2 is held, refused as busy, and waits to retry.
        rc, lines = _load(router.address, inp, "--batch", "100", "--timeout", "0.5",
                          interrupt_when_busy=True)
        assert rc == 130, lines
        assert lines[-1].strip() == (
            "sievekv: error: load interrupted: 100 records loaded, every record before input "
            "line 101; lines 101-200 were being sent and may or may not be loaded; resume "
            "from line 101")
        assert any(ln.startswith("loaded 100 records; a shard is busy") for ln in lines)
        assert all(db.get(b"key%04d" % i) is not None for i in range(100))


def test_busy_wait_refuses_nan_and_negatives_and_an_unreachable_router_is_not_waited_for(
        tmp_path):
    inp = tmp_path / "in.tsv"
    inp.write_text("a\tb\n")
    router = f"127.0.0.1:{free_port()}"  # nothing listens there
    for bad in ("nan", "-1"):
        r = _run_cli("load", str(inp), "--busy-wait", bad, "--router", router)
        assert r.returncode == 2 and r.stderr == (  # (the bound since session 17's fix)
            f"sievekv: error: --busy-wait: must be 0 to 1000000 seconds, got {bad}\n"), r.stderr
    r = _run_cli("load", str(inp), "--timeout", "2", "--router", router)
    assert r.returncode == 3, r.stderr
    assert "busy" not in r.stderr and r.stderr.count("\n") == 1


# -- findings ---------------------------------------------------------------------------------

# Fixed in session 17; was a strict xfail: a failure after a retry forgets the shards that
# applied their part in an earlier try: exit 7, 'the 0 records ... are loaded', no 'applied
# their part'
def test_a_failure_after_a_retry_names_the_shards_an_earlier_try_applied(procs, tmp_path):
    ka, kb = _keys_of(2, 0, 50), _keys_of(2, 1, 50)
    inp = tmp_path / "in.tsv"
    inp.write_text("".join(f"{k}\t{BIG}\n" for k in ka + kb))
    with _room_once(tmp_path / "a") as (a, _ra), _stopped(tmp_path / "b") as (b, _w, _rb), \
            _served(tmp_path, procs, [a, b]) as router:
        # Try 1: s0 applies its 50 records (its memtable is then full), s1 is busy.
        # Try 2, 0.5 s later: both busy; --busy-wait 1 is then spent.
        rc, lines = _load(router.address, inp, "--batch", "100", "--timeout", "0.5",
                          "--busy-wait", "1")
        assert "(applied on: s0)" in lines[0], lines
        assert all(a.get(k.encode()) == BIG.encode() for k in ka)  # loaded, on s0
        err = lines[-1]
        assert rc == 4, lines  # docs/cli.md: exit 4 if anything was loaded (is 7)
        assert "s0 applied their part" in err, err


# Fixed in session 17; was a strict xfail: without a terminal StatusLine drops a busy line equal
# to the last one: every retry after the first at 5 s goes unreported
def test_every_busy_retry_gets_its_line_without_a_terminal(capsys):
    progress = data_cmds._Progress(quiet=False)
    assert not progress.line.tty  # stderr is captured: as in a log or a pipe
    why = ("write failed on 1 of 1 shard(s) (applied on: none): shard s0 at 127.0.0.1:40000: "
           "write not applied: the DB holds writes (L0 holds 2 tables, at l0_stop_trigger "
           "(2)) and it would wait past its timeout o")  # as the CLI cuts it (finding 3)
    waited = 0.0
    for delay in (0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0):
        progress.waiting(0, why, delay, waited)  # (session 17 fix: the time waited so far)
        waited += delay
    err = capsys.readouterr().err
    assert err.count("a shard is busy") == 7, err


# Fixed in session 17; was a strict xfail: the busy line cuts the reason at 200 characters, mid-
# word ('its timeout o)')
def test_the_busy_line_shows_the_shards_reason_whole(procs, tmp_path):
    db, _release, router, stop = _serve_stopped(tmp_path, procs)
    try:
        rc, lines = _load(router.address, _input(tmp_path), "--batch", "100", "--timeout",
                          "0.5", "--busy-wait", "0.6")
        assert rc == 7, lines
        busy = next(ln for ln in lines if "a shard is busy" in ln)
        assert "write not applied" in busy and "L0 holds 2 tables" in busy
        reason = busy.split("); sending the batch again")[0]
        assert re.search(r"timeout of [0-9.]+ s", reason) or reason.endswith("..."), busy
    finally:
        stop()


# Fixed in session 17; was a strict xfail: --busy-wait inf (and 1e400) is accepted and retries
# for ever; --timeout refuses non-finite numbers
def test_busy_wait_refuses_a_number_that_is_not_finite(tmp_path):
    inp = tmp_path / "in.tsv"
    inp.write_text("a\tb\n")
    router = f"127.0.0.1:{free_port()}"  # unreachable: an accepted value exits 3 at once
    for value in ("inf", "1e400"):
        r = _run_cli("load", str(inp), "--busy-wait", value, "--timeout", "2", "--router",
                     router)
        assert r.returncode == 2 and "--busy-wait" in r.stderr, (value, r.stderr)


# "engine/<file>.py ``name``" in a docstring or comment of engine/.
_POINTER = re.compile(r"(engine/[\w/]+\.py) ``(\w+)``")


# Fixed in session 17; was a strict xfail: engine/write_controller.py points at engine/db.py
# ``_slowdown_wait``, moved to engine/write_stall.py
def test_every_pointer_in_engine_names_the_file_that_defines_it():
    stale = []
    for folder, _dirs, files in os.walk(os.path.join(ROOT, "engine")):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path) as f:
                text = f.read()
            for m in _POINTER.finditer(text):
                with open(os.path.join(ROOT, m.group(1))) as f:
                    target = f.read()
                if not re.search(rf"^\s*(def|class) {m.group(2)}\b|^\s*{m.group(2)}\s*[:=]",
                                 target, re.M):
                    stale.append((os.path.relpath(path, ROOT), m.group(1), m.group(2)))
    assert stale == [], stale
