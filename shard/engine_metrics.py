"""A Prometheus collector that reads the engine's own counters at scrape time.

Every numeric leaf of ``db.stats()`` is exported as ``sievekv_engine_stat{stat="<dotted.path>"}``
and every numeric leaf of ``db.filter_report()`` as ``sievekv_engine_filter_stat{stat=...}``
(gauges: the engine's report decides what is cumulative). A failing report is logged and
exported as ``sievekv_engine_scrape_errors_total`` instead of failing the scrape.
"""

from __future__ import annotations

import logging

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .metrics import flatten_numbers

log = logging.getLogger(__name__)


class EngineCollector:
    """Collects from ``db`` on each scrape. Thread-safe as far as db.stats() is."""

    def __init__(self, db):
        self.db = db
        self.errors = 0

    def _report(self, name: str) -> dict:
        try:
            return getattr(self.db, name)()
        except Exception:  # noqa: BLE001 - a scrape must not fail because of one report
            self.errors += 1
            log.warning("engine %s() failed during a metrics scrape", name, exc_info=True)
            return {}

    def collect(self):
        for report, metric, help_text in (
                ("stats", "sievekv_engine_stat", "Numeric fields of db.stats() by dotted path"),
                ("filter_report", "sievekv_engine_filter_stat",
                 "Numeric fields of db.filter_report() by dotted path")):
            family = GaugeMetricFamily(metric, help_text, labels=["stat"])
            for path, value in sorted(flatten_numbers(self._report(report)).items()):
                family.add_metric([path], value)
            yield family
        errors = CounterMetricFamily("sievekv_engine_scrape_errors",
                                     "Engine reports that failed during a scrape")
        errors.add_metric([], self.errors)
        yield errors
