"""A DB that is killed again and again must not degrade, and must bring itself back into shape
when it reopens.

Real processes: each child opens the DB, makes synced writes, prints each acknowledgement and
SIGKILLs itself (a crash loop whose processes die before their background work finishes).

- Restarts alone add no L0 table: recovery keeps the last log's writes in the memtable and
  appends to that log (it used to write them to a new L0 table at every open, so L0 grew by one
  table per crash and, with processes dying before the compaction scheduled at open could
  finish, past the compaction trigger).
- The reuse is refused where it would be wrong: a log with a torn tail (appending after it would
  make corruption before the tail) and a log holding a full memtable get a new log; logs older
  than the last are written to tables, older data first.
- A DB that opens with L0 at or past the compaction trigger compacts it without being written
  to (the compaction thread checks the recovered version before it first waits).
- A DB that opens with L0 past the stop trigger does not block a writer forever: that
  compaction unblocks it.

Convergence is awaited with a deadline-bounded poll of db.stats() (a liveness bound, not a
speed assertion).
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import engine
from engine import DB, filenames, recovery
from engine.filenames import FileKind, list_files
from engine.format import KIND_VALUE
from engine.vfs import FileSystem
from engine.wal import LogWriter, encode_batch

CHILD = r"""
import json, os, signal, sys
from engine import DB
path, rnd, n, opts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
flush_every = opts.pop("flush_every", 0)
db = DB.open(path, sync=True, **opts)
for i in range(n):
    db.put(b"r%03d-%05d" % (rnd, i), b"v%d-%d" % (rnd, i))
    db.put(b"shared-%02d" % (i % 10), b"s%d-%d" % (rnd, i))
    print(i, flush=True)
    if flush_every and (i + 1) % flush_every == 0:
        db.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEADLINE_S = 120.0  # liveness bound for background work on a loaded 2-core machine


def _crash_rounds(path, rounds: int, n: int, model: dict, first_round: int = 0, **opts) -> None:
    """Run ``rounds`` children, each killed (SIGKILL) after ``n`` acknowledged iterations;
    record every acknowledged write in ``model``."""
    env = dict(os.environ, PYTHONPATH=REPO)
    for rnd in range(first_round, first_round + rounds):
        p = subprocess.run([sys.executable, "-c", CHILD, str(path), str(rnd), str(n),
                            json.dumps(opts)], capture_output=True, text=True, env=env)
        assert p.returncode == -signal.SIGKILL, p.stderr
        # Only complete lines are acknowledgements.
        for line in p.stdout.split("\n")[:-1]:
            i = int(line)
            model[b"r%03d-%05d" % (rnd, i)] = b"v%d-%d" % (rnd, i)
            model[b"shared-%02d" % (i % 10)] = b"s%d-%d" % (rnd, i)
        assert len(p.stdout.split("\n")[:-1]) == n  # every write was acknowledged


def _check_model(db, model: dict) -> None:
    got = db.multi_get(list(model))
    bad = [(k, v, g) for (k, v), g in zip(model.items(), got) if g != v]
    assert not bad, bad[:5]
    assert dict(db.scan()) == model


def _l0(db) -> int:
    return db.stats()["levels"][0]["tables"]


def _in_shape(db, trigger: int) -> bool:
    """L0 below the compaction trigger and every sized level within its target."""
    st = db.stats()
    if st["failed"] is not None:
        raise AssertionError(f"DB failed: {st['failed']}")
    levels = st["levels"]
    return (levels[0]["tables"] < trigger
            and all(lv["bytes"] <= lv["target_bytes"] for lv in levels
                    if lv["target_bytes"] is not None))


