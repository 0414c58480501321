"""A Prometheus collector that reads the engine's own counters at scrape time.

From ``db.stats()["filter_probes"]`` (counts since the shard started, tables compacted away
included, so they never go down):

- ``sievekv_engine_filter_probes_total``           lookups that consulted a filter
- ``sievekv_engine_filter_useful_total``           the filter said "absent": a read saved
- ``sievekv_engine_filter_positives_total``        the filter said "may be present"
- ``sievekv_engine_filter_true_positives_total``   ... and the key was there
- ``sievekv_engine_filter_false_positives_total``  ... and it was not (a wasted read)

From ``db.filter_report()["levels"][i]["totals"]`` (label ``level``; the tables live now):

- ``sievekv_engine_filter_resident_bytes``         filter bytes resident in memory now
- ``sievekv_engine_filter_bytes``                  filter bytes stored in the level's tables

Per-level probe counts are not exported: a level's tables change with every compaction, so
they would go down, which Prometheus reads as a counter reset (FilterReport has them).

From ``db.stats()``: ``sievekv_engine_level_tables``/``_level_bytes{level}``,
``sievekv_engine_memtable_bytes``, ``sievekv_engine_flushes_total``,
``sievekv_engine_compactions_total``, ``sievekv_engine_tombstone_compactions_total``,
``sievekv_engine_tombstones_dropped_total``, ``sievekv_engine_compaction_read_bytes_total``,
``sievekv_engine_compaction_written_bytes_total``, ``sievekv_engine_write_stall_seconds_total``,
``sievekv_engine_write_timeouts_total`` (writes given up at their deadline, not applied),
``sievekv_engine_block_cache_hits_total``, ``sievekv_engine_block_cache_misses_total``,
``sievekv_engine_block_cache_usage_bytes``, ``sievekv_engine_delayed_write_rate_bytes``
(what writes are held to past the slowdown trigger) with ``sievekv_engine_writes_delayed``
(0 or 1: held now), ``sievekv_engine_background_errors_total``,
``sievekv_engine_recovered_errors_total``, ``sievekv_engine_gets_total``,
``sievekv_engine_get_data_blocks_read_total``; from ``db.filter_report()["cap"]`` (with a
filter memory cap) ``sievekv_engine_filter_cap_faults_total`` and ``..._evictions_total``;
and the states an operator alerts on (0 or 1):
``sievekv_engine_writes_refused`` (the engine is in its failed state), with
``sievekv_engine_writes_refused_retrying`` (... because of a full disk, retried by itself: no
restart needed) and ``sievekv_engine_compaction_retrying`` (a compaction failed on a full disk
and is retried; writes go on until L0 reaches its stop trigger).

A field the engine does not report is left out; a report that raises is logged and counted in
``sievekv_engine_scrape_errors_total`` instead of failing the scrape.
"""

from __future__ import annotations

import logging

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .metrics import _number

log = logging.getLogger(__name__)

_FILTER_COUNTERS = (
    ("probes", "sievekv_engine_filter_probes", "Lookups that consulted a filter"),
    ("negatives", "sievekv_engine_filter_useful", "Filter answered absent: a table read saved"),
    ("positives", "sievekv_engine_filter_positives", "Filter answered may-be-present"),
    ("true_positives", "sievekv_engine_filter_true_positives", "Positive and the key was present"),
    ("false_positives", "sievekv_engine_filter_false_positives", "Positive but the key was absent"),
)
_FILTER_GAUGES = (
    ("resident_bytes", "sievekv_engine_filter_resident_bytes", "Filter bytes resident in memory"),
    ("filter_bytes", "sievekv_engine_filter_bytes", "Filter bytes stored in the level's tables"),
)
_STATS_COUNTERS = (
    (("flushes",), "sievekv_engine_flushes", "Memtable flushes"),
    (("compactions",), "sievekv_engine_compactions", "Compactions run"),
    (("tombstone_compactions",), "sievekv_engine_tombstone_compactions",
     "Compactions run for tombstone density (tombstone_compaction_ratio)"),
    (("tombstones_dropped",), "sievekv_engine_tombstones_dropped", "Tombstones removed by compactions"),
    (("compaction_bytes_read",), "sievekv_engine_compaction_read_bytes", "Bytes read by compactions"),
    (("compaction_bytes_written",), "sievekv_engine_compaction_written_bytes", "Bytes written by compactions"),
    (("write_stall", "total_seconds"), "sievekv_engine_write_stall_seconds", "Seconds writers were slowed or stopped"),
    (("write_stall", "timeouts"), "sievekv_engine_write_timeouts",
     "Writes given up at their deadline while writes were held (not applied)"),
    (("block_cache", "hits"), "sievekv_engine_block_cache_hits", "Block cache hits"),
    (("block_cache", "misses"), "sievekv_engine_block_cache_misses", "Block cache misses"),
    (("background_errors",), "sievekv_engine_background_errors", "Failed background flushes/compactions"),
    (("recovered_errors",), "sievekv_engine_recovered_errors", "Full-disk failed states ended by a successful flush"),
    (("gets",), "sievekv_engine_gets", "Point lookups (Get, and each key of a MultiGet)"),
    (("data_blocks_read",), "sievekv_engine_get_data_blocks_read", "Data blocks read by point lookups"),
)
_CAP_COUNTERS = (
    ("faults", "sievekv_engine_filter_cap_faults", "Filter partitions made resident under the cap"),
    ("evictions", "sievekv_engine_filter_cap_evictions", "Filter partitions released to stay under the cap"),
)
_STATE_GAUGES = (
    ("failed", "sievekv_engine_writes_refused", "1 while the engine refuses writes after a failure"),
    ("failed_retrying", "sievekv_engine_writes_refused_retrying",
     "1 while writes are refused because of a full disk (retried by itself, no restart needed)"),
    ("compaction_retrying", "sievekv_engine_compaction_retrying",
     "1 while a compaction that failed on a full disk is being retried"),
)
_STATS_GAUGES = (
    (("block_cache", "usage_bytes"), "sievekv_engine_block_cache_usage_bytes", "Bytes in the block cache"),
    (("memtable", "bytes"), "sievekv_engine_memtable_bytes", "Bytes in the active memtable"),
    (("write_stall", "delayed_write_rate"), "sievekv_engine_delayed_write_rate_bytes",
     "Bytes/s writes are held to while L0 is at its slowdown trigger (adapted, kept between slowdowns)"),
    (("snapshots", "open"), "sievekv_engine_snapshots_open", "engine.DB snapshots not yet closed"),
    (("snapshots", "oldest_age_seconds"), "sievekv_engine_oldest_snapshot_age_seconds",
     "Age of the oldest open snapshot (absent while none is open)"),
    (("snapshots", "memtable_holds"), "sievekv_engine_memtable_holds",
     "Scans and snapshots reading the active memtable as of their start"),
    (("snapshots", "held_table_bytes"), "sievekv_engine_held_table_bytes",
     "Bytes of tables compacted away that older reads (snapshots, scans) keep open and on disk"),
)


