"""``sievekv verify``: check every checksum of every table on every shard (Admin.Verify).

Scrubbing reads every table file again while the shards serve, so damage that no read has
touched yet is found (docs/cli.md, "verify"). Like ``compact`` it has no deadline unless
``--timeout`` and shows each shard's progress on stderr (``--quiet``: not). Exit codes: 0 all
intact; 1 (ERROR) a shard found damage, each damaged file and offset printed; 4 (PARTIAL) a
shard could not be checked (unreachable, failed) and none found damage; 3 when --timeout passed
first (the shards finish their check; ``sievekv stats`` shows their progress).
"""

from __future__ import annotations

import json

import grpc

from ..humanize import format_bytes, format_count
from .exit_codes import ERROR, OK, PARTIAL, UNREACHABLE, CliError
from .report_cmds import _code, long_admin_call


def cmd_verify(args) -> int:
    sections = long_admin_call(args, "Verify", progress_line, "verifying",
                               "the shards finish their check")
    damaged, failed, late = [], [], []
    for s in sections:
        code = _code(s.code)
        if s.ok:
            print(f"{s.shard:<10} intact: {summary(s.json)}")
        elif code == grpc.StatusCode.DATA_LOSS:
            damaged.append(s.shard)
            print(f"{s.shard:<10} DAMAGED: {s.error}")
        elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
            late.append(s.shard)
            print(f"{s.shard:<10} still checking")
        else:
            failed.append(s.shard)
            print(f"{s.shard:<10} NOT CHECKED: {code.name if code else s.code}: {s.error}")
    n = len(sections)
    if damaged:
        unchecked = f"; {len(failed) + len(late)} not checked" if failed or late else ""
        raise CliError(f"verify: damage found on {len(damaged)} of {n} shards "
                       f"({', '.join(damaged)}){unchecked}", ERROR)
    if late:
        raise CliError(f"verify: gave up waiting for {', '.join(late)} after --timeout "
                       f"{args.timeout:g} s; they finish their check", UNREACHABLE)
    if failed:
        others = "; the others are intact" if len(failed) < n else ""
        raise CliError(f"verify: {len(failed)} of {n} shards could not be checked "
                       f"({', '.join(failed)}){others}", PARTIAL)
    return OK


def section_report(text: str) -> dict:
    """A shard section's JSON report ({} if absent or unreadable: the line still prints)."""
    try:
        r = json.loads(text) if text else {}
    except ValueError:
        return {}
    return r if isinstance(r, dict) else {}


def summary(text: str) -> str:
    """``12 tables, 3,201 data blocks, 1 filter partition, 45.2 MiB in 0.8 s``."""
    r = section_report(text)
    if not r:
        return "checked"
    return (f"{_count(r.get('tables', 0), 'table')}, "
            f"{_count(r.get('data_blocks', 0), 'data block')}, "
            f"{_count(r.get('filter_partitions', 0), 'filter partition')}, "
            f"{format_bytes(r.get('bytes', 0))} in {r.get('seconds', 0):.1f} s")


def _count(n: int, what: str) -> str:
    return f"{format_count(n)} {what}{'' if n == 1 else 's'}"


def progress_line(shards: dict, field: str = "verify_running") -> str:
    """``s0 45% (58.0 MiB of 129 MiB, 3 of 12 tables); s1 ...`` for the shards verifying now
    (``field``: the stats entry of another long call with the same report, e.g.
    ``checkpoint_running``)."""
    parts = []
    for name, s in sorted(shards.items()):
        run = s.get(field) if isinstance(s, dict) else None
        if run:
            pct = min(99, 100 * run["bytes_done"] // max(1, run["bytes"]))
            parts.append(f"{name} {pct}% ({format_bytes(run['bytes_done'])} of "
                         f"{format_bytes(run['bytes'])}, {run['tables_done']} of "
                         f"{run['tables']} tables)")
    return "; ".join(parts)
