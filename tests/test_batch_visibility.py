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

A multi_get and a scan are each one read (session 18): each must see every key of the same
batch. Until then a multi_get read key after key, and saw two batches in ~3% of its reads; a
scan copied the memtable in chunks, each as it was at that moment.
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


def test_scan_reads_one_batch(tmp_path):
    """A scan is a point-in-time read: every value it returns comes from the same batch,
    though the memtable is copied in chunks (16 entries first) while batches are written."""
    bad = _run(tmp_path, lambda db: lambda: [v for _k, v in db.scan()], one_batch=True)
    assert not bad, f"a scan saw two batches: {bad[0]}"


def test_scan_reads_one_batch_across_memtable_switches(tmp_path):
    bad = _run(tmp_path, lambda db: lambda: [v for _k, v in db.scan()], batches=2000,
               one_batch=True, memtable_bytes=64 * 1024)
    assert not bad, f"a scan saw two batches: {bad[0]}"


def test_a_scan_sees_a_moved_token_once(tmp_path):
    """A batch that moves a token from one key to another (the old key set back to "-", the
    new one to the token) is seen whole by a scan: exactly one key holds it, whichever way
    the two keys lie from the scan's cursor."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with DB.open(tmp_path / "db", table_workers=0) as db:
            names = [b"t%03d" % j for j in range(200)]
            db.write([(k, b"-") for k in names])
            db.put(names[0], b"token")
            stop = threading.Event()
            seen: list = []

            def scanner():
                while not stop.is_set():
                    holders = [k for k, v in db.scan() if v == b"token"]
                    if len(holders) != 1:
                        seen.append(holders)
                        stop.set()

            threads = [threading.Thread(target=scanner) for _ in range(2)]
            for t in threads:
                t.start()
            try:
                at = 0
                for _ in range(3000):
                    if stop.is_set():
                        break
                    to = (at + 97) % len(names)  # back and forth across the whole range
                    db.write([(names[at], b"-"), (names[to], b"token")])
                    at = to
            finally:
                stop.set()
                for t in threads:
                    t.join()
            assert not seen, f"a scan saw the token at {seen[0]}"
            assert [k for k, v in db.scan() if v == b"token"] == [names[at]]
    finally:
        sys.setswitchinterval(old)
