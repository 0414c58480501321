"""A table that compaction removed is freed as soon as it is closed, without the cyclic GC.

A shard under steady load (bench/shard_memory.py, bench/results/soak.md "Session 9") kept every
table compaction had removed: Table -> PartitionedFilter -> owner (the Table) was a reference
cycle, so a closed table (its index keys, offsets, cache keys, filter index: ~350 small
objects) waited for a full collection, which a steady-state server runs only every many hours
(CPython runs one once the objects promoted since the last one reach 25% of all long-lived
objects). Anonymous RSS rose ~1 MiB/h with ~18k pymalloc blocks/h.
"""

from __future__ import annotations

import gc
import time
import weakref

from engine import DB

OPTIONS = dict(memtable_bytes=16384, target_file_size=16384, max_bytes_for_level_base=65536,
               filter_memory_cap=4096)


def _fill(db, round_: int) -> None:
    for i in range(600):
        db.put(b"key%06d" % i, b"v%d-%d" % (round_, i) * 8)
    db.flush()


def test_compacted_tables_are_freed_without_the_cyclic_gc(tmp_path):
    db = DB.open(str(tmp_path / "db"), **OPTIONS)
    gc.collect()
    gc.disable()
    try:
        _fill(db, 0)
        _fill(db, 1)
        for i in range(0, 600, 7):  # probe the filters: partitions fault in (cap hook on_fault)
            assert db.get(b"key%06d" % i) is not None
            db.get(b"nokey%06d" % i)
        old = {n: weakref.ref(t) for n, t in db._tables.open_tables().items()}
        assert old
        db.compact()
        _fill(db, 2)
        db.compact()
        deadline = time.monotonic() + 10
        while set(old) & set(db._tables.open_tables()) and time.monotonic() < deadline:
            time.sleep(0.01)  # the set's releaser thread closes the tables the compaction removed
        gone = set(old) - set(db._tables.open_tables())
        assert gone, "compaction removed no table"
        while any(old[n]() is not None for n in gone) and time.monotonic() < deadline:
            time.sleep(0.01)  # ... and drops them once closed
        alive = sorted(n for n in gone if old[n]() is not None)
        assert not alive, f"closed tables {alive} are still alive: a reference cycle holds them"
    finally:
        gc.enable()
        db.close()
