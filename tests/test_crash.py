"""Crash tests with real processes: a child makes synced writes and prints each
acknowledgement; the parent kills it with SIGKILL at a random moment, reopens the DB, and
checks that every acknowledged write is there and no batch is half-applied. Several rounds
on the same directory (crash, recover, crash again)."""

import os
import random
import signal
import subprocess
import sys
import time

from engine import DB

CHILD = r"""
import sys
from engine import DB
path, start = sys.argv[1], int(sys.argv[2])
db = DB.open(path, sync=True, memtable_bytes=8192, target_file_size=4096,
             max_bytes_for_level_base=16384, block_size=512)
print("READY", flush=True)
i = start
while True:
    if i % 3 == 0:
        db.write([(b"b%06d-%d" % (i, j), b"batch%d" % i) for j in range(4)]
                 + [(b"p%06d" % (i - 1), None)])  # also deletes the single put just before
        print("B", i, flush=True)
    else:
        db.put(b"p%06d" % i, b"v%d" % i * 5)
        print("P", i, flush=True)
    db.put(b"counter", b"%d" % i)
    print("C", i, flush=True)
    i += 1
"""

OPTS = dict(memtable_bytes=8192, target_file_size=4096, max_bytes_for_level_base=16384,
            block_size=512)


def _run_child(path, start, run_for, rnd):
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(start)],
                         stdout=subprocess.PIPE, env=env, text=True)
    assert p.stdout.readline().strip() == "READY"
    time.sleep(run_for * rnd.random())
    os.kill(p.pid, signal.SIGKILL)
    out = p.stdout.read()
    p.wait()
    # Only complete lines count: the last piece may be cut by the kill ("C 12" of "C 1234").
    return [line.split() for line in out.split("\n")[:-1]]


def _check(db, acks, start, batches_state):
    last = start - 1
    for kind, i in ((a, int(b)) for a, b in acks):
        last = max(last, i)
        if kind == "P":
            # The next batch (i + 1) deletes this key; an acknowledged batch must have.
            deleted_by = i + 1
            if deleted_by % 3 == 0 and ["B", str(deleted_by)] in acks:
                assert db.get(b"p%06d" % i) is None, i
            elif deleted_by % 3 == 0:  # the batch may have applied without being acknowledged
                assert db.get(b"p%06d" % i) in (None, b"v%d" % i * 5), i
            else:
                assert db.get(b"p%06d" % i) == b"v%d" % i * 5, i
        elif kind == "B":
            for j in range(4):
                assert db.get(b"b%06d-%d" % (i, j)) == b"batch%d" % i, (i, j)
    # No batch is half-applied, acknowledged or not.
    for i in range(start - (start % 3), last + 3, 3):
        got = [db.get(b"b%06d-%d" % (i, j)) for j in range(4)]
        assert got == [None] * 4 or got == [b"batch%d" % i] * 4, (i, got)
        if got[0] is not None and i - 1 >= start:
            assert db.get(b"p%06d" % (i - 1)) is None, ("batch applied without its delete", i)
    # Nothing beyond the one operation in flight exists.
    assert db.get(b"p%06d" % (last + 2)) is None or (last + 2) % 3 == 0
    counter_acks = [int(i) for k, i in acks if k == "C"]
    if counter_acks:
        got = int(db.get(b"counter"))
        assert got in (counter_acks[-1], counter_acks[-1] + 1)
    return last


def test_sigkill_loses_no_acknowledged_write(tmp_path):
    rnd = random.Random(1234)
    path = tmp_path / "db"
    start = 1
    total_acks = 0
    for _round in range(4):
        acks = _run_child(path, start, run_for=1.5, rnd=rnd)
        with DB.open(path, **OPTS) as db:
            last = _check(db, [a for a in acks if len(a) == 2], start, None)
            assert db.stats()["failed"] is None
        total_acks += len(acks)
        start = last + 10
    assert total_acks > 20  # the child really wrote between kills
