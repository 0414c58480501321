"""``sievekv stats | flush | compact | config``: cluster-wide admin calls through the router,
and the config helpers. (``filters`` has its own module: router/cli/filters.py.)

A fan-out call that some shards failed exits 4 (PARTIAL) after printing what the others said.
"""

from __future__ import annotations

import json
import math
import sys
import threading

import grpc

from shard.status import one_line

from ..config import default_config_text
from ..humanize import format_bytes, format_count, format_counted, format_duration
from . import config_toml, rpc, target
from .exit_codes import (ERROR, INTERRUPTED, OK, PARTIAL, UNREACHABLE, CliError, code_for_grpc,
                         from_rpc_error)
from .filters import cmd_filters  # noqa: F401  (re-exported for app.py)
from .progress import StatusLine
from .table import render

DEFAULT_TIMEOUT = 30.0
COMPACT_DEADLINE = 1e6  # compact waits as long as it takes (the largest --timeout)
PROGRESS_TTY_S = 1.0  # compact's progress: rewritten this often on a terminal,
PROGRESS_PLAIN_S = 10.0  # and a line this often otherwise


def timeout(args) -> float:
    return getattr(args, "timeout", None) or DEFAULT_TIMEOUT


def _report(args, method: str) -> dict:
    addr = target.router_address(args)
    try:
        return rpc.report_json(addr, method, timeout(args))
    except grpc.RpcError as exc:
        raise from_rpc_error(exc, f"{method} via router {addr}") from None


def _failed_shards(doc: dict) -> dict:
    return {name: s.get("error") or f"code {s.get('code')}"
            for name, s in doc.get("sections", {}).items() if not s.get("ok")}


def _finish_partial(doc: dict, what: str) -> int:
    """OK, or PARTIAL after the one error line every failure gets, naming each failed shard
    with its error: ``Stats failed on s1: ...`` or ``Stats failed on 2 of 3 shards: s1: ...;
    s2: ...``."""
    failed = _failed_shards(doc)
    if not failed:
        return OK
    each = "; ".join(f"{name}: {err}" for name, err in sorted(failed.items()))
    where = (f"on {each}" if len(failed) == 1 else
             f"on {len(failed)} of {len(doc.get('sections', failed))} shards: {each}")
    raise CliError(f"{what} failed {where}", PARTIAL)


# ---------------------------------------------------------------------------------------------
# stats
# ---------------------------------------------------------------------------------------------

def _level_sum(s: dict, field: str) -> int:
    return sum(lv.get(field, 0) for lv in s.get("levels", []))


def _hit_rate(s: dict) -> str:
    bc = s.get("block_cache", {})
    n = bc.get("hits", 0) + bc.get("misses", 0)
    return f"{100 * bc.get('hits', 0) / n:.1f}%" if n else "-"


def _ratio(x) -> str:
    """A compression ratio (raw / stored data bytes) as ``2.91x``; ``-`` without data."""
    return "-" if x is None else f"{x:.2f}x"


def _per_get(s: dict) -> str:
    x = s.get("data_blocks_read_per_get")
    return "-" if x is None else f"{x:.2f}"


# (header, function of one shard's stats -> cell)
STATS_COLUMNS = [
    ("TABLES", lambda s: format_count(_level_sum(s, "tables"))),
    ("TABLE BYTES", lambda s: format_bytes(s.get("total_table_bytes"))),
    ("COMPRESSED", lambda s: _ratio(s.get("compression", {}).get("ratio"))),
    ("ENTRIES", lambda s: format_count(_level_sum(s, "entries"))),
    ("MEMTABLE", lambda s: format_bytes(s.get("memtable", {}).get("bytes"))),
    ("LOG", lambda s: format_bytes(s.get("log", {}).get("bytes"))),
    ("WRITES", lambda s: format_count(s.get("writes"))),
    ("GETS", lambda s: format_count(s.get("gets"))),
    ("BLOCKS/GET", _per_get),
    ("CACHE HITS", _hit_rate),
    ("FLUSHES", lambda s: format_count(s.get("flushes"))),
    ("COMPACTIONS", lambda s: format_count(s.get("compactions"))),
    ("STALL", lambda s: f"{s.get('write_stall', {}).get('total_seconds', 0):.2f}s"),
    # Table worker processes alive now (each holds its own memory; an idle one exits after a
    # minute): what `ps` shows beside the shard.
    ("WORKERS", lambda s: format_count((s.get("table_workers") or {}).get("running"))),
]


