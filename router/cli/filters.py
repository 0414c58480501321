"""``sievekv filters``: the filter memory report of every shard, per level (and per table).

The numbers are the shards' own (``db.filter_report()``, fetched through the router's
Admin.FilterReport), shown with human-readable sizes; ``--json`` prints them raw, with the
cluster totals computed here. Residency is what the OS says (smaps of the shard process),
not an estimate.
"""

from __future__ import annotations

import json

import grpc

from ..humanize import format_bytes, format_count, format_ratio
from . import rpc, target
from .exit_codes import OK, PARTIAL, from_rpc_error
from .table import render

DEFAULT_TIMEOUT = 30.0

# Per-level / per-table fields summed into shard and cluster totals.
SUM_FIELDS = ("tables", "keys", "filter_bytes", "filter_index_bytes", "mapped_bytes",
              "resident_bytes", "partitions", "partitions_touched", "partitions_resident",
              "probes", "useful", "positives", "true_positives", "false_positives")


def _sum(rows: list[dict]) -> dict:
    out = {}
    for f in SUM_FIELDS:
        vals = [r[f] for r in rows if isinstance(r.get(f), (int, float))]
        out[f] = sum(vals) if vals else None
    fp, useful = out.get("false_positives"), out.get("useful")
    out["observed_fpr"] = (fp / (fp + useful)) if fp is not None and useful is not None and (
        fp + useful) else None
    return out


def fetch(args) -> dict:
    addr = target.router_address(args)
    try:
        doc = rpc.report_json(addr, "FilterReport", getattr(args, "timeout", None)
                              or DEFAULT_TIMEOUT)
    except grpc.RpcError as exc:
        raise from_rpc_error(exc, f"FilterReport via router {addr}") from None
    levels = [lv for rep in doc.get("shards", {}).values() for lv in rep.get("levels", [])]
    doc["cluster_totals"] = _sum(levels)
    return doc


def cmd_filters(args) -> int:
    doc = fetch(args)
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(render_text(doc, args.tables))
    failed = {n: s for n, s in doc.get("sections", {}).items() if not s.get("ok")}
    return PARTIAL if failed else OK


def _row(label: list, r: dict) -> list:
    parts = r.get("partitions")
    touched = r.get("partitions_touched")
    return label + [
        format_count(r.get("tables")) if "tables" in r else "",
        format_count(r.get("keys")),
        "-" if r.get("bits_per_key") is None else f"{r['bits_per_key']:.1f}",
        format_bytes(r.get("filter_bytes")),
        format_bytes(r.get("mapped_bytes")),
        format_bytes(r.get("resident_bytes")),
        f"{format_count(touched)}/{format_count(parts)}",
        format_bytes(r.get("filter_index_bytes")),
        format_ratio(r.get("expected_fpr")),
        format_ratio(r.get("observed_fpr")),
        format_count(r.get("useful")),
        format_count(r.get("positives")),
        format_count(r.get("true_positives")),
    ]


HEADER = ["TABLES", "KEYS", "BITS/KEY", "ON DISK", "MAPPED", "RESIDENT", "PARTS TOUCHED",
          "INDEX", "EXP FPR", "OBS FPR", "USEFUL", "POSITIVE", "TRUE POS"]


def render_text(doc: dict, tables: bool) -> str:
    out = []
    for name in sorted(set(doc.get("shards", {})) | set(doc.get("sections", {}))):
        rep = doc.get("shards", {}).get(name)
        sec = doc.get("sections", {}).get(name, {})
        if rep is None:
            out.append(f"{name}: unavailable: {sec.get('error') or 'no report'}")
            continue
        budget, cap = rep.get("budget") or {}, rep.get("cap") or {}
        out.append(f"{name} ({sec.get('address', '?')}): budget "
                   f"{format_bytes(budget.get('budget_bytes'))}, cap "
                   f"{format_bytes(cap.get('cap_bytes'))}, evictions "
                   f"{format_count(cap.get('evictions'))}")
        rows = []
        for lv in rep.get("levels", []):
            rows.append(_row([f"L{lv.get('level')}", ""], lv))
            if tables:
                for t in lv.get("tables", []):
                    rows.append(_row(["", str(t.get("file", t.get("number", "")))], t))
        rows.append(_row(["total", ""], _sum(rep.get("levels", []))))
        out.append(render(["LEVEL", "TABLE"] + HEADER, rows))
        out.append("")
    out.append("cluster total: " + ", ".join(
        f"{k} {format_bytes(doc['cluster_totals'].get(k))}"
        for k in ("filter_bytes", "mapped_bytes", "resident_bytes")))
    return "\n".join(out)
