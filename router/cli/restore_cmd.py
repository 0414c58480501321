"""``sievekv cluster restore CHECKPOINT_DIR``: put a checkpoint (``sievekv checkpoint``) back
in place of a stopped local cluster's data (docs/cli.md, "cluster restore").

Steps, each refusing with one line before anything is changed:

1. Take the cluster lock (held to the end, so no ``cluster start`` runs meanwhile); a running
   cluster holds it, a shard process run by hand holds its directory's engine LOCK: CONFLICT
   (6). An interrupted restore (router/restore_journal.py) or a data directory recorded with
   another slot layout: USAGE (2).
2. CHECKPOINT_DIR holds exactly one complete checkpoint per configured shard, named as the
   shard: no missing, extra or ``*.checkpoint-tmp`` entry, each with ``CURRENT`` and every
   table its manifest lists (engine/db_copy.py ``describe``) and no log with writes in it (a
   data directory: its unflushed writes would be lost): else USAGE (2).
3. Layout: the smallest and largest key of every table must hash (router/slots.py) into the
   slot range the config gives that shard, else USAGE (2). A check of boundary keys only: a
   checkpoint taken before a reshard that moved a boundary passes it. Step 5 checks every
   key; only ``--no-verify`` relies on this check alone.
4. Stage each shard as ``<data_dir>/shard-N.restore-tmp`` (same file system as the data, so
   the swap is a rename): tables hard-linked or copied, manifest and CURRENT copied, synced.
5. Unless ``--no-verify``: open each staged copy with the config's engine options (automatic
   compactions off, no table workers) and check every checksum (engine/verify.py). Damage:
   ERROR (1), as ``sievekv verify``; every staged copy is removed. Then the slot of every
   live key must be in the shard's range (:func:`check_every_slot`), else USAGE (2), staged
   copies removed.
6. Write the journal, move each shard's data directory to
   ``<data_dir>/restore-backup-<UTC time>/shard-N`` and the staged copy into its place (Ctrl-C
   is ignored for these renames), sync, remove the journal, record the layout.

``--finish`` / ``--undo`` settle a restore a crash interrupted in step 6 (router/cli/offline.py
``settle``, shared with ``cluster reshard``).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time

from engine import DB, filenames, verify
from engine.db_copy import IncompleteError, copy_db, describe
from engine.errors import CorruptionError, SieveError, StorageIOError
from engine.checkpoint import STAGING_SUFFIX as CHECKPOINT_STAGING_SUFFIX
from engine.progress import Progress
from engine.vfs import FileSystem

from .. import cluster_state as cs
from .. import preflight
from .. import restore_journal as rj
from ..config import ClusterConfig
from ..humanize import format_bytes, format_count
from ..slots import slot_of
from . import offline, target
from .exit_codes import ERROR, OK, USAGE, CliError
from .progress import StatusLine


def cmd_restore(args) -> int:
    cfg = target.load_config(args)
    if args.finish or args.undo:
        if args.checkpoint:
            raise CliError("--finish and --undo take no CHECKPOINT_DIR (the journal names it)",
                           USAGE)
        if args.finish and args.undo:
            raise CliError("--finish and --undo exclude each other", USAGE)
    elif not args.checkpoint:
        raise CliError("missing CHECKPOINT_DIR (or --finish / --undo)", USAGE)
    base = None if args.finish or args.undo else os.path.abspath(args.checkpoint)
    plan = None
    if not os.path.lexists(cfg.data_dir):  # refuse before the lock creates it
        if base is None:
            raise CliError(offline.nothing_to_settle(cfg), USAGE)
        plan = check_checkpoint(cfg, base, FileSystem())
    lock = offline.take_lock(cfg)
    try:
        rj.mark_running(cfg.data_dir, base)
        try:
            if base is None:
                return offline.settle(cfg, undo=args.undo)
            return _restore(cfg, base, args, plan)
        finally:
            rj.unmark_running(cfg.data_dir)
    finally:
        lock.release()


# ---------------------------------------------------------------------------------------------

def _check_data_dir(cfg: ClusterConfig) -> None:
    why = rj.refusal(cfg.data_dir)
    if why:
        raise CliError(why, USAGE)
    rj.remove_stale_tmp(cfg.data_dir)  # a crash before the journal's rename: nothing swapped
    for s in cfg.shards:
        path = cs.shard_dir(cfg.data_dir, s.index)
        if os.path.islink(path):
            raise CliError(f"{s.name}'s data directory {path} is a symbolic link (to "
                           f"{os.readlink(path)}): a restore would put the restored copy on the "
                           f"data directory's disk and move the link into the backup; replace "
                           f"the link with a directory (or restore into its target by hand); "
                           f"nothing was changed", USAGE)
    offline.check_not_open(cfg, [(s.name, cs.shard_dir(cfg.data_dir, s.index))
                                 for s in cfg.shards])
    try:
        recorded = _recorded_layout(cfg)
    except preflight.PreflightError as exc:
        raise CliError(str(exc), USAGE) from None
    if recorded is not None and recorded != preflight.layout_of(cfg):
        have = ",".join(f"{lo}-{hi}" for lo, hi in recorded.get("slots", []))
        raise CliError(f"{cfg.data_dir} was created with slot ranges {have}, this config has "
                       f"{_ranges(cfg)}: restore into a data directory of this layout (or a new "
                       f"one); nothing was changed", USAGE)


def _recorded_layout(cfg: ClusterConfig) -> dict | None:
    path = os.path.join(cfg.data_dir, cs.LAYOUT_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise preflight.PreflightError(f"cannot read {path}: {exc}", "config") from None


def _ranges(cfg: ClusterConfig) -> str:
    return ",".join(f"{s.slot_start}-{s.slot_end}" for s in cfg.shards)


def check_checkpoint(cfg: ClusterConfig, base: str, fs: FileSystem) -> dict:
    """{shard name: DbFiles} of the checkpoint in ``base`` (steps 2 and 3). CliError if not."""
    if not os.path.isdir(base):
        raise CliError(f"{base} is not a directory", USAGE)
    if _same_dir(base, cfg.data_dir):
        raise CliError(f"{base} is the cluster's data directory, not a checkpoint (take one "
                       f"with `sievekv checkpoint DIR`)", USAGE)
    marks = [n for n in (cs.LOCK_FILE, cs.STATE_FILE, cs.LAYOUT_FILE, rj.JOURNAL_FILE)
             if os.path.lexists(os.path.join(base, n))]
    if marks:
        raise CliError(f"{base} is a cluster's data directory (it holds {marks[0]}), not a "
                       f"checkpoint (take one with `sievekv checkpoint DIR`)", USAGE)
    want = {s.name: s for s in cfg.shards}
    have = sorted(os.listdir(base))
    for name in have:
        if name.endswith(CHECKPOINT_STAGING_SUFFIX):
            raise CliError(f"{os.path.join(base, name)} is an unfinished checkpoint's staging "
                           f"directory: this checkpoint is incomplete", USAGE)
    extra = [n for n in have if n not in want]
    if extra:
        raise CliError(f"{os.path.join(base, extra[0])} is not a shard of this config "
                       f"({len(cfg.shards)} shards, shard-0..shard-{len(cfg.shards) - 1}): a "
                       f"checkpoint of another layout?", USAGE)
    missing = [n for n in want if n not in have]
    if missing:
        raise CliError(f"checkpoint {base} has no {missing[0]} (this config has "
                       f"{len(cfg.shards)} shards)", USAGE)
    out = {}
    for name, spec in want.items():
        path = os.path.join(base, name)
        _check_no_log(name, path)
        try:
            files = describe(fs, path)
        except IncompleteError as exc:
            raise CliError(f"checkpoint {name} is incomplete: {exc}", USAGE) from None
        except CorruptionError as exc:
            raise CliError(f"checkpoint {name} is damaged: {exc}", ERROR) from None
        except StorageIOError as exc:
            raise CliError(f"checkpoint {name} cannot be read: {exc}", ERROR) from None
        _check_slots(cfg, spec, files)
        out[name] = files
    return out


def _same_dir(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _check_no_log(name: str, path: str) -> None:
    """A checkpoint holds no log; a data directory (a restore-backup, a copy of a live one)
    does, and its unflushed writes would be dropped: refused (USAGE)."""
    try:
        names = os.listdir(path)
    except OSError as exc:
        raise CliError(f"checkpoint {name} cannot be read: {cs.os_reason(exc)}",
                       USAGE if cs.unusable_data_dir(exc) else ERROR) from None
    for n in sorted(names):
        parsed = filenames.parse_file_name(n)
        if parsed and parsed[0] == filenames.FileKind.LOG:
            p = os.path.join(path, n)
            try:
                size = os.path.getsize(p)
            except OSError as exc:
                dangling = " (a dangling link)" if os.path.islink(p) else ""
                raise CliError(f"checkpoint {name} cannot be read: {p}{dangling}: "
                               f"{cs.os_reason(exc)}",
                               USAGE if cs.unusable_data_dir(exc) else ERROR) from None
            if size:
                raise CliError(f"{os.path.join(path, n)} is a write-ahead log of {size} bytes: "
                               f"{path} is a data directory, not a checkpoint, and its "
                               f"unflushed writes would be lost (take a checkpoint of it, or "
                               f"put it in place by hand)", USAGE)


def _check_slots(cfg: ClusterConfig, spec, files) -> None:
    for _, f in files.tables:
        for key in (f.smallest, f.largest):
            slot = slot_of(key)
            if not spec.slot_start <= slot <= spec.slot_end:
                owner = next((s.name for s in cfg.shards
                              if s.slot_start <= slot <= s.slot_end), "no shard")
                raise CliError(f"checkpoint {spec.name} holds key slot {slot}, which this config "
                               f"gives to {owner}: restore needs the slot layout the checkpoint "
                               f"was taken with; nothing was changed", USAGE)


def check_every_slot(cfg: ClusterConfig, spec, db, status: StatusLine | None = None) -> int:
    """Step 5's layout proof: the slot of EVERY live key of ``db`` (a staged copy of shard
    ``spec``) is in the range the config gives ``spec``, else CliError (USAGE) naming a key's
    slot and the shard that owns it. A checkpoint records no layout and :func:`_check_slots`
    sees only each table's smallest and largest key: a checkpoint taken before a reshard that
    moved a boundary passes it, and its moved keys would land where the router never looks.
    O(keys) (one scan, one hash per key; docs/cli.md gives the measured rate). Returns the
    number of keys checked."""
    lo, hi = spec.slot_start, spec.slot_end
    n = 0
    t0 = time.monotonic()
    for key, _ in db.scan():
        slot = slot_of(key)
        if not lo <= slot <= hi:
            owner = next((s.name for s in cfg.shards
                          if s.slot_start <= slot <= s.slot_end), "no shard")
            raise CliError(f"checkpoint {spec.name} holds a key of slot {slot}, which this "
                           f"config gives to {owner}: restore needs the slot layout the "
                           f"checkpoint was taken with; nothing was restored", USAGE)
        n += 1
        if status is not None and not n % 65536:
            status.show(f"checking the slot of every key of {spec.name}: {format_count(n)} keys")
    if status is not None:
        status.show(f"checking the slot of every key of {spec.name}: done, {format_count(n)} "
                    f"keys in their range {lo}-{hi} in {time.monotonic() - t0:.1f} s",
                    final=True)
    return n


# ---------------------------------------------------------------------------------------------
# restore
# ---------------------------------------------------------------------------------------------

def _restore(cfg: ClusterConfig, base: str, args, plan: dict | None = None) -> int:
    fs = FileSystem()
    _check_data_dir(cfg)
    if plan is None:
        plan = check_checkpoint(cfg, base, fs)
    status = StatusLine(getattr(args, "quiet", False), tty_every=0.5, plain_every=5.0)
    entries = []
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    backup = offline.new_backup_dir(cfg.data_dir, rj.BACKUP_PREFIX, stamp)
    for s in cfg.shards:
        data = cs.shard_dir(cfg.data_dir, s.index)
        entries.append({"name": s.name, "data": data, "staged": data + rj.STAGING_SUFFIX,
                        "backup": os.path.join(backup, s.name),
                        "had_data": os.path.lexists(data)})
    reports = {}
    try:
        for e in entries:  # a crashed restore's staging (no journal: nothing was swapped)
            for left in (e["staged"], e["data"] + rj.DISCARD_SUFFIX):
                if os.path.lexists(left):
                    shutil.rmtree(left)
        for e in entries:
            e = dict(e, source=os.path.join(base, e["name"]))
            files = plan[e["name"]]
            progress = Progress(len(files.tables), files.bytes)
            with _Shown(status, f"staging {e['name']}", progress):
                reports[e["name"]] = copy_db(fs, e["source"], e["staged"], files, progress)
            fs.sync_dir(cfg.data_dir)
        if not args.no_verify:
            for e in entries:
                _verify(cfg, dict(e, source=os.path.join(base, e["name"])), status)
    except BaseException as exc:
        status.end_line()
        for e in entries:
            shutil.rmtree(e["staged"], ignore_errors=True)
        if isinstance(exc, OSError):  # StorageIOError too: a full disk, EIO, permissions
            raise CliError(f"cannot stage the copies in {cfg.data_dir}: {exc}; nothing was "
                           f"restored (the staged copies are removed)", ERROR) from None
        raise
    status.end_line()

    rel = [dict(e, **{k: rj.relative(cfg.data_dir, e[k]) for k in ("data", "staged", "backup")})
           for e in entries]
    doc = {"checkpoint": base, "backup": rj.relative(cfg.data_dir, backup),
           "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "shards": rel}
    offline.swap(cfg, doc, entries, backup, fs)
    offline.record_layout(cfg)
    for e in entries:
        r = reports[e["name"]]
        n = r["tables"]
        where = (f"old data in {e['backup']}" if e["had_data"] else "no old data")
        check = "" if args.no_verify else ", verified"
        print(f"{e['name']:<10} {format_count(n)} table{'' if n == 1 else 's'}, "
              f"{format_bytes(r['bytes'])} ({format_count(r['linked'])} linked, "
              f"{format_count(r['copied'])} copied{check}); {where}", flush=True)
    print(f"restored {len(entries)} shards from {base} into {cfg.data_dir}; next: "
          f"sievekv cluster start{offline.config_hint(cfg)}", flush=True)
    return OK


def _verify(cfg: ClusterConfig, e: dict, status: StatusLine) -> None:
    name = e["name"]
    try:
        db = DB.open(e["staged"], **offline.engine_options(cfg))
    except StorageIOError as exc:  # writing the staged copy's log or manifest: the data disk
        raise CliError(f"cannot open the staged copy of {name} in {cfg.data_dir}: {exc} (the "
                       f"data directory's disk, not the checkpoint); nothing was restored",
                       ERROR) from None
    except CorruptionError as exc:
        raise CliError(f"checkpoint {name} is damaged: {exc}; nothing was restored",
                       ERROR) from None
    except SieveError as exc:
        raise CliError(f"checkpoint {name} cannot be opened: {exc}; nothing was restored",
                       ERROR) from None
    try:
        with _Shown(status, f"verifying {name}", _ProgressOf(db), final=False):
            report = db.verify()
        if not report["damaged"]:
            n = report["tables"]
            status.show(f"verifying {name}: intact, {format_count(n)} "
                        f"table{'' if n == 1 else 's'}, {format_bytes(report['bytes'])} in "
                        f"{report['seconds']:.1f} s", final=True)
            spec = next(s for s in cfg.shards if s.name == name)
            check_every_slot(cfg, spec, db, status)
    finally:
        db.close()
    if report["damaged"]:
        d = report["damaged"][0]
        more = f" (and {len(report['damaged']) - 1} more)" if len(report["damaged"]) > 1 else ""
        table = os.path.basename(d["file"])
        error = d["error"].replace(e["staged"], e["source"])  # the file the operator has
        raise CliError(f"checkpoint {name}: table {table} is damaged{more}: {error}; "
                       f"nothing was restored", ERROR)


class _ProgressOf:
    """The engine's verify progress of ``db`` (None before it starts), shaped like Progress."""

    def __init__(self, db):
        self.db = db

    def report(self) -> dict | None:
        return verify.running(self.db)


class _Shown:
    """Show ``what``'s progress on ``status`` from a thread while the block runs (and, with
    ``final``, its last state when the block succeeds)."""

    def __init__(self, status: StatusLine, what: str, progress, final: bool = True):
        self.status, self.what, self.progress, self.final = status, what, progress, final
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _line(self) -> str | None:
        r = self.progress.report()
        if not r:
            return None
        pct = min(100, 100 * r["bytes_done"] // max(1, r["bytes"]))
        return (f"{self.what}: {pct}% ({format_bytes(r['bytes_done'])} of "
                f"{format_bytes(r['bytes'])}, {r['tables_done']} of {r['tables']} tables)")

    def _run(self) -> None:
        while not self.stop.wait(0.2):
            line = self._line()
            if line:
                self.status.show(line)

    def __enter__(self):
        if not self.status.quiet:
            self.thread.start()
        return self

    def __exit__(self, exc_type, *rest):
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()
        if exc_type is None and self.final:
            line = self._line()
            if line:
                self.status.show(line.replace(f"{self.what}:", f"{self.what}: done,", 1),
                                 final=True)
        return False

