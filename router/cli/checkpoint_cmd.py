"""``sievekv checkpoint DIR``: a consistent copy of every shard's data (Admin.Checkpoint).

Each shard flushes, then writes ``DIR/<shard name>`` on its own host: its live tables
hard-linked (copied where DIR is on another file system) beside a manifest describing them,
a directory that opens as that shard's data directory as it is (docs/cli.md, "checkpoint").
DIR is made absolute here; it is a path on the shards' hosts. Exit codes: 0 every shard wrote
its checkpoint; 6 (CONFLICT) a shard's directory exists already (nothing was overwritten);
4 (PARTIAL) some shard failed otherwise; 3 when --timeout passed first. Progress (of copies:
links are instant) shows on stderr unless --quiet.
"""

from __future__ import annotations

import json
import os

import grpc

from sievekv_proto import sievekv_pb2 as pb

from ..humanize import format_bytes, format_count
from .exit_codes import CONFLICT, OK, PARTIAL, CliError
from .report_cmds import _code, long_admin_call
from .verify_cmd import progress_line as _progress_of


def progress_line(shards: dict) -> str:
    """``s0 45% (58.0 MiB of 129 MiB, 3 of 12 tables)`` for the shards checkpointing now
    (linking is instant: this shows copies)."""
    return _progress_of(shards, "checkpoint_running")


def cmd_checkpoint(args) -> int:
    base = os.path.abspath(args.dir)
    sections = long_admin_call(args, "Checkpoint", progress_line, "checkpointing",
                               "the shards finish their checkpoints",
                               request=pb.CheckpointRequest(dir=base))
    failed, exists = [], []
    for s in sections:
        code = _code(s.code)
        if s.ok:
            print(f"{s.shard:<10} {summary(s.json)}")
        else:
            (exists if code == grpc.StatusCode.ALREADY_EXISTS else failed).append(s.shard)
            print(f"{s.shard:<10} FAILED: {code.name if code else s.code}: {s.error}")
    n = len(sections)
    if exists and not failed:
        raise CliError(f"checkpoint: {len(exists)} of {n} shards' directories under {base} "
                       "exist already; nothing was overwritten: choose a new directory", CONFLICT)
    if failed or exists:
        bad = failed + exists
        raise CliError(f"checkpoint: {len(bad)} of {n} shards failed ({', '.join(bad)}); "
                       f"the others' checkpoints under {base} are complete", PARTIAL)
    return OK


def summary(text: str) -> str:
    """``/backups/b1/shard-0: 12 tables, 45.2 MiB (12 linked, 0 copied) in 0.1 s``."""
    try:
        r = json.loads(text) if text else {}
    except ValueError:
        r = {}
    if not r:
        return "checkpoint written"
    n = r.get("tables", 0)
    return (f"{r.get('path', '?')}: {format_count(n)} table{'' if n == 1 else 's'}, "
            f"{format_bytes(r.get('bytes', 0))} ({format_count(r.get('linked', 0))} linked, "
            f"{format_count(r.get('copied', 0))} copied) in {r.get('seconds', 0):.1f} s")
