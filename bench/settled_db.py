"""The 1M-key DB that bench/verify_speed.py and bench/checkpoint_speed.py measure: --keys random
16-byte keys with 100-byte values (seeded, so every run builds the same data), settled by a
flush and a full compaction."""

from __future__ import annotations

import random
import time

import engine

MiB = 1 << 20


def fill_settled(path: str, keys: int, **options) -> float:
    """Build the DB at ``path`` (``options`` for ``engine.DB.open``); returns the seconds taken."""
    rng = random.Random(1)
    t0 = time.perf_counter()
    with engine.DB.open(path, memtable_bytes=64 * MiB, **options) as db:
        for _ in range(keys):
            db.put(rng.randbytes(16), rng.randbytes(100))
        db.flush()
        db.compact()
    return time.perf_counter() - t0
