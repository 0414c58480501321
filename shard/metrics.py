"""Prometheus metrics of a shard or router process.

- ``sievekv_requests_total{method,code}``: counter of finished calls by gRPC method name and
  status code name (``OK``, ``UNAVAILABLE``...).
- ``sievekv_request_duration_seconds{method}``: histogram of handler time.
- on shards, :class:`EngineCollector` turns ``db.stats()`` and ``db.filter_report()`` into
  ``sievekv_engine_*`` metrics at scrape time (see its docstring).

Each process keeps its own :class:`prometheus_client.CollectorRegistry` (so tests can build
several servers in one process) and exposes it with :func:`serve` on ``--metrics-port``
(0 = off: no metrics are collected at all then).
"""

from __future__ import annotations

import logging
import math
from typing import Callable

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)


class RequestMetrics:
    """Request counters and latency histograms in ``registry``. Thread-safe (prometheus_client
    children lock internally)."""

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry
        self.requests = Counter("sievekv_requests", "Finished gRPC calls by method and status code",
                                ["method", "code"], registry=registry)
        self.duration = Histogram("sievekv_request_duration_seconds",
                                  "Time spent in the gRPC handler", ["method"],
                                  buckets=LATENCY_BUCKETS, registry=registry)

    def observer(self, method: str) -> Callable[[grpc.StatusCode, float], None]:
        """A ``observe(code, seconds)`` callable with the label lookups done once."""
        hist = self.duration.labels(method)
        counters: dict[grpc.StatusCode, object] = {}
        requests = self.requests

        def observe(code: grpc.StatusCode, seconds: float) -> None:
            c = counters.get(code)
            if c is None:
                c = counters[code] = requests.labels(method, code.name)
            c.inc()
            hist.observe(seconds)

        return observe


def serve(port: int, host: str, registry: CollectorRegistry):
    """Expose ``registry`` over HTTP at ``host:port``; returns the HTTP server (or None when
    ``port`` is 0)."""
    if not port:
        return None
    result = start_http_server(port, addr=host, registry=registry)
    return result[0] if isinstance(result, tuple) else result


def _number(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def flatten_numbers(obj, prefix: str = "", list_keys: tuple[str, ...] = ("levels",)) -> dict[str, float]:
    """Every numeric leaf of a JSON-like ``obj`` by dotted path (bools and non-numbers skipped).

    Lists are followed only under the keys in ``list_keys`` (per-level lists), each item under
    its own ``"level"`` number (its position when it has none): a filter report lists only
    the levels that hold tables, so positions would pair one shard's L1 with another's L0.
    Other lists (per-table or per-run detail) are skipped: their positions mean nothing across
    shards, and they would make a metric per table.

    >>> flatten_numbers({"a": 1, "b": {"c": 2.5, "d": "x"}, "levels": [{"n": 3}], "tables": [4]})
    {'a': 1.0, 'b.c': 2.5, 'levels.0.n': 3.0}
    >>> flatten_numbers({"levels": [{"level": 2, "n": 3}]})
    {'levels.2.level': 2.0, 'levels.2.n': 3.0}
    """
    out: dict[str, float] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, (list, tuple)):
                if k in list_keys:
                    for i, item in enumerate(v):
                        level = item.get("level") if isinstance(item, dict) else None
                        key = level if isinstance(level, int) and not isinstance(level, bool) else i
                        out.update(flatten_numbers(item, f"{path}.{key}", list_keys))
                continue
            out.update(flatten_numbers(v, path, list_keys))
        return out
    n = _number(obj)
    if n is not None and prefix:
        out[prefix] = n
    return out


