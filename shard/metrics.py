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

    Lists are followed only under the keys in ``list_keys`` (per-level lists, indexed by level);
    other lists (per-table or per-run detail) are skipped: their positions mean nothing across
    shards, and they would make a metric per table.

    >>> flatten_numbers({"a": 1, "b": {"c": 2.5, "d": "x"}, "levels": [{"n": 3}], "tables": [4]})
    {'a': 1.0, 'b.c': 2.5, 'levels.0.n': 3.0}
    """
    out: dict[str, float] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, (list, tuple)):
                if k in list_keys:
                    for i, item in enumerate(v):
                        out.update(flatten_numbers(item, f"{path}.{i}", list_keys))
                continue
            out.update(flatten_numbers(v, path, list_keys))
        return out
    n = _number(obj)
    if n is not None and prefix:
        out[prefix] = n
    return out