def _wait_until(pred, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not pred():
        assert time.monotonic() < deadline, f"not reached within {DEADLINE_S} s: {what}"
        time.sleep(0.02)


def _logs(path) -> list[int]:
    return sorted(n for k, n, _ in list_files(engine.vfs.default_fs(), str(path))
                  if k is FileKind.LOG)


def test_crash_loop_adds_no_l0_table_per_restart(tmp_path):
    path = tmp_path / "db"
    model: dict = {}
    rounds = 6  # past the default l0_compaction_trigger (4)
    _crash_rounds(path, rounds, 20, model)
    # Look at what the crash loop left without letting this open compact anything.
    with DB.open(path, disable_auto_compactions=True) as db:
        st = db.stats()
        assert _l0(db) < db.options.l0_compaction_trigger, st["levels"][0]
        assert st["recovered_tables"] == 0
        assert st["recovered_entries"] == rounds * 20 * 2  # every write replayed from the log
        _check_model(db, model)
    assert len(_logs(path)) == 1  # the one log, appended to by every process


def test_reopen_after_crashes_compacts_a_piled_up_l0(tmp_path):
    path = tmp_path / "db"
    model: dict = {}
    # Each child flushes (so L0 grows by real memtables) and dies before any compaction.
    _crash_rounds(path, 6, 40, model, memtable_bytes=4096, disable_auto_compactions=True,
                  flush_every=20)
    with DB.open(path, disable_auto_compactions=True) as db:
        trigger = db.options.l0_compaction_trigger
        assert _l0(db) >= trigger  # the pile-up to recover from
        _check_model(db, model)
    # Reopened normally and not written to: the compaction scheduled at open fixes it.
    with DB.open(path, memtable_bytes=4096) as db:
        _wait_until(lambda: _in_shape(db, trigger), "L0 below the compaction trigger")
        assert db.stats()["compactions"] >= 1
        _check_model(db, model)
    with DB.open(path) as db:  # and the compacted state is what the next open finds
        assert _l0(db) < trigger
        _check_model(db, model)


def test_writer_is_unblocked_when_the_db_opens_past_the_stop_trigger(tmp_path):
    path = tmp_path / "db"
    model: dict = {}
    _crash_rounds(path, 5, 20, model, memtable_bytes=4096, disable_auto_compactions=True,
                  flush_every=10)
    stall = dict(memtable_bytes=1024, max_frozen_memtables=1, l0_compaction_trigger=2,
                 l0_slowdown_trigger=3, l0_stop_trigger=4)
    with DB.open(path, disable_auto_compactions=True, **stall) as db:
        assert _l0(db) >= 2 * stall["l0_stop_trigger"]
    with DB.open(path, **stall) as db:
        done = threading.Event()
        errors = []

        def writer():
            try:
                # Several memtables' worth: without a compaction the writer would wait at the
                # stop trigger for ever.
                for i in range(300):
                    k = b"w%05d" % i
                    db.put(k, b"x" * 40)
                    model[k] = b"x" * 40
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
            finally:
                done.set()

        t = threading.Thread(target=writer, daemon=True)
        t.start()
        assert done.wait(DEADLINE_S), f"writer still blocked: {db.stats()['write_stall']}"
        assert not errors, errors
        _wait_until(lambda: _in_shape(db, stall["l0_compaction_trigger"]), "compaction")
        _check_model(db, model)


def test_last_log_with_a_torn_tail_is_carried_over_without_its_tail(tmp_path):
    path = tmp_path / "db"
    with DB.open(path) as db:
        db.put(b"a", b"1")
    [old] = _logs(path)
    with open(filenames.log_file_name(str(path), old), "ab") as f:
        f.write(b"\x01\x02\x03")  # what a crash in the middle of an append leaves
    with DB.open(path) as db:
        assert db.get(b"a") == b"1"
        assert db.stats()["recovered_tables"] == 0  # the clean prefix went to the new log
        [new] = _logs(path)
        assert new > old
        db.put(b"b", b"2", sync=True)
    with DB.open(path) as db:  # no "bad record followed by a valid record"
        assert dict(db.scan()) == {b"a": b"1", b"b": b"2"}


def test_last_log_holding_a_full_memtable_goes_to_a_table(tmp_path):
    path = tmp_path / "db"
    with DB.open(path, memtable_bytes=64 * 1024) as db:
        db.write([(b"k%04d" % i, b"v" * 20) for i in range(100)])  # ~4 KB in one log
    [old] = _logs(path)
    with DB.open(path, memtable_bytes=1024, disable_auto_compactions=True) as db:
        assert db.stats()["recovered_tables"] == 1 and _l0(db) == 1
        assert _logs(path)[-1] > old
        assert db.get(b"k0042") == b"v" * 20


def test_older_logs_go_to_tables_and_the_last_one_is_carried_over(tmp_path):
    """What a crash between a memtable switch and its flush leaves: two logs, the older one
    with older values of the same keys."""
    path = tmp_path / "db"
    with DB.open(path) as db:
        db.write([(b"k%02d" % i, b"old") for i in range(10)])
        seq = db.stats()["last_sequence"]
    [first] = _logs(path)
    second = first + 100  # a higher number, as the switch would have used
    w = LogWriter(FileSystem().open_writable(filenames.log_file_name(str(path), second)))
    w.add_record(encode_batch(seq + 1, [(KIND_VALUE, b"k%02d" % i, b"new") for i in range(5)]))
    w.sync()
    w.close()
    last = second
    for _ in range(2):  # the second open carries the new log over again and adds no table
        with DB.open(path, disable_auto_compactions=True) as db:
            [now] = _logs(path)
            assert now > last
            last = now
            assert _l0(db) == 1  # the first log's writes
            want = {b"k%02d" % i: b"new" if i < 5 else b"old" for i in range(10)}
            _check_model(db, want)
            assert db.stats()["memtable"]["entries"] == 5
    with DB.open(path, disable_auto_compactions=True) as db:
        db.put(b"k09", b"newest")
        db.flush()  # the carried memtable goes to a table; its log is then removed
        [now] = _logs(path)
        assert now > last
        assert _l0(db) == 2
    with DB.open(path) as db:
        assert db.get(b"k00") == b"new" and db.get(b"k09") == b"newest"
        assert db.get(b"k07") == b"old"


def test_only_a_small_last_log_is_carried_over(tmp_path, monkeypatch):
    """A small last log (a crash loop's few writes) is carried over to the new log; a large one
    is written to a table once, so a DB closed with much unflushed data does not replay and
    copy it again at every open."""
    monkeypatch.setattr(recovery, "CARRY_MAX_BYTES", 8 * 1024)
    small, large = tmp_path / "small", tmp_path / "large"
    with DB.open(small) as db:
        db.write([(b"k%03d" % i, b"v" * 20) for i in range(20)])  # ~1 KB
    with DB.open(large) as db:
        db.write([(b"k%04d" % i, b"v" * 100) for i in range(200)])  # ~25 KB
    for _ in range(2):
        with DB.open(small, disable_auto_compactions=True) as db:
            assert db.stats()["recovered_tables"] == 0 and _l0(db) == 0
            assert db.get(b"k007") == b"v" * 20
    with DB.open(large, disable_auto_compactions=True) as db:
        assert db.stats()["recovered_tables"] == 1 and _l0(db) == 1
    with DB.open(large, disable_auto_compactions=True) as db:  # nothing left to replay
        assert db.stats()["recovered_entries"] == 0 and _l0(db) == 1
        assert db.get(b"k0123") == b"v" * 100