# -- totals over shards ---------------------------------------------------------------------------
# The leaves of a flattened report that are not amounts: summing them over shards means nothing.
# Ratios are recomputed from the summed counts (RATIOS); identifiers, settings and model
# estimates (NOT_SUMMED) are kept only where every shard gives the same value ("levels.1.level"
# is 1 everywhere; a single shard's totals keep them all) and left out where they differ (each
# shard's own section still has them).
RATIOS = {
    # leaf: (numerator leaves, denominator leaves), all siblings under the same prefix
    "observed_fpr": (("false_positives",), ("false_positives", "negatives")),
    "false_ratio": (("false_positives",), ("false_positives", "true_positives")),
    "data_blocks_read_per_get": (("data_blocks_read",), ("gets",)),
    # filter bits held per key, pages rounded up (the engine's effective_bits_per_key)
    "effective_bits_per_key": (("filter_bytes",), ("keys",)),  # x 8, see _ratio
    # block compression: data bytes raw / stored ("compression.ratio", each level's)
    "ratio": (("uncompressed_data_bytes",), ("data_bytes",)),
    "compression_ratio": (("uncompressed_data_bytes",), ("data_bytes",)),
}
NOT_SUMMED = frozenset({
    "level", "output_level", "number", "last_sequence",  # identifiers, positions
    # per-shard settings (bits_per_key: the configured bits, key-weighted over tables)
    "bits_per_key", "uniform_bits_per_key", "expected_fpr",
    "expected_reads_per_miss_actual", "expected_reads_per_miss_optimal",
    "expected_reads_per_miss_uniform",  # a model per shard, not an amount
})


MAXED = frozenset({
    "oldest_age_seconds",  # the cluster's oldest snapshot: the largest of the shards' ages
    # how long the work in progress has run (compaction_running, verify_running,
    # checkpoint_running): the longest-running shard's
    "seconds",
})
MINNED = frozenset({
    # seconds until something becomes due: the soonest shard's (session 20 review: summed,
    # two shards each due in an hour said two hours)
    "tombstone_compaction_due_in_s",
})


def _ratio(leaf: str, num: float, den: float) -> float:
    return 8 * num / den if leaf == "effective_bits_per_key" else num / den


def sum_totals(parts) -> dict[str, float]:
    """The cluster's totals from shards' flattened reports (:func:`flatten_numbers` dicts):
    amounts summed, ratios recomputed from the summed amounts (a ratio with a zero or missing
    denominator is left out, as the engine reports None), ages and running times (MAXED) the
    largest, times until something is due (MINNED) the smallest, identifiers and per-shard
    figures kept where all shards agree and left out where they differ.

    >>> t = sum_totals([{"t.false_positives": 1, "t.negatives": 9, "t.observed_fpr": 0.1,
    ...                  "levels.1.level": 1, "log.number": 7},
    ...                 {"t.false_positives": 3, "t.negatives": 7, "t.observed_fpr": 0.3,
    ...                  "levels.1.level": 1, "log.number": 12}])
    >>> t == {"t.false_positives": 4.0, "t.negatives": 16.0, "t.observed_fpr": 0.2,
    ...       "levels.1.level": 1.0}
    True
    """
    sums: dict[str, float] = {}
    ratios: set[str] = set()
    same: dict[str, float | None] = {}  # NOT_SUMMED leaves: the common value, None if not
    for part in parts:
        for key, value in part.items():
            leaf = key.rsplit(".", 1)[-1]
            if leaf in RATIOS:
                ratios.add(key)
            elif leaf in NOT_SUMMED:
                value = float(value)
                same[key] = value if same.get(key, value) == value else None
            elif leaf in MAXED:
                sums[key] = max(sums.get(key, float(value)), float(value))
            elif leaf in MINNED:
                sums[key] = min(sums.get(key, float(value)), float(value))
            else:
                sums[key] = sums.get(key, 0.0) + float(value)
    out = dict(sums)
    out.update((k, v) for k, v in same.items() if v is not None)
    for key in ratios:
        prefix, _, leaf = key.rpartition(".")
        at = (lambda name: f"{prefix}.{name}") if prefix else (lambda name: name)
        nums, dens = RATIOS[leaf]
        if not all(at(n) in sums for n in nums + dens):
            continue
        den = sum(sums[at(n)] for n in dens)
        if den:
            out[key] = _ratio(leaf, sum(sums[at(n)] for n in nums), den)
    return out
