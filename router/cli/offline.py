"""Pieces shared by the commands that work on a **stopped local cluster's** data directory
(``cluster restore``: router/cli/restore_cmd.py, ``cluster reshard``: router/cli/reshard_cmd.py):
the cluster lock, the "open in another process" check, the engine options of an offline open,
the printed next step, and ``--finish`` / ``--undo`` of an interrupted restore or reshard
(router/restore_journal.py holds the journal and the per-shard swaps).

Nothing here talks to a server.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import sys
import time

from engine import filenames
from engine.errors import LockedError
from engine.vfs import FileSystem

from .. import cluster_state as cs
from .. import preflight
from .. import restore_journal as rj
from ..config import DEFAULT_CONFIG_NAME, ClusterConfig, ConfigError, load
from .exit_codes import CONFLICT, ERROR, OK, USAGE, CliError


def nothing_to_settle(cfg: ClusterConfig, op: str = "restore") -> str:
    return (f"{cfg.data_dir} holds no interrupted {op} ({rj.journal_path(cfg.data_dir)} "
            f"does not exist); nothing to do")


def take_lock(cfg: ClusterConfig):
    """The cluster lock, held by this command (lifecycle's check, keeping the lock)."""
    path = cs.lock_path(cfg.data_dir)
    try:
        os.makedirs(cfg.data_dir, exist_ok=True)
        return FileSystem().lock(path)
    except LockedError:
        other = rj.running(cfg.data_dir)
        if other:
            raise CliError(f"data directory {cfg.data_dir} is locked by "
                           f"{rj.running_line(other)}: wait for it to end; nothing was changed",
                           CONFLICT) from None
        raise CliError(f"data directory {cfg.data_dir} is locked by a running cluster; stop it "
                       f"first with `sievekv cluster stop`; nothing was changed",
                       CONFLICT) from None
    except OSError as exc:
        raise CliError(f"cannot open the cluster lock {path}: {cs.os_reason(exc)}",
                       USAGE if cs.unusable_data_dir(exc) else ERROR) from None


# ---------------------------------------------------------------------------------------------
# checks (nothing changed)


def check_not_open(cfg: ClusterConfig, dirs: list[tuple[str, str]]) -> None:
    """CONFLICT if a shard process run by hand (outside the supervisor) has one of ``dirs``
    ((shard name, directory)) open: its engine LOCK is held."""
    for name, path in dirs:
        lock = os.path.join(path, filenames.LOCK)
        if not os.path.exists(lock):
            continue
        try:
            FileSystem().lock(lock).release()
        except LockedError:
            raise CliError(f"{name}'s data directory is open in another process (its "
                           f"{lock} is locked): stop it first; nothing was changed",
                           CONFLICT) from None
        except OSError:
            pass  # not ours to judge here: staging or the swap reports real trouble


def layout_ranges(layout: dict) -> str:
    return ",".join(f"{lo}-{hi}" for lo, hi in layout.get("slots", []))


def record_layout(cfg: ClusterConfig) -> None:
    """Write cluster-layout.json in a new data directory (``cluster start`` would too)."""
    try:
        preflight.check_layout(cfg)
    except (OSError, preflight.PreflightError) as exc:
        print(f"sievekv: warning: the layout was not recorded: {exc}", file=sys.stderr)


def config_hint(cfg: ClusterConfig) -> str:
    """The options of the printed ``next: sievekv cluster start``: ``--config`` unless the
    default config, and ``--data-dir`` when the data directory is not the config's own (given
    by --data-dir or $SIEVEKV_DATA_DIR): without it the start would open another directory."""
    hint = "" if cfg.source == DEFAULT_CONFIG_NAME else f" --config {shlex.quote(cfg.source)}"
    try:
        own = load(None if cfg.source == DEFAULT_CONFIG_NAME else cfg.source,
                   check_filters=False).data_dir
    except (ConfigError, OSError):
        own = None  # the config cannot be read again: name the directory to be safe
    if own != cfg.data_dir:
        hint += f" --data-dir {shlex.quote(cfg.data_dir)}"
    return hint


def engine_options(cfg: ClusterConfig) -> dict:
    """The config's engine options for opening a staged copy: no compaction may rewrite it
    while it is checked, no worker processes, and nothing is created where CURRENT is missing."""
    opts = dict(cfg.engine)
    opts.update(disable_auto_compactions=True, table_workers=0, create_if_missing=False)
    return opts


def settle(cfg: ClusterConfig, undo: bool, op: str = "restore") -> int:
    """``cluster restore --finish/--undo`` (``op`` "restore") or ``cluster reshard
    --finish/--undo`` (``op`` "reshard"): the journal must be of that operation."""
    rj.remove_stale_tmp(cfg.data_dir)  # a crash before the journal's rename: nothing swapped
    try:
        doc = rj.read(cfg.data_dir)
    except rj.JournalError as exc:
        raise CliError(str(exc), ERROR) from None
    if doc is None:
        raise CliError(nothing_to_settle(cfg, op), USAGE)
    jpath = rj.journal_path(cfg.data_dir)
    if rj.operation(doc) != op:
        other = rj.operation(doc)
        raise CliError(f"{jpath} is the journal of an interrupted `sievekv cluster {other}`, "
                       f"not of a {op}: settle it with `sievekv cluster {other} --finish` or "
                       f"`--undo`; nothing was changed", USAGE)
    entries = [rj.resolve(cfg.data_dir, e) for e in doc["shards"]]
    root = os.path.join(os.path.realpath(cfg.data_dir), "")
    outside = [e["data"] for e in entries
               if not os.path.join(os.path.realpath(os.path.dirname(e["data"])), "")
               .startswith(root)]
    gone = [e["data"] for e in entries if e.get("had_data")
            and not (os.path.lexists(e["data"]) or os.path.lexists(e["backup"]))]
    if outside or gone:
        raise CliError(f"the journal {jpath} names {(outside or gone)[0]}, which "
                       f"{'is outside' if outside else 'is gone and has no backup in'} "
                       f"{cfg.data_dir}: the journal's paths are gone (was the data directory "
                       f"moved?); settle it by hand; nothing was changed", ERROR)
    check_not_open(cfg, [(e["name"], p) for e in entries
                          for p in (e["data"], e["staged"], e["backup"])])
    fs = FileSystem()
    if not undo:
        if doc.get("undo_started"):
            raise CliError(f"a `sievekv cluster {op} --undo` of this {op} began at "
                           f"{doc['undo_started']}: run `sievekv cluster {op} --undo` again "
                           f"to complete it (journal {jpath} kept)", USAGE)
        for e in entries:  # before any rename: a copy that is not complete is never installed
            try:
                rj.check_staged(e, fs, op)
            except rj.JournalError as exc:
                raise CliError(f"{exc} (journal {jpath} kept)", ERROR) from None
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        if undo and not doc.get("undo_started"):
            doc = dict(doc, undo_started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            rj.write(cfg.data_dir, doc, fs)  # from here on --finish refuses
        for e in entries:
            try:
                how = rj.undo_shard(e, fs) if undo else rj.finish_shard(e, fs, op)
            except rj.JournalError as exc:
                raise CliError(f"{exc} (journal {jpath} kept)", ERROR) from None
            print(f"{e['name']:<10} {how}", flush=True)
        if op == rj.RESHARD:  # the layout that goes with the data, before the journal goes
            rj.write_layout(cfg.data_dir, doc["old_layout" if undo else "new_layout"], fs)
        rj.remove(cfg.data_dir, fs)
    except OSError as exc:  # StorageIOError too: a rename, a deletion, the journal's rewrite
        raise CliError(f"cannot {'undo' if undo else 'finish'} the {op} in {cfg.data_dir}: "
                       f"{exc}; run it again once that is fixed (journal {jpath} kept)",
                       ERROR) from None
    finally:
        signal.signal(signal.SIGINT, old)
    rj.remove_empty_backup(cfg.data_dir, doc)
    if op == rj.RESHARD:
        backup = os.path.join(cfg.data_dir, doc["backup"])
        if undo:
            print(f"the reshard is undone: {cfg.data_dir} holds the data and the slot layout "
                  f"({layout_ranges(doc['old_layout'])}) it held before", flush=True)
        else:
            kept = backup if os.path.isdir(backup) else "(there was none)"
            print(f"the reshard is finished: {cfg.data_dir} holds the slot layout "
                  f"{layout_ranges(doc['new_layout'])}; old data in {kept}; next: sievekv "
                  f"cluster start{config_hint(cfg)}", flush=True)
        return OK
    if undo:
        print(f"the restore from {doc['checkpoint']} is undone: {cfg.data_dir} holds the data "
              f"it held before", flush=True)
    else:
        record_layout(cfg)
        backup = os.path.join(cfg.data_dir, doc["backup"])
        kept = backup if os.path.isdir(backup) else "(there was none)"
        print(f"the restore from {doc['checkpoint']} is finished; old data in {kept}; next: "
              f"sievekv cluster start{config_hint(cfg)}", flush=True)
    return OK


def swap(cfg: ClusterConfig, doc: dict, entries: list[dict], backup: str, fs: FileSystem,
         op: str = "restore", new_layout: dict | None = None) -> None:
    """The swap of ``cluster restore`` or ``cluster reshard`` (``op``) under its journal:
    write the journal ``doc``, make the ``backup`` directory, move each entry's old data there
    and its staged copy into place (restore_journal.finish_shard), write ``new_layout`` if
    given, remove the journal, then an empty backup directory. Ctrl-C is ignored meanwhile
    (a few renames). Raises CliError (ERROR): before the journal was written the staged
    copies are removed and nothing changed; after it, the journal stays for ``--finish`` /
    ``--undo`` and the message says so."""
    done = "restored" if op == "restore" else "resharded"
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a few renames: not cut in between
    try:
        rj.write(cfg.data_dir, doc, fs)
        os.makedirs(backup, exist_ok=True)
        fs.sync_dir(cfg.data_dir)
        for e in entries:
            rj.finish_shard(e, fs, op)
        if new_layout is not None:
            rj.write_layout(cfg.data_dir, new_layout, fs)
        rj.remove(cfg.data_dir, fs)
    except (OSError, rj.JournalError) as exc:
        if not os.path.lexists(rj.journal_path(cfg.data_dir)):  # failed before the journal
            for e in entries:
                shutil.rmtree(e["staged"], ignore_errors=True)
            raise CliError(f"cannot write the {op} journal in {cfg.data_dir}: {exc}; nothing "
                           f"was {done}", ERROR) from None
        raise CliError(f"{op} stopped while swapping directories: {exc}; "
                       f"{rj.refusal(cfg.data_dir)}", ERROR) from None
    finally:
        signal.signal(signal.SIGINT, old)
    rj.remove_empty_backup(cfg.data_dir, doc)


def new_backup_dir(data_dir: str, prefix: str, stamp: str) -> str:
    """``<data_dir>/<prefix><stamp>``, or with ``-2``, ``-3``... appended if that exists (two
    runs within one second)."""
    path = os.path.join(data_dir, prefix + stamp)
    n = 1
    while os.path.lexists(path):
        n += 1
        path = os.path.join(data_dir, f"{prefix}{stamp}-{n}")
    return path
