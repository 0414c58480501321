"""``sievekv filters``: the filter memory report of every shard, per level (and per table).

The numbers are the shards' own (``DB.filter_report()``, engine/reports.py, fetched through
the router's Admin.FilterReport): filter bytes on disk, mapped, resident (measured by the OS
from the shard process's smaps), partitions touched of total, top-level filter index bytes,
bits per key, expected and observed FPR, useful (negative) / positive / true-positive probe
counts; per shard the budget, cap and evictions. The CLI adds the cluster totals (sums over
shards) and, per level, the key-weighted configured bits per key and expected FPR.

Human-readable by default; ``--json`` prints the shards' reports untouched (raw numbers) plus
``cluster_totals``. Exit 4 when some shard did not answer (the others are still shown).
"""

from __future__ import annotations

import json

import grpc

from ..humanize import format_bytes, format_count, format_counted, format_ratio
from . import rpc, target
from .exit_codes import OK, PARTIAL, CliError, from_rpc_error
from .table import render

DEFAULT_TIMEOUT = 30.0

# Summed over shards for the cluster totals (all are sums in the engine's own totals too).
SUM_FIELDS = ("tables", "keys", "filter_bytes", "filter_index_bytes", "mapped_bytes",
              "resident_bytes", "partitions", "partitions_touched", "partitions_resident",
              "probes", "negatives", "positives", "true_positives", "false_positives",
              "filter_errors")


def cluster_totals(shards: dict) -> dict:
    """Sums of every shard's ``totals``, with the ratios recomputed from the sums."""
    tot = {f: sum((rep.get("totals", {}).get(f) or 0) for rep in shards.values())
           for f in SUM_FIELDS}
    fp, neg, tp = tot["false_positives"], tot["negatives"], tot["true_positives"]
    tot["observed_fpr"] = fp / (fp + neg) if fp + neg else None
    tot["false_ratio"] = fp / (fp + tp) if fp + tp else None
    tot["shards"] = len(shards)
    tot["evictions"] = sum((rep.get("cap", {}).get("evictions") or 0) for rep in shards.values())
    return tot


def _weighted(tables: list[dict], field: str) -> float | None:
    """Key-weighted mean of ``field`` over tables that have it."""
    pairs = [(t.get("keys") or 0, t[field]) for t in tables if t.get(field) is not None]
    n = sum(k for k, _ in pairs)
    return sum(k * v for k, v in pairs) / n if n else None


def fetch(args) -> dict:
    addr = target.router_address(args)
    try:
        doc = rpc.report_json(addr, "FilterReport", getattr(args, "timeout", None)
                              or DEFAULT_TIMEOUT)
    except grpc.RpcError as exc:
        raise from_rpc_error(exc, f"FilterReport via router {addr}") from None
    doc.pop("totals", None)  # the router's flattened sums; cluster_totals replaces them
    doc["cluster_totals"] = cluster_totals(doc.get("shards", {}))
    return doc


def cmd_filters(args) -> int:
    doc = fetch(args)
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(render_text(doc, args.tables))
    failed = sorted(n for n, s in doc.get("sections", {}).items() if not s.get("ok"))
    if failed:
        # Exit 4 with the one stderr line every failure gets (the table says why per shard).
        raise CliError(f"FilterReport failed on {len(failed)} of {len(doc['sections'])} shards "
                       f"({', '.join(failed)})", PARTIAL)
    return OK


HEADER = ["TABLES", "KEYS", "BITS/KEY", "ON DISK", "MAPPED", "RESIDENT", "PARTS TOUCHED",
          "INDEX", "EXP FPR", "OBS FPR", "USEFUL", "POSITIVE", "TRUE POS"]


def _cells(r: dict, bits: float | None, exp_fpr: float | None, tables: int | None) -> list:
    return [
        format_count(tables) if tables is not None else "",
        format_count(r.get("keys")),
        "-" if bits is None else f"{bits:.1f}",
        format_bytes(r.get("filter_bytes")),
        format_bytes(r.get("mapped_bytes")),
        format_bytes(r.get("resident_bytes")),
        f"{format_count(r.get('partitions_touched'))}/{format_count(r.get('partitions'))}",
        format_bytes(r.get("filter_index_bytes")),
        format_ratio(exp_fpr),
        format_ratio(r.get("observed_fpr")),
        format_count(r.get("negatives")),
        format_count(r.get("positives")),
        format_count(r.get("true_positives")),
    ]


def _off(n) -> str:
    return "off" if n is None else format_bytes(n)


def render_text(doc: dict, tables: bool) -> str:
    out = []
    shards = doc.get("shards", {})
    sections = doc.get("sections", {})
    for name in sorted(set(shards) | set(sections)):
        rep = shards.get(name)
        sec = sections.get(name, {})
        if rep is None:
            out += [f"{name}: no report: {sec.get('error') or 'unavailable'}", ""]
            continue
        budget, cap = rep.get("budget") or {}, rep.get("cap") or {}
        out.append(f"{name} ({sec.get('address', '?')}), policy {rep.get('policy')}: "
                   f"budget {_off(budget.get('budget_bytes'))}, cap {_off(cap.get('cap_bytes'))}, "
                   f"evictions {format_count(cap.get('evictions'))} "
                   f"({format_bytes(cap.get('evicted_bytes'))})")
        rows = []
        all_tables = []
        for lv in rep.get("levels", []):
            ts = lv.get("tables", [])
            all_tables += ts
            t = lv.get("totals", {})
            rows.append([f"L{lv.get('level')}", ""] + _cells(
                t, _weighted(ts, "bits_per_key"), _weighted(ts, "expected_fpr"), t.get("tables")))
            if tables:
                for tb in ts:
                    rows.append(["", f"{tb.get('file_number', ''):06d}" if isinstance(
                        tb.get("file_number"), int) else ""] + _cells(
                        tb, tb.get("bits_per_key"), tb.get("expected_fpr"), None))
        t = rep.get("totals", {})
        rows.append(["total", ""] + _cells(t, _weighted(all_tables, "bits_per_key"),
                                           _weighted(all_tables, "expected_fpr"), t.get("tables")))
        out.append(render(["LEVEL", "TABLE"] + HEADER, rows))
        out.append("")
    ct = doc["cluster_totals"]
    out.append(f"cluster total ({format_counted(ct['shards'], 'shard')}, "
               f"{format_counted(ct['tables'], 'table')}, {format_counted(ct['keys'], 'key')}): on disk {format_bytes(ct['filter_bytes'])}, "
               f"mapped {format_bytes(ct['mapped_bytes'])}, resident "
               f"{format_bytes(ct['resident_bytes'])}, index {format_bytes(ct['filter_index_bytes'])}, "
               f"partitions touched {format_count(ct['partitions_touched'])}/"
               f"{format_count(ct['partitions'])}, observed FPR {format_ratio(ct['observed_fpr'])}, "
               f"evictions {format_count(ct['evictions'])}")
    return "\n".join(out)
