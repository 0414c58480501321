"""A memtable switch does its I/O with the DB mutex released (engine/db.py ``_switch_memtable``).

The switching thread is the group-commit leader: writers queue behind it (the unsynced fast
path needs an empty queue), close() waits for the queue, so nothing the switch reads changes
while the mutex is out. These tests park the switch's fsync of the old log (the HoldFS of
tests/test_review_session20d.py, a FaultInjectionFS) and check what may and may not happen
meanwhile: reads and stats() answer, writes wait their turn and keep their order, close()
waits for the switch and loses nothing.
"""

from __future__ import annotations

import threading

from engine import DB
from engine.errors import ClosedError

from .test_review_session20d import HoldFS


def _held_switch(tmp_path, **options):
    """A DB with one write in its memtable and a flush() parked in the switch's fsync of the
    old log. Returns (fs, db, hold, flusher thread)."""
    fs = HoldFS()
    db = DB.open(str(tmp_path / "db"), fs=fs, disable_auto_compactions=True, **options)
    db.put(b"a", b"1")
    h = fs.hold("sync", lambda p: p.endswith(".log"))

    def flush():
        try:
            db.flush()
        except ClosedError:  # a close() overlapped it: in flight, it may say so
            pass

    flusher = threading.Thread(target=flush, daemon=True)
    flusher.start()
    if not h.entered.wait(30):
        fs.release_all()
        flusher.join(30)
        db.close()
        raise AssertionError("the flush never reached the switch's fsync of the old log")
    return fs, db, h, flusher


def test_reads_and_mutex_users_answer_while_a_switch_fsyncs(tmp_path):
    fs, db, h, flusher = _held_switch(tmp_path)
    try:
        out = []
        # wait_for_compactions takes the DB mutex, as the flush and compaction threads do.
        t = threading.Thread(target=lambda: out.append(
            (db.get(b"a"), db.stats()["memtable"], db.wait_for_compactions(timeout=0.05))))
        t.start()
        t.join(10)
        assert not t.is_alive(), "a call waited for the switch's fsync on the DB mutex"
        assert out[0][0] == b"1"
    finally:
        fs.release_all()
        flusher.join(10)
        db.close()


def test_writes_queued_behind_a_switch_keep_their_order_and_survive(tmp_path):
    fs, db, h, flusher = _held_switch(tmp_path)
    done = threading.Event()

    def writer(sync):
        for i in range(200):
            db.put(b"seq-%d" % sync, b"%d" % i, sync=sync)
            db.put(b"k-%d-%03d" % (sync, i), b"v", sync=sync)
        done.set()

    threads = [threading.Thread(target=writer, args=(s,), daemon=True) for s in (False, True)]
    try:
        for t in threads:
            t.start()
        assert not done.wait(0.3), "a write finished while the leader's switch was parked"
        assert db.get(b"seq-0") is None and db.get(b"seq-1") is None
    finally:
        fs.release_all()
        flusher.join(10)
        for t in threads:
            t.join(60)
        if not flusher.is_alive() and not any(t.is_alive() for t in threads):
            db.close()  # (else the assert below reports the hang; close would wait for it)
    assert not flusher.is_alive() and not any(t.is_alive() for t in threads)
    with DB.open(str(tmp_path / "db")) as db2:
        assert db2.get(b"a") == b"1"
        for s in (0, 1):
            assert db2.get(b"seq-%d" % s) == b"199"
            assert all(db2.get(b"k-%d-%03d" % (s, i)) == b"v" for i in range(200))


def test_close_waits_for_a_switch_in_progress_and_loses_nothing(tmp_path):
    fs, db, h, flusher = _held_switch(tmp_path)
    closer = threading.Thread(target=db.close)
    try:
        closer.start()
        closer.join(0.3)
        assert closer.is_alive(), "close() returned while the switch was still writing"
    finally:
        fs.release_all()
        flusher.join(10)
        closer.join(10)
    assert not closer.is_alive()
    fs.crash()  # a power loss after close: everything acknowledged was synced
    with DB.open(str(tmp_path / "db")) as db2:
        assert db2.get(b"a") == b"1"
