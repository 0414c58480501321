"""What ``sievekv bench`` prints: the children's raw results summed into one document
(:func:`summarize`, the ``--json`` output) and that document as text (:func:`render`).

Rates divide by one window common to every client: from the common start instant to the end
of the last call of any client (calls that started before the deadline finish and count).
Percentiles are nearest-rank over every successful call's latency (exact: nothing sampled).
Pure functions, no I/O.

>>> nearest_rank([1.0, 2.0, 3.0, 4.0], 50), nearest_rank([1.0, 2.0, 3.0, 4.0], 99)
(2.0, 4.0)
"""

from __future__ import annotations

import math

from ..humanize import format_bytes, format_count
from .table import render as render_table

PERCENTILES = (50, 90, 99)


def nearest_rank(sorted_values, p: float) -> float:
    """The ``p``-th percentile (0 < p <= 100) of ascending ``sorted_values`` by nearest rank:
    a value that was measured, never an interpolation. REQUIRES: non-empty, ascending."""
    return sorted_values[max(math.ceil(p / 100 * len(sorted_values)) - 1, 0)]


def _latency_ms(latencies: list[float]) -> dict | None:
    if not latencies:
        return None
    xs = sorted(latencies)
    out = {f"p{p}": nearest_rank(xs, p) * 1e3 for p in PERCENTILES}
    out["max"] = xs[-1] * 1e3
    out["mean"] = sum(xs) / len(xs) * 1e3
    return out


def summarize(setup: dict, results: list[dict], start_at: float, interrupted: bool) -> dict:
    """The ``--json`` document from the children's results (bench_worker's ``"result"``
    messages, one per client that finished) and ``setup`` (the run's parameters, copied in).

    Fields: the setup fields; ``elapsed`` (seconds of the common window); ``interrupted``;
    ``ops``: per operation ``calls`` (successful), ``ops_per_s``, ``keys``, ``keys_per_s``,
    ``found``, ``found_ratio`` (reads; None for put), ``latency_ms`` (``p50``, ``p90``,
    ``p99``, ``max``, ``mean``; None without a successful call), ``errors`` (status name ->
    count), ``first_errors`` (status name -> the first call's message); ``total``: ``calls``,
    ``ops_per_s``, ``errors`` (summed over operations); ``per_client``: per client ``calls``
    (successful) and ``ops_per_s``; ``client_ops_per_s_min`` / ``_max``.
    """
    ends = [r["end"] for r in results if r["calls"]]
    elapsed = max(max(ends) - start_at, 1e-9) if ends else 0.0
    rate = (lambda n: n / elapsed) if elapsed else (lambda n: 0.0)
    names = sorted({op for r in results for op in r["ops"]})
    ops = {}
    for name in names:
        parts = [r["ops"][name] for r in results if name in r["ops"]]
        lat = [x for p in parts for x in p["latencies"]]
        keys = sum(p["keys"] for p in parts)
        found = sum(p["found"] for p in parts)
        errors: dict[str, int] = {}
        first: dict[str, str] = {}
        for p in parts:
            for code, n in p["errors"].items():
                errors[code] = errors.get(code, 0) + n
            for code, msg in p["first_error"].items():
                first.setdefault(code, msg)
        ops[name] = {"calls": len(lat), "ops_per_s": rate(len(lat)), "keys": keys,
                     "keys_per_s": rate(keys), "found": found,
                     "found_ratio": (found / keys if keys else None) if name != "put" else None,
                     "latency_ms": _latency_ms(lat), "errors": errors, "first_errors": first}
    total_errors: dict[str, int] = {}
    for o in ops.values():
        for code, n in o["errors"].items():
            total_errors[code] = total_errors.get(code, 0) + n
    total_calls = sum(o["calls"] for o in ops.values())
    per_client = []
    for r in results:
        ok = sum(len(o["latencies"]) for o in r["ops"].values())
        per_client.append({"calls": ok, "ops_per_s": rate(ok)})
    per = [c["ops_per_s"] for c in per_client]
    return dict(setup, elapsed=elapsed, interrupted=interrupted, ops=ops,
                total={"calls": total_calls, "ops_per_s": rate(total_calls),
                       "errors": total_errors},
                per_client=per_client, client_ops_per_s_min=min(per) if per else None,
                client_ops_per_s_max=max(per) if per else None)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}" if x < 100 else f"{x:.0f}"


def _errors(errors: dict) -> str:
    return ", ".join(f"{k} {format_count(v)}" for k, v in sorted(errors.items())) or "0"


def render(doc: dict) -> str:
    """The summary as text: a setup line, one table row per operation, the client spread."""
    value = f", values {format_bytes(doc['value_size'])}" if doc["op"] in ("put", "mixed") \
        else ""
    batch = f", {doc['batch']} keys per call" if doc["op"] == "mget" else ""
    head = (f"bench {doc['op']}: {doc['clients']} client(s), {doc['elapsed']:.2f} s measured "
            f"(of {doc['seconds']:g} s{', interrupted' if doc['interrupted'] else ''}), "
            f"{format_count(doc['keys'])} keys{value}{batch}"
            f"{', sync' if doc['sync'] else ''}, router {doc['router']}")
    header = ["OP", "CALLS", "OPS/S", "KEYS/S", "P50 MS", "P90 MS", "P99 MS", "MAX MS",
              "FOUND", "ERRORS"]
    rows = []
    for name, o in doc["ops"].items():
        lat = o["latency_ms"] or {}
        found = "-" if o["found_ratio"] is None else f"{o['found_ratio']:.3f}"
        rows.append([name, format_count(o["calls"]), format_count(round(o["ops_per_s"])),
                     format_count(round(o["keys_per_s"])), _ms(lat.get("p50")),
                     _ms(lat.get("p90")), _ms(lat.get("p99")), _ms(lat.get("max")), found,
                     _errors(o["errors"])])
    lines = [head, render_table(header, rows)]
    if len(doc["ops"]) > 1:
        t = doc["total"]
        lines.append(f"total: {format_count(t['calls'])} calls, "
                     f"{format_count(round(t['ops_per_s']))} ops/s, errors {_errors(t['errors'])}")
    if not doc.get("preload") and any(o["found_ratio"] == 0 for o in doc["ops"].values()):
        lines.append("no read found its key: the bench:%010d keys are not in the cluster; "
                     "--preload writes them first")
    if doc["per_client"]:
        lines.append(f"per client ops/s: min {format_count(round(doc['client_ops_per_s_min']))}"
                     f", max {format_count(round(doc['client_ops_per_s_max']))}")
    return "\n".join(lines)