def cmd_stats(args) -> int:
    doc = _report(args, "Stats")
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
        return _finish_partial(doc, "Stats")
    shards = doc.get("shards", {})
    rows = []
    for name in sorted(set(shards) | set(doc.get("sections", {}))):
        s = shards.get(name)
        rows.append([name] + (["-"] * len(STATS_COLUMNS) if s is None else
                              [cell(s) for _, cell in STATS_COLUMNS]))
    print(render(["SHARD"] + [h for h, _ in STATS_COLUMNS], rows))
    for name, s in sorted(shards.items()):
        lv = [f"L{x['level']} {format_counted(x['tables'], 'table')} {format_bytes(x['bytes'])}"
              + (f" ({_ratio(x['compression_ratio'])})"
                 if x.get("compression_ratio") not in (None, 1.0) else "")
              for x in s.get("levels", []) if x.get("tables")]
        if lv:
            print(f"{name}: " + ", ".join(lv))
        reasons = compaction_reasons(s)
        if reasons:
            print(f"{name}: compactions {reasons}")
        due = tombstone_due(s)
        if due:
            print(f"{name}: {due}")
        workers_off = (s.get("table_workers") or {}).get("disabled")
        if workers_off:
            print(f"{name}: table workers off, flushes and compactions run in the shard's "
                  f"threads until it restarts: {workers_off}")
        if s.get("failed"):
            how = ("writes refused until a flush succeeds (retrying)" if s.get("failed_retrying")
                   else "writes refused until the shard restarts")
            print(f"{name}: background error, {how}: {s['failed']}")
        running = running_compaction(s)
        if running:
            print(f"{name}: compacting {running}")
        held = write_slowdown(s)
        if held:
            print(f"{name}: {held}")
        kept = held_by_reads(s)
        if kept:
            print(f"{name}: {kept}")
        if s.get("native_speedups") is False:  # absent (an older shard): nothing to say
            print(f"{name}: {SPEEDUPS_OFF}")
    return _finish_partial(doc, "Stats")


SPEEDUPS_OFF = ("compiled speed-ups off: point reads run their Python versions, same answers, "
                "slower (engine/speedups.py)")
"""The line of a shard whose engine runs without engine/_speedups (not built, built from other
source or by another checkout, or turned off with SIEVEKV_PURE_PYTHON=1)."""


def held_by_reads(s: dict) -> str:
    """The line of a shard whose older reads keep tables that compactions replaced (open and
    on disk), or "": ``2 tables (64.0 MiB) compacted away still held by older reads (scans,
    snapshots; the oldest snapshot open 1h02m)``. A Scan stream its client stops reading
    holds them until its deadline."""
    snaps = s.get("snapshots") or {}
    n = snaps.get("held_tables")
    if not n:
        return ""
    age = snaps.get("oldest_age_seconds")
    oldest = (f"; the oldest snapshot open {format_duration(math.ceil(age))}"
              if age is not None else "")
    return (f"{format_count(n)} table{'s' if n != 1 else ''} "
            f"({format_bytes(snaps.get('held_table_bytes'))}) compacted away still held by "
            f"older reads (scans, snapshots{oldest})")


def write_slowdown(s: dict) -> str:
    """The line of a shard whose writes are held to its write controller's rate now (L0 at
    its slowdown trigger; engine/write_controller.py), or ""."""
    stall = s.get("write_stall") or {}
    if not stall.get("delayed"):
        return ""
    l0 = next((x.get("tables") for x in s.get("levels", []) if x.get("level") == 0), None)
    where = f"L0 holds {format_counted(l0, 'table')}" if l0 is not None else "L0"
    return (f"writes held to {format_bytes(stall.get('delayed_write_rate'))}/s ({where}, at "
            f"its slowdown trigger: compactions are behind; the rate follows them)")


# ---------------------------------------------------------------------------------------------
# flush, compact
# ---------------------------------------------------------------------------------------------

def _everywhere(args, method: str, done: str) -> int:
    return _print_sections(_call_everywhere(args, method), method, done)


def _call_everywhere(args, method: str, request=None) -> list:
    """Admin.<method> (with ``request``, else an empty one) through the router: the per-shard
    sections (also of a call that failed on some shards)."""
    addr = target.router_address(args)
    try:
        resp, _ = rpc.admin_call(addr, method, timeout(args), request)
        return list(resp.shards)
    except grpc.RpcError as exc:
        sections = _sections_from_trailer(exc)
        if sections is None:
            err = from_rpc_error(exc, f"{method} via router {addr}")
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise _DeadlineExceeded(str(err), err.code) from None
            raise err from None
        return list(sections)


class _DeadlineExceeded(CliError):
    """The call's deadline passed (the server may still be working on it)."""


