"""Cost of ``cluster restore``'s slot check of every key (router/cli/restore_cmd.py
``check_every_slot``): keys/s of one scan of a settled shard, hashing each key.

    python3 bench/restore_slot_check.py [--keys 200000]

Builds bench/settled_db.py's DB (16-byte keys, 100-byte values, flushed and compacted) in a
temporary directory, opens it as restore's verify step does, and times the check (best of 3).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from settled_db import fill_settled  # noqa: E402

import engine  # noqa: E402
from router.cli import offline, restore_cmd  # noqa: E402
from router.config import loads  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=200_000)
    args = ap.parse_args()
    cfg = loads("[shards]\ncount = 1\n")
    spec = cfg.shards[0]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "shard-0")
        fill_settled(path, args.keys, table_workers=0)
        best = None
        with engine.DB.open(path, **offline.engine_options(cfg)) as db:
            for _ in range(3):
                t0 = time.perf_counter()
                n = restore_cmd.check_every_slot(cfg, spec, db)
                dt = time.perf_counter() - t0
                best = dt if best is None else min(best, dt)
        print(f"{n} keys checked in {best:.3f} s (best of 3): {n / best:,.0f} keys/s")


if __name__ == "__main__":
    main()
