"""Flushes and compactions open their output tables before taking the DB mutex.

Opening a table reads its footer, index and filter index (~1.3 ms each here); the read
state built under the mutex used to open every output of a compaction itself, and a 1 GB
L0 -> L1 compaction (~250 outputs) held writers ~0.3 s (bench/results/db.md "Session 16: put
latency"). engine/background.py ``_open_outputs`` opens them first; on an error it closes
them and tries once more, and a second failure fails the job before its manifest edit
(tests/test_output_check.py)."""

from __future__ import annotations

import random
import threading

from engine import DB


def _recording_opens(db):
    """Record, per table opened, whether it was opened while publishing a read state (which
    runs under the DB mutex: ``DB._publish``'s contract) rather than before."""
    log = []
    inside = threading.local()
    ts = db._tables
    real_open = ts._open_table
    real_publish = db._publish

    def open_table(path, number):
        log.append((number, getattr(inside, "publishing", False)))
        return real_open(path, number)

    def publish():
        inside.publishing = True
        try:
            real_publish()
        finally:
            inside.publishing = False

    ts._open_table = open_table
    db._publish = publish  # an instance attribute: self._publish() finds it first
    return log


def _fill(db, n, seed=1):
    rng = random.Random(seed)
    for _ in range(n):
        db.put(rng.randbytes(16), rng.randbytes(100))


def test_flush_and_compaction_outputs_open_outside_the_mutex(tmp_path):
    with DB.open(tmp_path / "db", memtable_bytes=64 * 1024, l0_compaction_trigger=2,
                 target_file_size=16 * 1024, table_workers=0) as db:
        log = _recording_opens(db)
        _fill(db, 3000)
        db.flush()
        db.wait_for_compactions()
        st = db.stats()
        assert st["flushes"] >= 2 and st["compactions"] >= 1
        assert log, "no table was opened"
        under = [n for n, publishing in log if publishing]
        assert under == [], f"tables opened while publishing, under the DB mutex: {under}"
        _fill(db, 200, seed=2)  # the DB still reads and writes
        assert db.get(b"missing") is None


def test_an_output_that_fails_to_open_once_is_opened_by_the_second_try(tmp_path):
    with DB.open(tmp_path / "db", memtable_bytes=64 * 1024, table_workers=0,
                 disable_auto_compactions=True) as db:
        ts = db._tables
        real = ts._open_table
        failed = []

        def flaky(path, number):
            if not failed:
                failed.append(number)
                raise OSError("injected: first open fails")
            return real(path, number)

        ts._open_table = flaky
        db.put(b"k", b"v")
        db.flush()
        assert failed  # the early open failed, the second try opened it: the flush installed
        assert db.stats()["levels"][0]["tables"] == 1
        assert db.get(b"k") == b"v"
        assert failed[0] in ts.open_tables()


def test_outputs_opened_early_are_closed_when_the_manifest_edit_fails(tmp_path):
    """A flush whose manifest edit fails leaves none of its outputs open (a compaction
    retried after a full disk would otherwise keep another set open at every try)."""
    from engine.errors import StorageIOError

    db = DB.open(tmp_path / "db", memtable_bytes=64 * 1024, table_workers=0,
                 disable_auto_compactions=True)
    try:
        ts = db._tables
        opened = []
        real_open = ts._open_table

        def recording(path, number):
            opened.append(number)
            return real_open(path, number)

        ts._open_table = recording
        real_apply = db._manifest.log_and_apply

        def failing(edit):
            raise StorageIOError("injected: manifest write failed")

        db._manifest.log_and_apply = failing
        db.put(b"k", b"v")
        try:
            db.flush()
        except Exception:  # noqa: BLE001 - the DB reports the failure its own way
            pass
        db._manifest.log_and_apply = real_apply
        assert opened, "the flush's output was never opened early"
        assert not set(opened) & set(ts.open_tables()), "an unpublished output stayed open"
    finally:
        try:
            db.close()
        except Exception:  # noqa: BLE001 - a failed DB may refuse a clean close
            pass


def test_the_releaser_thread_survives_a_failing_close(tmp_path):
    """A close that raises in the table set's releaser thread is logged; the thread goes on
    closing the tables released after it (it used to end, and every later release stayed
    open until the DB closed)."""
    import os

    from engine.table_set import TableSet
    from engine.vfs import default_fs

    from .conftest import poll_until

    path = tmp_path / "db"
    with DB.open(path, table_workers=0, disable_auto_compactions=True) as db:
        for k in (b"a", b"b"):
            db.put(k, b"v")
            db.flush()
    numbers = sorted(int(f[:-4]) for f in os.listdir(path) if f.endswith(".sst"))
    assert len(numbers) == 2
    ts = TableSet(default_fs(), str(path))
    try:
        for n in numbers:
            ts.get(n)
            ts.ref([n])
        real_close = ts._close_table
        failed = []

        def close_table(t):
            if not failed:
                failed.append(t)
                raise OSError("injected: close failed")
            real_close(t)

        ts._close_table = close_table
        ts.release_later([numbers[0]])  # its close fails, in the releaser thread
        assert poll_until(lambda: failed, 10.0)
        ts.release_later([numbers[1]])
        assert poll_until(lambda: numbers[1] not in ts.open_tables(), 10.0), (
            "the releaser thread stopped after a failing close")
    finally:
        ts.close()


def test_stats_while_a_counter_dict_grows(tmp_path):
    """stats() copies the counters while background threads add keys to their dicts (a
    compaction's first reason): asdict() walked them in Python and raised "dictionary
    changed size during iteration" (seen once in test_model, session 16)."""
    with DB.open(tmp_path / "db", table_workers=0) as db:
        stop = threading.Event()

        def grow():
            i = 0
            while not stop.is_set():
                db.counters.compactions_by_reason[f"r{i}"] = i
                i += 1
                if i % 64 == 0:
                    db.counters.compactions_by_reason.clear()

        t = threading.Thread(target=grow)
        t.start()
        try:
            for _ in range(3000):
                db.stats()
        finally:
            stop.set()
            t.join()