def _print_sections(sections: list, method: str, done: str, raise_on_failure: bool = True) -> int:
    """Print one line per shard section; raise CliError if any failed: PARTIAL when others
    succeeded, else the exit code of the failures' status (docs/cli.md "Exit codes": DATA_LOSS
    is 1, RESOURCE_EXHAUSTED 7...) when they agree, 1 when they differ. The error line names
    each failed shard with its status and error, as ``_finish_partial`` does."""
    failures = []
    for s in sections:
        if s.ok:
            print(f"{s.shard:<10} {done}")
        else:
            code = _code(s.code)
            failures.append((s, code))
            print(f"{s.shard:<10} FAILED: {code.name if code else s.code}: {s.error}")
    if failures and raise_on_failure:
        each = "; ".join(f"{s.shard}: {c.name if c else s.code}: {one_line(s.error, 300)}"
                         for s, c in failures)
        if len(failures) < len(sections):
            exit_code = PARTIAL
        else:
            codes = {code_for_grpc(c, s.error) for s, c in failures}
            exit_code = codes.pop() if len(codes) == 1 else ERROR
        raise CliError(f"{method} failed on {len(failures)} of {len(sections)} shards: {each}",
                       exit_code)
    return OK


def _code(n: int):
    for c in grpc.StatusCode:
        if c.value[0] == n:
            return c
    return None


def _sections_from_trailer(exc: grpc.RpcError):
    """The per-shard AdminResponse a failed fan-out attaches as ``sievekv-admin-result-bin``."""
    from sievekv_proto import sievekv_pb2 as pb

    md = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    for key, value in md or ():
        if key == "sievekv-admin-result-bin":
            return pb.AdminResponse.FromString(value).shards
    return None


def cmd_flush(args) -> int:
    return _everywhere(args, "Flush", "flushed")


def cmd_compact(args) -> int:
    """Compact every shard fully. A full compaction of a large shard takes minutes, so unlike
    the other calls this one has no deadline unless ``--timeout`` sets one, and while it runs
    each shard's progress (output bytes written of its input bytes, from Stats) is shown on
    stderr (``--quiet``: not). Ctrl-C stops waiting, not the shards."""
    sections = long_admin_call(args, "Compact", compaction_progress, "compacting",
                               "the shards go on compacting")
    # The router gives up on a shard a little before the client's deadline and reports it as
    # a DEADLINE_EXCEEDED section: that shard is still compacting, it has not failed.
    late = [s.shard for s in sections
            if not s.ok and _code(s.code) == grpc.StatusCode.DEADLINE_EXCEEDED]
    if late:
        _print_sections([s for s in sections if s.shard not in late], "Compact", "compacted",
                        raise_on_failure=False)
        for name in late:
            print(f"{name:<10} still compacting")
        raise CliError(f"compact: gave up waiting for {', '.join(late)} after --timeout "
                       f"{args.timeout:g} s; they go on compacting; `sievekv stats` shows "
                       f"their progress", UNREACHABLE)
    return _print_sections(sections, "Compact", "compacted")


def long_admin_call(args, method: str, progress_of, label: str, going_on: str,
                    request=None) -> list:
    """Admin.<method> on every shard with no deadline unless ``--timeout``, showing
    ``label: progress_of(shards' stats)`` on stderr meanwhile (not with ``--quiet``, nor when
    ``progress_of`` is None); the
    per-shard sections. Ctrl-C and a passed --timeout stop the waiting, not the shards, and
    say so (``going_on``)."""
    if getattr(args, "timeout", None) is None:
        args.timeout = COMPACT_DEADLINE
    stop = threading.Event()
    watcher = None
    if progress_of is not None and not getattr(args, "quiet", False):
        watcher = threading.Thread(target=watch_progress, daemon=True,
                                   args=(target.router_address(args), stop, progress_of, label))
        watcher.start()
    name = method.lower()
    try:
        return _call_everywhere(args, method, request)
    except KeyboardInterrupt:
        raise CliError(f"{name} interrupted: {going_on}; `sievekv stats` shows their progress",
                       INTERRUPTED) from None
    except _DeadlineExceeded as exc:
        raise CliError(f"{name}: gave up waiting after --timeout {args.timeout:g} s; "
                       f"{going_on}; `sievekv stats` shows their progress", exc.code) from None
    finally:
        stop.set()
        if watcher is not None:
            watcher.join(5)  # its last line ends before the results are printed


