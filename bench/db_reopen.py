"""Reopen time and L0 growth in a crash loop, as engine/recovery.py handles the last log: a
small one is carried over to a new log (no L0 table), a large one is written to L0 once
(``CARRY_MAX_BYTES``). Baseline in the same run: carrying turned off (``CARRY_MAX_BYTES = 0``:
every replayed log goes to a table, as RocksDB and LevelDB do by default).

    python3 bench/db_reopen.py [--puts 1000,50000] [--rounds 4]

Each round opens the DB, writes --puts new keys and closes without a flush (the memtable is
left in the log, as a killed process leaves it); the next round's open replays it. Printed per
put count and policy: the seconds of each open after the first, and the L0 tables at the end
(background compaction is off, so the tables a restart writes stay countable).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import DB, recovery  # noqa: E402


def run(puts: int, rounds: int, carry_max: int) -> tuple[list[float], int]:
    saved = recovery.CARRY_MAX_BYTES
    recovery.CARRY_MAX_BYTES = carry_max
    d = tempfile.mkdtemp(prefix="sievekv-reopen-")
    try:
        times = []
        for r in range(rounds + 1):
            t0 = time.perf_counter()
            db = DB.open(d, table_workers=0, disable_auto_compactions=True)
            if r:
                times.append(time.perf_counter() - t0)
            for i in range(puts):
                db.put(b"key%08d" % (r * puts + i), b"v" * 100)
            db.close()  # no flush: the writes stay in the log
        db = DB.open(d, table_workers=0, disable_auto_compactions=True)
        l0 = db.stats()["levels"][0]["tables"]
        db.close()
        return times, l0
    finally:
        recovery.CARRY_MAX_BYTES = saved
        shutil.rmtree(d, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--puts", default="1000,50000")
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args()
    print(f"crash loop: {args.rounds} restarts, each writing --puts keys of 100 B and closing "
          f"without a flush; carry limit {recovery.CARRY_MAX_BYTES} bytes of memtable")
    print(f"{'puts':>7} {'policy':<22} {'open seconds, in order':<34} {'L0 at end':>9}")
    for n in (int(x) for x in args.puts.split(",")):
        for name, limit in (("default (carry small)", recovery.CARRY_MAX_BYTES),
                            ("always to L0", 0)):
            times, l0 = run(n, args.rounds, limit)
            print(f"{n:>7} {name:<22} {', '.join(f'{t:.3f}' for t in times):<34} {l0:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
