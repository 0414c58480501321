"""A write batch becomes visible to readers all at once.

``DB.write`` is atomic across a crash (one log record); it must be for readers too. Readers take
no lock (DB.get, DB.multi_get read the memtable's dict directly), so the memtable applies a
batch with one ``dict.update`` (engine/memtable.py ``add``): a C call that runs no Python code
for bytes keys and values, so no other thread runs in the middle of it. Before, it stored the
entries one by one, and a reader could see the first keys of a batch written and the last ones
not yet: reading them in order, a newer value and then an older one.

The check: a writer writes batches ``{k0..k49: i}`` for increasing ``i``; readers read the keys
in the batch's order and must never see a value older than one they already saw in the same
read. (Gets one after another may see older values first and newer ones later: each get is
its own read.) A short switch interval makes the interpreter switch threads often enough that
the old code failed within a few hundred batches.

A multi_get is one read (session 18): it must see every key of the same batch. It read key
after key until then, and saw two batches in ~3% of its reads here.
"""

from __future__ import annotations

import sys
import threading

from engine import DB

KEYS = [b"k%02d" % j for j in range(50)]


def _value(i: int) -> bytes:
    return b"%08d" % i


def _check_reads(read, stop: threading.Event, seen_bad: list, one_batch: bool = False) -> None:
    while not stop.is_set():
        got = read()
        values = [int(v) if v is not None else -1 for v in got]
        for a, b in zip(values, values[1:]):
            if b < a or (one_batch and b != a):
                seen_bad.append(values)
                stop.set()
                return


def _run(tmp_path, read_with, batches: int = 3000, one_batch: bool = False, **options) -> list:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with DB.open(tmp_path / "db", table_workers=0, **options) as db:
            stop = threading.Event()
            bad: list = []
            readers = [threading.Thread(target=_check_reads,
                                        args=(read_with(db), stop, bad, one_batch))
                       for _ in range(2)]
            for t in readers:
                t.start()
            last = None
            try:
                for i in range(batches):
                    if stop.is_set():
                        break
                    db.write([(k, _value(i)) for k in KEYS])
                    last = i
            finally:
                stop.set()
                for t in readers:
                    t.join()
            assert [int(v) for v in db.multi_get(KEYS)] == [last] * len(KEYS)
            return bad
    finally:
        sys.setswitchinterval(old)


def test_multi_get_never_sees_half_a_batch(tmp_path):
    bad = _run(tmp_path, lambda db: lambda: db.multi_get(KEYS))
    assert not bad, f"a read saw a batch half applied: {bad[0]}"


def test_gets_in_order_never_see_half_a_batch(tmp_path):
    bad = _run(tmp_path, lambda db: lambda: [db.get(k) for k in KEYS])
    assert not bad, f"reads saw a batch half applied: {bad[0]}"


def test_across_memtable_switches_and_flushes(tmp_path):
    """Small memtables: batches land in successive memtables, which are frozen and flushed
    while the readers read."""
    bad = _run(tmp_path, lambda db: lambda: db.multi_get(KEYS), batches=2000,
               memtable_bytes=64 * 1024)
    assert not bad, f"a read saw a batch half applied: {bad[0]}"


def test_multi_get_reads_one_batch(tmp_path):
    """Every value a multi_get returns comes from the same batch: a point-in-time read."""
    bad = _run(tmp_path, lambda db: lambda: db.multi_get(KEYS), one_batch=True)
    assert not bad, f"a multi_get saw two batches: {bad[0]}"


def test_multi_get_reads_one_batch_across_memtable_switches(tmp_path):
    bad = _run(tmp_path, lambda db: lambda: db.multi_get(KEYS), batches=2000, one_batch=True,
               memtable_bytes=64 * 1024)
    assert not bad, f"a multi_get saw two batches: {bad[0]}"