def _path(doc, path):
    for part in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(part)
    return _number(doc)


def _level(entry, index):
    level = entry.get("level", index) if isinstance(entry, dict) else index
    return str(level)


class EngineCollector:
    """Collects from ``db`` on each scrape. Thread-safe as far as the db's reports are."""

    def __init__(self, db):
        self.db = db
        self.errors = 0

    def _report(self, name: str) -> dict:
        try:
            report = getattr(self.db, name)()
            return report if isinstance(report, dict) else {}
        except Exception:  # noqa: BLE001 - a scrape must not fail because of one report
            self.errors += 1
            log.warning("engine %s() failed during a metrics scrape", name, exc_info=True)
            return {}

    def collect(self):
        filters = self._report("filter_report")
        levels = filters.get("levels") if isinstance(filters.get("levels"), list) else []
        for field, name, help_text in _FILTER_GAUGES:
            family = GaugeMetricFamily(name, help_text, labels=["level"])
            for i, entry in enumerate(levels):
                value = _path(entry, ("totals", field))
                if value is not None:
                    family.add_metric([_level(entry, i)], value)
            yield family

        cap = filters.get("cap") if isinstance(filters.get("cap"), dict) else {}
        for field, name, help_text in _CAP_COUNTERS:
            value = _path(cap, (field,))
            if value is not None:
                family = CounterMetricFamily(name, help_text)
                family.add_metric([], value)
                yield family

        stats = self._report("stats")
        for field, name, help_text in _FILTER_COUNTERS:
            value = _path(stats, ("filter_probes", field))
            if value is not None:
                family = CounterMetricFamily(name, help_text)
                family.add_metric([], value)
                yield family
        for fields, family_cls in ((_STATS_COUNTERS, CounterMetricFamily), (_STATS_GAUGES, GaugeMetricFamily)):
            for path, name, help_text in fields:
                value = _path(stats, path)
                if value is not None:
                    family = family_cls(name, help_text)
                    family.add_metric([], value)
                    yield family
        delayed = stats.get("write_stall", {}).get("delayed") if isinstance(
            stats.get("write_stall"), dict) else None
        if isinstance(delayed, bool):
            family = GaugeMetricFamily("sievekv_engine_writes_delayed",
                                       "1 while writes are held to delayed_write_rate "
                                       "(L0 at its slowdown trigger)")
            family.add_metric([], 1.0 if delayed else 0.0)
            yield family
        for field, name, help_text in _STATE_GAUGES:
            if field in stats:  # a string (the error) or True: set; None or False: clear
                family = GaugeMetricFamily(name, help_text)
                family.add_metric([], 1.0 if stats[field] else 0.0)
                yield family
        stat_levels = stats.get("levels") if isinstance(stats.get("levels"), list) else []
        for field, name, help_text in (("tables", "sievekv_engine_level_tables", "Tables in the level"),
                                       ("bytes", "sievekv_engine_level_bytes", "Table bytes in the level")):
            family = GaugeMetricFamily(name, help_text, labels=["level"])
            for i, entry in enumerate(stat_levels):
                value = _path(entry, (field,))
                if value is not None:
                    family.add_metric([_level(entry, i)], value)
            yield family

        errors = CounterMetricFamily("sievekv_engine_scrape_errors",
                                     "Engine reports that failed during a scrape")
        errors.add_metric([], self.errors)
        yield errors