def compaction_progress(shards: dict) -> str:
    """One line for the shards' running compactions (``stats()["compaction_running"]``), or
    "" when none runs: ``s0 L0->L2 45% (58 MiB of 129 MiB, 12 s); s1 ...``."""
    return "; ".join(f"{name} {running_compaction(s)}" for name, s in sorted(shards.items())
                     if running_compaction(s))


def compaction_reasons(stats: dict) -> str:
    """``l0-count 3, tombstones 2 (180,000 tombstones dropped)``: one shard's compactions
    since it opened by reason (engine/compaction/picker.py), "" before the first."""
    by = stats.get("compactions_by_reason") if isinstance(stats, dict) else None
    if not by:
        return ""
    text = ", ".join(f"{r} {format_count(n)}" for r, n in sorted(by.items()))
    dropped = stats.get("tombstones_dropped")
    return text + (f" ({format_counted(dropped, 'tombstone')} dropped)" if dropped else "")


def tombstone_due(stats: dict) -> str:
    """``tombstone compaction due in 42s (tombstone_compaction_delay)``: when a table dense
    with tombstones that the delay holds back becomes old enough to compact
    (``stats()["tombstone_compaction_due_in_s"]``), "" when none is held back."""
    due = stats.get("tombstone_compaction_due_in_s") if isinstance(stats, dict) else None
    if due is None:
        return ""
    return (f"tombstone compaction due in {format_duration(math.ceil(due))} "
            "(tombstone_compaction_delay)")


def running_compaction(stats: dict) -> str:
    """``L0->L2 45% (58 MiB of 129 MiB, 12 s)`` for one shard's stats, "" when it is not
    compacting; with the task's reason after the levels when the shard reports one and the
    compaction is not a manual one (``L6->L6 tombstones 45% ...``: a table rewritten in place
    without its tombstones). The
    percentage is output bytes written of input bytes, at most 99 while it runs (overwritten
    keys and dropped tombstones make the output smaller than the input)."""
    run = stats.get("compaction_running") if isinstance(stats, dict) else None
    if not run:
        return ""
    pct = min(99, 100 * run["written_bytes"] // max(1, run["input_bytes"]))
    reason = f"{run['reason']} " if run.get("reason") and not run.get("manual") else ""
    return (f"L{run['level']}->L{run['output_level']} {reason}{pct}% "
            f"({format_bytes(run['written_bytes'])} of {format_bytes(run['input_bytes'])}, "
            f"{run['seconds']:.0f} s)")


def watch_progress(addr: str, stop: threading.Event, progress_of, label: str) -> None:
    """Show ``label: progress_of(each shard's stats)`` on stderr until ``stop``, polled every
    PROGRESS_TTY_S seconds on a terminal (the line rewritten), every PROGRESS_PLAIN_S
    otherwise; nothing while it is "". Best effort: the long call itself reports failures."""
    line = StatusLine(tty_every=0, plain_every=0)  # this loop sets the pace
    every = PROGRESS_TTY_S if line.tty else PROGRESS_PLAIN_S
    while not stop.wait(every):
        try:
            now = progress_of(rpc.report_json(addr, "Stats", every).get("shards", {}))
        except Exception:  # noqa: BLE001 - a thread must never print a traceback
            continue
        if now and not stop.is_set():
            line.show(f"{label}: {now}")
    line.end_line()


# ---------------------------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------------------------

def cmd_config_default(args) -> int:
    """The embedded default, whatever --config / $SIEVEKV_CONFIG say (a note on stderr says
    so when one is set: the effective config is `config show`)."""
    named = target.config_path(args)
    if named:
        print(f"sievekv: note: this is the embedded default config, not {named}; "
              f"`sievekv config show` prints the effective one", file=sys.stderr, flush=True)
    sys.stdout.write(default_config_text())
    return OK


def cmd_config_show(args) -> int:
    """The effective config (--config / $SIEVEKV_CONFIG / embedded default, with --data-dir /
    $SIEVEKV_DATA_DIR applied) as a complete, loadable TOML file."""
    cfg = target.load_config(args)
    header = [f"sievekv effective configuration (`sievekv config show`), resolved from "
              f"{cfg.source}."]
    override = target.data_dir_override(args)
    if override:
        header.append(f"data_dir comes from {override}.")
    header += ["Every option is given; `sievekv config check --config FILE` loads it back."]
    try:
        text = config_toml.render(cfg, "\n".join(header))
    except ValueError as exc:
        raise CliError(f"config show: {exc}", ERROR) from None
    sys.stdout.write(text)
    return OK


def cmd_config_check(args) -> int:
    cfg = target.load_config(args)
    print(json.dumps(cfg.to_dict(), indent=2, sort_keys=True))
    return OK
