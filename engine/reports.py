"""``DB.stats()`` and ``DB.filter_report()``: JSON-able views of one DB.

stats(): per level tables/bytes/entries; memtables and log; flushes, compactions and bytes
compacted; write-stall time; block cache hits/misses (scans, and gets when ``mmap_reads`` is
off); ``reads``: whether gets read mapped tables, how many tables are mapped now and how many
mappings the OS refused (those tables read with pread); gets and data blocks read per get.
``compaction_running``: None, or the compaction in progress (levels, whether manual, its
reason, input bytes, output bytes written so far, seconds): what ``sievekv compact`` shows as
progress. ``compactions_by_reason``, ``tombstone_compactions`` and ``tombstones_dropped``: what
the compactions since open were for (engine/compaction/picker.py) and the tombstones they
removed.

filter_report(): per level and per table the table's own filter accounting
(``Table.filter_stats``: bytes on disk, mapped, resident as measured by the OS, partitions,
probes, negatives, positives, true positives, errors) plus:

- ``expected_fpr``: the theoretical FPR of the policy the table was built with (its stored
  ``filter_policy``, not the one configured now) at the table's bits per key; 1.0 for a table
  without a filter or with a policy this build cannot decode (every probe may match);
- ``observed_fpr`` = FP / (FP + negatives), FP = positives - true positives: the fraction of
  probes for absent keys that the filter failed to reject (Table.filter_stats' definition;
  the same as (positives - TP) / (negatives + positives - TP));
- ``false_ratio`` = FP / (FP + TP) (Cassandra's "bloom filter false ratio": the share of
  "may match" answers that were wrong);
- totals per level and for the DB: the counts and bytes summed; ``bits_per_key``, the
  key-weighted mean of the tables' ``bits_per_key`` (the configured bits, 0 for a table without
  a filter: what a table row means by it); ``effective_bits_per_key`` = 8 x ``filter_bytes`` /
  ``keys``, the bits actually held (whole 4 KiB pages, so above the configured bits for small
  tables);
- ``budget``: Monkey's allocation for the current shape of the DB beside uniform bits per key
  at the same memory (the budget, or without one the bits per key x keys the tables were built
  for), as expected wasted table reads per missing-key lookup, and the same figure for the
  filters the tables actually have (per run the entry-weighted mean of its tables'
  ``expected_fpr``, each from the table's own policy, 1 for a table without a filter). Each run's FPR counts with its ``coverage``, the estimated share
  of missing-key lookups that probe it (engine/filter_plan.py ``coverage_of``: a level whose
  tables span part of the key range is probed only there); the filter bytes held (whole
  pages) against the budget, and per run its filter bytes and tables without a filter;
- ``cap``: the resident-filter cap, tracked resident bytes, faults and evictions.

stats() also reports block compression: per level and in total (``compression``, with the
option's ``setting``) the data blocks' bytes as stored and as they would be raw, and their
ratio (docs/format.md "Block compression").

Both take no DB lock beyond reading the current read state; counters are read racily (fine
for statistics).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field, fields

from . import speedups
from .compaction.picker import tombstone_wake_at
from .filter_plan import current_allocation, policy_fpr


@dataclass
class Counters:
    """Cumulative counters of one open DB (plain ints/floats; updated under the DB mutex or
    by the single background thread that owns them)."""

    log_errors: int = 0
    flushes: int = 0
    flush_bytes: int = 0
    flush_s: float = 0.0
    compactions: int = 0
    trivial_moves: int = 0
    subcompactions: int = 0  # key ranges run by compactions split (max_subcompactions > 1)
    compaction_bytes_read: int = 0
    compaction_bytes_written: int = 0
    compaction_entries_in: int = 0
    compaction_entries_out: int = 0
    compaction_s: float = 0.0
    slowdowns: int = 0
    slowdown_s: float = 0.0
    stops: int = 0
    stop_s: float = 0.0
    write_timeouts: int = 0  # writes given up at their timeout (WriteStalledError)
    background_errors: int = 0
    recovered_errors: int = 0  # full-disk failed states ended by a successful flush
    worker_fallbacks: int = 0  # jobs rerun in a DB thread, all reasons (background.py)
    worker_fallbacks_by_reason: dict = field(default_factory=lambda: dict.fromkeys(
        ("worker_lost", "no_worker", "numbers_exhausted"), 0))
    worker_jobs: int = 0
    recovered_entries: int = 0
    recovered_tables: int = 0
    # By task reason (engine/compaction/picker.py: "l0-count", "l<n>-size", "tombstones",
    # "manual"), trivial moves included.
    compactions_by_reason: dict = field(default_factory=dict)
    tombstone_compactions: int = 0  # reason "tombstones", trivial moves included
    # Tombstones the inputs held minus those the outputs hold: dropped at the bottom, or
    # merged with an older tombstone of the same key (every compaction, whatever its reason).
    tombstones_dropped: int = 0

    def note_worker_fallback(self, reason: str) -> None:
        self.worker_fallbacks += 1
        by = self.worker_fallbacks_by_reason
        by[reason] = by.get(reason, 0) + 1

    def note_compaction(self, task, result, seconds: float) -> None:
        self.compactions += 1
        by = self.compactions_by_reason
        by[task.reason] = by.get(task.reason, 0) + 1
        if task.reason == "tombstones":
            self.tombstone_compactions += 1
        if task.trivial_move:
            self.trivial_moves += 1
        else:
            self.tombstones_dropped += (sum(f.num_deletions for f in task.all_inputs)
                                        - sum(f.num_deletions for f in result.outputs))
        self.compaction_bytes_read += result.bytes_read
        self.compaction_bytes_written += result.bytes_written
        self.compaction_entries_in += result.entries_in
        self.compaction_entries_out += result.entries_out
        self.compaction_s += seconds


def _live_tables(rs):
    """[(level, FileMeta, Table)] of the read state, L0 newest first then by level and key."""
    out = []
    levels = rs.version.levels
    for f, t in zip(levels[0], rs.l0):
        out.append((0, f, t))
    k = 0
    for n in range(1, len(levels)):
        if levels[n]:
            for f, t in zip(levels[n], rs.levels[k][3]):
                out.append((n, f, t))
            k += 1
    return out


def _delayed_now(db, version) -> bool:
    """Writes are held to the write controller's rate now: L0 is at the slowdown trigger
    (the controller itself only learns that a delay ended at the next write that passes
    the slow path)."""
    o = db.options
    return (db.write_controller.enabled and not o.disable_auto_compactions
            and len(version.levels[0]) >= o.l0_slowdown_trigger)


def _counters_snapshot(c) -> dict:
    """``asdict(c)`` without its race: asdict walks a dict field in Python while a background
    thread may add a key to it (a compaction's first reason), which raised "dictionary changed
    size during iteration" from stats() (seen in test_model, session 16). ``dict(d)`` copies
    in one C call, which no other Python thread interleaves with. The fields are numbers and
    flat dicts of numbers."""
    return {f.name: dict(v) if isinstance(v, dict) else v
            for f in fields(c) for v in (getattr(c, f.name),)}


def _snapshots(db, rs) -> dict:
    """What open snapshots and older reads hold (RocksDB: num-snapshots, oldest-snapshot-time):
    a snapshot left open keeps tables on disk and replaced records in memory."""
    born = list(db._open_snapshots.values())  # one C call: atomic against open and close
    holds, kept = rs.mem.snapshot_stats()
    held = db._tables.held_obsolete()
    return {
        "open": len(born),  # DB.snapshot()s not yet closed
        "oldest_age_seconds": round(time.monotonic() - min(born), 3) if born else None,
        # snapshots of the active memtable: open DB.snapshot()s taken while it was active,
        # and scans not yet finished, closed or dropped
        "memtable_holds": holds,
        "kept_records": kept,  # records writes replaced in it, kept for those (in its bytes)
        # tables compacted away that older reads keep open (files deleted when released)
        "held_tables": len(held),
        "held_table_bytes": sum(t.file_size for t in held),
    }


def stats(db) -> dict:
    rs = db._rs
    if rs is None:
        from .errors import ClosedError
        raise ClosedError("DB is closed")
    levels = []
    for n, files in enumerate(rs.version.levels):
        levels.append({
            "level": n,
            "tables": len(files),
            "bytes": sum(f.size for f in files),
            "entries": sum(f.num_entries for f in files),
            "tombstones": sum(f.num_deletions for f in files),
            "target_bytes": (None if n == 0 or n == len(rs.version.levels) - 1
                             else int(db.options.max_bytes_for_level(n))),
        })
    c = db.counters
    blocks = db._tables.counter_total("data_blocks_read")
    map_failures = db._tables.counter_total("map_failures")
    live = [t for _, _, t in _live_tables(rs)]
    cache = db.block_cache
    gets = db.gets
    return {
        "path": db.path,
        # engine/speedups.py: the compiled point-read functions run (False: their Python
        # versions, the same answers more slowly)
        "native_speedups": speedups.native is not None,
        "levels": levels,
        "total_table_bytes": sum(lv["bytes"] for lv in levels),
        "compression": _compression(db, rs, levels),
        "memtable": {"bytes": rs.mem.approximate_bytes, "entries": len(rs.mem),
                     "frozen": len(rs.frozen),
                     "frozen_bytes": sum(m.approximate_bytes for m in rs.frozen)},
        "log": {"number": rs.mem.log_number, "bytes": db._log.size if db._log else 0},
        "last_sequence": db._last_seq,
        "writes": db._writes,
        "write_groups": db._write_groups,
        "synced_groups": db._synced_groups,
        "flushes": c.flushes,
        "flush_bytes": c.flush_bytes,
        "compactions": c.compactions,
        "trivial_moves": c.trivial_moves,
        "subcompactions": c.subcompactions,
        "compaction_bytes_read": c.compaction_bytes_read,
        "compaction_bytes_written": c.compaction_bytes_written,
        "compaction_seconds": round(c.compaction_s, 3),
        "compactions_by_reason": dict(c.compactions_by_reason),
        "tombstone_compactions": c.tombstone_compactions,
        "tombstones_dropped": c.tombstones_dropped,
        # Seconds until a tombstone compaction that tombstone_compaction_delay holds back
        # may run, or None (none held back).
        "tombstone_compaction_due_in_s": _tombstone_due_in(db, rs.version),
        "compaction_running": _running_compaction(db),
        # DB.verify in progress (engine/verify.py Progress.report), or None
        "verify_running": (lambda p: p.report() if p is not None else None)(
            getattr(db, "_verify_progress", None)),
        # DB.checkpoint in progress (engine/checkpoint.py: bytes linked or copied), or None
        "checkpoint_running": (lambda p: p.report() if p is not None else None)(
            getattr(db, "_checkpoint_progress", None)),
        "write_stall": {"slowdowns": c.slowdowns, "slowdown_seconds": round(c.slowdown_s, 4),
                        "stops": c.stops, "stop_seconds": round(c.stop_s, 4),
                        "total_seconds": round(c.slowdown_s + c.stop_s, 4),
                        # engine/write_controller.py: writes held to a rate now, that rate
                        # (bytes/s; kept between slowdowns), and how often it was changed
                        "delayed": _delayed_now(db, rs.version),
                        "delayed_write_rate": int(db.write_controller.rate),
                        "rate_adjustments": db.write_controller.adjustments,
                        # writes that gave up at their timeout, not applied (held by a
                        # stall, or queued behind slower writes)
                        "timeouts": c.write_timeouts},
        # `is not None`: an empty BlockCache is falsy (it has __len__)
        "block_cache": {"capacity_bytes": cache.capacity if cache is not None else 0,
                        "usage_bytes": cache.usage if cache is not None else 0,
                        "hits": cache.hits if cache is not None else 0,
                        "misses": cache.misses if cache is not None else 0},
        "reads": {"mmap_reads": db.options.mmap_reads,
                  "verify_every_read": db.options.verify_every_read,
                  "mapped_tables": sum(1 for t in live if getattr(t, "_data_map", None)),
                  "map_failures": map_failures},
        "snapshots": _snapshots(db, rs),
        "gets": gets,
        "data_blocks_read": blocks,
        "data_blocks_read_per_get": (blocks / gets) if gets else None,
        # Since open, tables compacted away included (filter_report() covers the live tables
        # only, so its counts drop when a compaction replaces the probed tables).
        "filter_probes": _filter_probes(db._tables),
        "table_workers": {"processes": db._pool.size if db._pool is not None else 0,
                          # Alive now (the pool is the process's, shared by its DBs): an
                          # idle worker exits after IDLE_EXIT_S without a job.
                          "running": db._pool.running if db._pool is not None else 0,
                          "idle_exits": db._pool.idle_exits if db._pool is not None else 0,
                          "jobs_in_process": c.worker_jobs,
                          # Jobs rerun in the DB's thread: the total, then by reason
                          # (engine/background.py): the worker died during the job, none
                          # could be started, the job ran out of reserved file numbers.
                          "fallbacks_to_threads": c.worker_fallbacks,
                          **{"fallbacks_" + r: n
                             for r, n in c.worker_fallbacks_by_reason.items()},
                          # Why the pool starts no more workers (the engine code on disk
                          # changed since the process started: restart it), or None.
                          "disabled": db._pool.disabled if db._pool is not None else None},
        "background_errors": c.background_errors,
        "recovered_errors": c.recovered_errors,
        "failed": None if db._bg_error is None else str(db._bg_error),
        "failed_retrying": db._bg_error is not None and db._bg_recoverable,  # full disk
        # A compaction that failed on a full disk and is retried (writes go on meanwhile).
        "compaction_retrying": (None if db._compaction_full_disk is None
                                else str(db._compaction_full_disk)),

        "recovered_entries": c.recovered_entries,
        "recovered_tables": c.recovered_tables,
        "counters": _counters_snapshot(c),
    }


def _tombstone_due_in(db, version) -> float | None:
    """Seconds from now until the earliest table that ``tombstone_compaction_delay`` holds
    back from a tombstone compaction becomes old enough (picker.tombstone_wake_at; it then
    runs if its task is dense enough as a whole), or None: none is held back, or nothing
    compacts here (read-only, disable_auto_compactions). O(tables)."""
    if db.options.disable_auto_compactions or not getattr(db, "_threads", None):
        return None
    now = time.monotonic()
    wake = tombstone_wake_at(version, db.options, now, db._births)
    return None if wake is None else round(wake - now, 3)


def _compression(db, rs, levels: list[dict]) -> dict:
    """Block compression of the live tables, from their properties (docs/format.md
    "Properties block"): per level (added to each row of ``levels``) and in total, the data
    blocks' bytes as stored and as they would be raw, and ``ratio`` = raw / stored (1.0 when
    nothing is compressed; None without data). ``setting``: the option new tables get."""
    rows = {lv["level"]: dict(data_bytes=0, uncompressed_data_bytes=0, data_blocks=0,
                              compressed_data_blocks=0) for lv in levels}
    for level, _, t in _live_tables(rs):
        p = t.properties
        row = rows[level]
        row["data_bytes"] += p.data_bytes
        row["uncompressed_data_bytes"] += p.uncompressed_data_bytes
        row["data_blocks"] += p.num_data_blocks
        row["compressed_data_blocks"] += p.compressed_data_blocks
    total = {k: sum(r[k] for r in rows.values()) for k in next(iter(rows.values()))}
    for lv in levels:
        row = rows[lv["level"]]
        lv.update(row, compression_ratio=_ratio(row))
    return {"setting": db.options.compression, **total, "ratio": _ratio(total)}


def _ratio(row: dict):
    return (round(row["uncompressed_data_bytes"] / row["data_bytes"], 3) if row["data_bytes"]
            else None)


def _filter_probes(tables) -> dict:
    pos = tables.counter_total("filter_positives")
    neg = tables.counter_total("filter_negatives")
    tp = tables.counter_total("filter_true_positives")
    errors = tables.counter_total("filter_errors")
    return {"probes": pos + neg + errors, "negatives": neg, "positives": pos,
            "true_positives": tp, "false_positives": max(pos - tp, 0), "filter_errors": errors}


_SUM_KEYS = ("keys", "filter_bytes", "filter_index_bytes", "mapped_bytes", "resident_bytes",
             "partitions", "partitions_touched", "partitions_resident", "probes", "negatives",
             "positives", "true_positives", "false_positives", "filter_errors")


def _ratios(d: dict) -> None:
    fp = d.get("false_positives", 0)
    neg = d.get("negatives", 0)
    tp = d.get("true_positives", 0)
    d["observed_fpr"] = fp / (fp + neg) if fp + neg else None
    d["false_ratio"] = fp / (fp + tp) if fp + tp else None


def _total(rows: list[dict]) -> dict:
    tot = {k: sum((r.get(k) or 0) for r in rows) for k in _SUM_KEYS}
    tot["tables"] = len(rows)
    keys = tot["keys"]
    # The same quantity as a row's bits_per_key (configured), weighted by keys; the bits held
    # (whole pages) are effective_bits_per_key, as in the tables' properties.
    tot["bits_per_key"] = (sum((r.get("bits_per_key") or 0) * (r.get("keys") or 0) for r in rows)
                           / keys) if keys else 0.0
    tot["effective_bits_per_key"] = (8 * tot["filter_bytes"] / keys) if keys else 0.0
    _ratios(tot)
    return tot


@functools.lru_cache(maxsize=256)
def _table_fpr(policy: str | None, known: bool, bits_per_key: float) -> float:
    """Expected FPR of a table's filter: the policy it was built with (its stored name) at its
    bits per key; 1.0 without a filter or for a policy this build cannot decode (its probes
    all answer "may match")."""
    if not policy or not known:
        return 1.0
    return policy_fpr(policy, bits_per_key)


def filter_report(db) -> dict:
    rs = db._rs
    if rs is None:
        from .errors import ClosedError
        raise ClosedError("DB is closed")
    opts = db.options
    live = _live_tables(rs)
    per_level: dict[int, list[dict]] = {}
    fpr_by_file: dict[int, float] = {}
    for level, f, t in live:
        row = t.filter_stats()
        row["file_number"] = f.number
        row["level"] = level
        row["bits_per_key"] = f.filter_bits_per_key
        row["expected_fpr"] = fpr_by_file[f.number] = _table_fpr(
            row["policy"], row["policy_known"], f.filter_bits_per_key)
        _ratios(row)
        per_level.setdefault(level, []).append(row)
    levels = []
    for level in sorted(per_level):
        rows = per_level[level]
        levels.append({"level": level, "totals": _total(rows), "tables": rows})
    all_rows = [r for rows in per_level.values() for r in rows]
    alloc, ids, runs, cov = current_allocation(opts, rs.version.levels)
    actual = _actual_runs(rs.version.levels, ids, fpr_by_file)
    held = sum(f.filter_bytes for files in rs.version.levels for f in files)
    budget_bytes = opts.filter_memory_budget
    budget = {
        "enabled": budget_bytes is not None,
        "budget_bytes": budget_bytes,
        "filter_bytes": held,
        "within_budget": None if budget_bytes is None else held <= budget_bytes,
        "runs": [{"level": lv, "l0_index": i if lv == 0 else None, "entries": n,
                  "coverage": round(c, 4),
                  "optimal_bits_per_key": round(b, 3), "optimal_fpr": p,
                  "actual_bits_per_key": round(a["bits_per_key"], 3),
                  "actual_fpr": a["fpr"], "filter_bytes": a["filter_bytes"],
                  "tables_without_filter": a["tables_without_filter"]}
                 for (lv, i), n, c, b, p, a in zip(ids, runs, cov, alloc.bits_per_key,
                                                   alloc.fpr, actual)],
        "expected_reads_per_miss_optimal": alloc.expected_reads_per_miss,
        "expected_reads_per_miss_uniform": alloc.uniform_expected_reads_per_miss,
        "uniform_bits_per_key": alloc.uniform_bits_per_key,
        "expected_reads_per_miss_actual": float(sum(a["fpr"] * c for a, c in zip(actual, cov))),
        "note": _BUDGET_NOTE if budget_bytes is not None else _NO_BUDGET_NOTE,
    }
    cap = db.filter_cap.report()
    cap["measured_resident_bytes"] = sum((r.get("resident_bytes") or 0) for r in all_rows)
    return {
        "policy": opts.filter_policy,
        "levels": levels,
        "totals": _total(all_rows),
        "budget": budget,
        "cap": cap,
    }


_NO_BUDGET_NOTE = ("allocation for the DB's current runs; with no budget configured it is "
                   "computed for the memory the tables were built for (their bits per key x "
                   "keys)")
_BUDGET_NOTE = (
    "allocation for the DB's current runs, each weighted by the share of misses that probe "
    "it (coverage). A new table gets its run's Monkey bits, planned for the DB at the capacity "
    "the budget covers at bits_per_key (the levels scaled up to hold the keys still to come); "
    "the levels do not fund L0 tables, only a flush is planned against them. Tables keep their "
    "filters until a compaction rewrites them, so actual bits lag the optimum, and "
    "filter_bytes, which counts whole filter pages (4 KiB each, the smallest filter a table "
    "can have), may exceed the budget while the DB grows, while L0 tables exist, or when "
    "tables are small (within_budget says so); "
    "filter_memory_cap bounds resident filter memory")


def _actual_runs(levels, ids, fpr_by_file: dict[int, float]) -> list[dict]:
    """Per run: the entry-weighted bits per key its tables were built with, its expected FPR
    (the entry-weighted mean of its tables' FPRs, ``fpr_by_file[number]``, each from the
    table's own policy: a miss probes the one table whose range holds the key, a table without
    a filter counts 1), filter bytes, and tables without a filter."""
    out = []
    for level, i in ids:
        files = [levels[0][i]] if level == 0 else list(levels[level])
        n = sum(f.num_entries for f in files)
        bits = fpr = 0.0
        if n:
            bits = sum(f.filter_bits_per_key * f.num_entries for f in files) / n
            fpr = sum(fpr_by_file.get(f.number, 1.0) * f.num_entries for f in files) / n
        out.append({"bits_per_key": bits, "fpr": fpr,
                    "filter_bytes": sum(f.filter_bytes for f in files),
                    "tables_without_filter": sum(1 for f in files
                                                 if f.filter_bits_per_key <= 0)})
    return out


__all__ = ["Counters", "stats", "filter_report"]


def _running_compaction(db) -> dict | None:
    """The compaction in progress (engine/background.py RunningCompaction.report), or None."""
    running = db._running
    return running.report(db._fs, db.path) if running is not None else None
