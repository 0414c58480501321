"""``sievekv checkpoint DIR``: a consistent copy of every shard's data (Admin.Checkpoint).

Each shard flushes, then writes ``DIR/<shard name>`` on its own host: its live tables
hard-linked (copied where DIR is on another file system) beside a manifest describing them,
a directory that opens as that shard's data directory as it is (docs/cli.md, "checkpoint").
DIR is made absolute here (an empty one is refused: 2, USAGE); it is a path on the shards'
hosts. Exit codes: 0 every shard wrote
its checkpoint; 6 (CONFLICT) a shard's directory exists already or another checkpoint is
writing it (nothing was overwritten); 2 (USAGE) no shard can use DIR (a file in the way, no permission, read-only); 4 (PARTIAL) some
shard failed otherwise; 3 when --timeout
passed first (the shards finish their checkpoints). Progress (of copies:
links are instant) shows on stderr unless --quiet.
"""

from __future__ import annotations

import os

import grpc

from sievekv_proto import sievekv_pb2 as pb

from ..humanize import format_bytes, format_count
from .exit_codes import CONFLICT, OK, PARTIAL, UNREACHABLE, USAGE, CliError
from .report_cmds import _code, long_admin_call
from .verify_cmd import progress_line as _progress_of
from .verify_cmd import section_report


def progress_line(shards: dict) -> str:
    """``s0 45% (58.0 MiB of 129 MiB, 3 of 12 tables)`` for the shards checkpointing now
    (linking is instant: this shows copies)."""
    return _progress_of(shards, "checkpoint_running")


def cmd_checkpoint(args) -> int:
    if not args.dir:  # `"$DIR"` unset: abspath would make it the current directory
        raise CliError("checkpoint: DIR is an empty path; give the directory to write the "
                       "checkpoint to", USAGE)
    base = os.path.abspath(args.dir)
    sections = long_admin_call(args, "Checkpoint", progress_line, "checkpointing",
                               "the shards finish their checkpoints",
                               request=pb.CheckpointRequest(dir=base))
    failed, exists, late, invalid = [], [], [], []
    for s in sections:
        code = _code(s.code)
        if s.ok:
            print(f"{s.shard:<10} {summary(s.json)}")
        elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
            late.append(s.shard)
            print(f"{s.shard:<10} still writing its checkpoint")
        else:
            (exists if code == grpc.StatusCode.ALREADY_EXISTS else failed).append(s.shard)
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                invalid.append(s.shard)
            print(f"{s.shard:<10} FAILED: {code.name if code else s.code}: {s.error}")
    n = len(sections)
    done = n - len(failed) - len(exists) - len(late)
    if late and not failed and not exists:
        raise CliError(f"checkpoint: gave up waiting for {', '.join(late)} after --timeout "
                       f"{args.timeout:g} s; they finish their checkpoints", UNREACHABLE)
    if exists and not failed and not late:
        raise CliError(f"checkpoint: {len(exists)} of {n} shards' directories under {base} "
                       "exist already or are being written; nothing was overwritten: choose a "
                       "new directory", CONFLICT)
    if invalid and invalid == failed and not exists and not late and not done:
        raise CliError(f"checkpoint: no shard can use {base} (see above)", USAGE)
    if failed or exists or late:
        bad = failed + exists + late
        others = (f"; the other {done} shards' checkpoints under {base} are complete"
                  if done else "")
        raise CliError(f"checkpoint: {len(bad)} of {n} shards did not write one "
                       f"({', '.join(bad)}){others}", PARTIAL)
    return OK


def summary(text: str) -> str:
    """``/backups/b1/shard-0: 12 tables, 45.2 MiB (12 linked, 0 copied) in 0.1 s``."""
    r = section_report(text)
    if not r:
        return "checkpoint written"
    n = r.get("tables", 0)
    return (f"{r.get('path', '?')}: {format_count(n)} table{'' if n == 1 else 's'}, "
            f"{format_bytes(r.get('bytes', 0))} ({format_count(r.get('linked', 0))} linked, "
            f"{format_count(r.get('copied', 0))} copied) in {r.get('seconds', 0):.1f} s")
