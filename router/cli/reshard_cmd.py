"""``sievekv cluster reshard``: move a stopped local cluster's keys to a new slot layout (more
shards, fewer shards, other ranges) without losing one (docs/cli.md, "cluster reshard").

The config given is the NEW layout; the data directory's ``cluster-layout.json`` is the OLD one.
Its i-th slot range is the range of the directory ``shard-i`` (router/cluster_state.py
``shard_dir``): a shard is its index, old and new. Steps, each refusing with one line before
anything is changed:

1. Take the cluster lock (held to the end): a running cluster or another restore/reshard holds
   it, a shard process run by hand holds its directory's engine LOCK: CONFLICT (6). An
   interrupted restore or reshard (router/restore_journal.py), no data directory or no layout
   yet, an old shard directory missing or a symbolic link, a directory in the way of a new
   shard: USAGE (2). The same layout: "nothing to move", OK.
2. Plan (:func:`plan`): shard i is *unchanged* when its range is the same in both layouts; its
   directory is not touched (not even read). Every other shard is rewritten: a new DB
   ``shard-i.reshard-tmp`` (same file system) is filled by scanning each changed old shard
   and writing every live key to the new shard that owns its slot (tombstones and overwritten
   versions are not copied). A key whose slot is outside its old shard's range is refused
   (ERROR): it was unreachable, and copying it could overwrite the real owner's value.
3. Free space: the changed shards' live data (tables and logs) must fit on the data disk
   (statvfs), else ERROR with the numbers.
4. Count check: each staged DB, closed and opened again, holds as many keys as were written
   to it, and the keys written are the keys read: else ERROR, staged copies removed.
5. Swap under the journal, as ``cluster restore`` does: old directories of changed shards move
   to ``reshard-backup-<UTC>/`` (never deleted), staged DBs into place, a shard the new
   layout drops only moves to the backup, and ``cluster-layout.json`` is replaced (atomic)
   before the journal is removed. ``--finish`` / ``--undo`` settle a reshard a crash
   interrupted in this step (router/cli/offline.py ``settle``).

Offline only: nothing here talks to a server, and remote shards are not handled.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field

import mmh3

from engine import DB, filenames
from engine.db_copy import describe
from engine.errors import CorruptionError, LockedError, SieveError
from engine.vfs import FileSystem

from .. import cluster_state as cs
from .. import restore_journal as rj
from ..config import NUM_SLOTS, ClusterConfig
from ..humanize import format_bytes, format_count
from ..slots import slot_of
from . import offline, target
from .exit_codes import CONFLICT, ERROR, OK, USAGE, CliError
from .progress import StatusLine

BATCH_KEYS = 1000
BATCH_BYTES = 1 << 20


def cmd_reshard(args) -> int:
    cfg = target.load_config(args)
    if args.finish and args.undo:
        raise CliError("--finish and --undo exclude each other", USAGE)
    return run(cfg, finish=args.finish, undo=args.undo, quiet=args.quiet)


def run(cfg: ClusterConfig, *, finish: bool = False, undo: bool = False,
        quiet: bool = False) -> int:
    """The command on a loaded config: lock, then reshard or settle. Raises CliError."""
    if not os.path.isdir(cfg.data_dir):  # refuse before the lock creates it
        if finish or undo:
            raise CliError(offline.nothing_to_settle(cfg, rj.RESHARD), USAGE)
        raise CliError(f"{cfg.data_dir} is not a data directory yet (no cluster was started "
                       f"there): there is nothing to reshard; start the cluster with this "
                       f"config instead", USAGE)
    lock = offline.take_lock(cfg)
    try:
        rj.mark_running(cfg.data_dir, None, rj.RESHARD)
        try:
            if finish or undo:
                return offline.settle(cfg, undo=undo, op=rj.RESHARD)
            return reshard(cfg, quiet=quiet)
        finally:
            rj.unmark_running(cfg.data_dir)
    finally:
        lock.release()


# ---------------------------------------------------------------------------------------------
# plan (pure)
# ---------------------------------------------------------------------------------------------

@dataclass
class ShardPlan:
    """What happens to ``shard-<index>``: kind is "unchanged", "rewritten", "new" or "removed"."""

    index: int
    kind: str
    old: tuple[int, int] | None  # slot range in the old layout (None: a new shard)
    new: tuple[int, int] | None  # slot range in the new layout (None: a removed shard)
    keys_before: int = 0
    bytes_before: int = 0
    keys_after: int = 0
    bytes_after: int = 0
    moved_out: int = 0  # keys read here that another shard owns now
    to: dict = field(default_factory=dict)  # new index -> keys this old shard sent there
    digest_after: int = 0  # pair_digest sum of the (key, value) pairs written to this new shard
    entries_at_most: int = 0  # the old shard's entries before reading (stats: tables + memtable)

    @property
    def name(self) -> str:
        return f"shard-{self.index}"


def plan(old: list[tuple[int, int]], new: list[tuple[int, int]]) -> list[ShardPlan]:
    """One ShardPlan per index of either layout (ranges: inclusive, contiguous, in order)."""
    out = []
    for i in range(max(len(old), len(new))):
        o = tuple(old[i]) if i < len(old) else None
        n = tuple(new[i]) if i < len(new) else None
        kind = ("unchanged" if o == n else "new" if o is None else "removed" if n is None
                else "rewritten")
        out.append(ShardPlan(i, kind, o, n))
    return out


def owner_index(new: list[tuple[int, int]]):
    """slot -> index of the new shard that owns it (bisect over the range starts)."""
    starts = [lo for lo, _ in new]

    def owner(slot: int) -> int:
        return bisect.bisect_right(starts, slot) - 1
    return owner


def check_layout_doc(doc, path: str) -> list[tuple[int, int]]:
    """The slot ranges of a cluster-layout.json document; CliError (ERROR) unless they are
    contiguous, in order, and cover every slot."""
    slots = doc.get("slots") if isinstance(doc, dict) else None
    ok = isinstance(slots, list) and slots
    expect = 0
    for r in slots if ok else ():
        if (not isinstance(r, list) or len(r) != 2 or r[0] != expect or r[1] < r[0]
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in r)):
            ok = False
            break
        expect = r[1] + 1
    if not ok or expect != NUM_SLOTS:
        raise CliError(f"{path} does not hold a slot layout this build can read (contiguous "
                       f"ranges covering slots 0-{NUM_SLOTS - 1}): settle it by hand; nothing "
                       f"was changed", ERROR)
    return [(lo, hi) for lo, hi in slots]


# ---------------------------------------------------------------------------------------------
# checks (nothing changed)
# ---------------------------------------------------------------------------------------------

def _old_layout(cfg: ClusterConfig) -> list[tuple[int, int]]:
    path = os.path.join(cfg.data_dir, cs.LAYOUT_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        held = [n for n in sorted(os.listdir(cfg.data_dir))
                if re.fullmatch(r"shard-[0-9]+", n) and not is_empty_shard_dir(
                    os.path.join(cfg.data_dir, n))]
        if held:
            # Never advise the new config: its start would record the NEW layout over data
            # written with another one, and keys would be looked up on the wrong shards.
            raise CliError(f"{cfg.data_dir} has shard directories holding data ({held[0]}, "
                           f"...) but no slot layout record ({path} is missing): recreate it "
                           f"with the slot ranges the data was written with (`sievekv cluster "
                           f"start` with the config the data was created with writes it; stop "
                           f"the cluster again), then reshard; nothing was changed",
                           USAGE) from None
        raise CliError(f"{cfg.data_dir} has no slot layout yet ({path} does not exist) and no "
                       f"shard holds data: there is nothing to reshard; start the cluster "
                       f"with this config instead", USAGE) from None
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read {path}: {exc}; nothing was changed", ERROR) from None
    return check_layout_doc(doc, path)


def _check_dirs(cfg: ClusterConfig, shards: list[ShardPlan]) -> None:
    for p in shards:
        path = cs.shard_dir(cfg.data_dir, p.index)
        if os.path.islink(path):
            raise CliError(f"{p.name}'s data directory {path} is a symbolic link (to "
                           f"{os.readlink(path)}): replace the link with a directory first; "
                           f"nothing was changed", USAGE)
        if p.old is not None and not os.path.isdir(path):
            raise CliError(f"the recorded layout gives slots {p.old[0]}-{p.old[1]} to "
                           f"{p.name}, but {path} is not a directory: its keys cannot be found; "
                           f"put it back (or settle by hand); nothing was changed", USAGE)
        if p.old is None and os.path.lexists(path):
            raise CliError(f"{path} exists, but the recorded layout has only "
                           f"{p.index} shards: it would be replaced by the new {p.name}; move it "
                           f"away first; nothing was changed", USAGE)
    offline.check_not_open(cfg, [(p.name, cs.shard_dir(cfg.data_dir, p.index)) for p in shards
                             if p.old is not None])


def is_empty_shard_dir(path: str) -> bool:
    """True if ``path`` holds no keys the engine would open: empty, or no ``CURRENT`` and
    nothing but the engine's ``LOCK``, manifests and temp files (a shard killed on its first
    start, before CURRENT: ``cluster start`` opens it as a new, empty DB, engine/recovery.py
    step 2). A table or a log without CURRENT is not empty: the engine refuses it as damaged."""
    try:
        names = os.listdir(path)
    except OSError:
        return False
    empty_kinds = (filenames.FileKind.LOCK, filenames.FileKind.MANIFEST, filenames.FileKind.TEMP)
    for n in names:
        parsed = filenames.parse_file_name(n)
        if parsed is None or parsed[0] not in empty_kinds:
            return False
        if not os.path.isfile(os.path.join(path, n)):
            return False
    return True


def live_bytes(path: str) -> int:
    """Bytes of a closed DB's live tables and logs (the size of a rewrite, at most)."""
    fs = FileSystem()
    try:
        n = describe(fs, path).bytes
    except (SieveError, OSError):
        n = None
    total = 0
    for name in os.listdir(path):
        if n is None or name.endswith(".log"):
            try:
                total += os.path.getsize(os.path.join(path, name))
            except OSError:
                pass
    return total + (n or 0)


def check_room(data_dir: str, need: int, free: int | None = None) -> None:
    """CliError (ERROR) if ``need`` bytes clearly do not fit on ``data_dir``'s disk."""
    if free is None:
        st = os.statvfs(data_dir)
        free = st.f_bavail * st.f_frsize
    if free < need:
        raise CliError(f"the rewritten shards need about {format_bytes(need)} on the disk of "
                       f"{data_dir}, which has {format_bytes(free)} free: free "
                       f"{format_bytes(need - free)} or more first; nothing was changed", ERROR)


# ---------------------------------------------------------------------------------------------
# reshard
# ---------------------------------------------------------------------------------------------

def reshard(cfg: ClusterConfig, quiet: bool = False) -> int:
    """Steps 1-5 of the module docstring. REQUIRES: the cluster lock held."""
    why = rj.refusal(cfg.data_dir)
    if why:
        raise CliError(why, USAGE)
    rj.remove_stale_tmp(cfg.data_dir)  # a crash before the journal's rename: nothing swapped
    old = _old_layout(cfg)
    new = [(s.slot_start, s.slot_end) for s in cfg.shards]
    shards = plan(old, new)
    if old != new:
        _check_dirs(cfg, shards)
    # A crashed reshard's staged copies go before anything else is judged: they take room on
    # the disk, and "nothing to move" must not leave them (as large as the data) behind.
    _remove_leftovers(cfg.data_dir)
    if old == new:
        print(f"{cfg.data_dir} has the slot layout of this config already "
              f"({len(new)} shards): nothing to move", flush=True)
        return OK
    changed = [p for p in shards if p.kind != "unchanged"]
    sources = [p for p in changed if p.old is not None]
    check_room(cfg.data_dir, sum(live_bytes(cs.shard_dir(cfg.data_dir, p.index))
                                 for p in sources))

    fs = FileSystem()
    status = StatusLine(quiet, tty_every=0.5, plain_every=5.0)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    backup = offline.new_backup_dir(cfg.data_dir, rj.RESHARD_BACKUP_PREFIX, stamp)
    entries = []
    for p in changed:
        data = cs.shard_dir(cfg.data_dir, p.index)
        entries.append({"name": p.name, "data": data,
                        "staged": data + rj.RESHARD_STAGING_SUFFIX,
                        "backup": os.path.join(backup, p.name), "had_data": p.old is not None,
                        "removed": p.new is None})
    try:
        _stage(cfg, shards, entries, new, status, fs)
    except BaseException as exc:
        status.end_line()
        for e in entries:
            shutil.rmtree(e["staged"], ignore_errors=True)
        if isinstance(exc, CliError):
            raise
        if isinstance(exc, OSError):  # StorageIOError too: a full disk, EIO, permissions
            raise CliError(f"cannot write the new shards in {cfg.data_dir}: {exc}; nothing was "
                           f"resharded (the staged copies are removed)", ERROR) from None
        if isinstance(exc, SieveError):  # a damaged old table, a value over the new limit
            raise CliError(f"reshard failed: {exc}; nothing was resharded (the staged copies "
                           f"are removed)", ERROR) from None
        raise
    status.end_line()
    _swap(cfg, entries, backup, old, new, fs)
    _report(cfg, shards, entries, backup, old, new)
    return OK


def _remove_leftovers(data_dir: str) -> list[str]:
    """Remove (and name on stdout, even with -q: data is deleted) the staged copies of a reshard that crashed before
    its journal (nothing was swapped). REQUIRES: the cluster lock held, no journal. Returns
    the names removed."""
    gone = []
    for name in sorted(os.listdir(data_dir)):
        if name.startswith("shard-") and (name.endswith(rj.RESHARD_STAGING_SUFFIX)
                                          or name.endswith(rj.DISCARD_SUFFIX)):
            shutil.rmtree(os.path.join(data_dir, name))
            gone.append(name)
    if gone:
        print(f"removed what an interrupted reshard left (nothing of it was swapped in): "
              f"{', '.join(gone)}", flush=True)
    return gone


STAGING_MEMTABLE_BYTES = 4 << 20
DIGEST_MOD = 1 << 128


def pair_digest(key: bytes, value: bytes) -> int:
    """A 128-bit hash of one (key, value) pair (length-prefixed key, so that the split of
    key and value is part of it). Summed mod 2**128 it is a digest of a set of pairs that
    does not depend on their order: the count check compares the sum written to a new shard
    with the sum read back from it."""
    return mmh3.hash128(len(key).to_bytes(4, "little") + key + value, signed=False)


def _new_options(cfg: ClusterConfig) -> dict:
    """The config's engine options for a new shard DB; no worker processes in the CLI. Every
    new shard's DB is open at once while the old shards are read, so each gets a memtable of
    at most STAGING_MEMTABLE_BYTES (4 MiB), not the config's (the server uses the config's)."""
    opts = dict(cfg.engine, table_workers=0, create_if_missing=True, error_if_exists=True)
    opts["memtable_bytes"] = min(opts.get("memtable_bytes", STAGING_MEMTABLE_BYTES),
                                 STAGING_MEMTABLE_BYTES)
    return opts


def _stage(cfg, shards, entries, new, status, fs) -> None:
    owner = owner_index(new)
    by_index = {p.index: p for p in shards}
    staged = {int(e["name"].split("-")[1]): e["staged"] for e in entries if not e["removed"]}
    dbs = {}
    try:
        for i, path in staged.items():
            dbs[i] = DB.open(path, **_new_options(cfg))
        for p in shards:
            if p.kind == "unchanged" or p.old is None:
                continue
            _copy_shard(cfg, p, dbs, by_index, owner, status)
        total = sum(by_index[i].keys_after for i in dbs)
        status.show(f"writing the new shards' last memtables to tables and checking every "
                    f"new shard ({format_count(total)} keys)", final=True)
        for i in list(dbs):
            dbs[i].flush()
            dbs.pop(i).close()
    finally:
        for db in dbs.values():
            try:
                db.close()
            except Exception:  # noqa: BLE001 - the first failure is the one to report
                pass
    # Count check: each staged DB opened again holds what was written to it: as many keys, and
    # the same (key, value) pairs (an order-independent digest, pair_digest).
    read = sum(p.keys_before for p in shards if p.kind != "unchanged")
    written = 0
    for i, path in staged.items():
        p = by_index[i]
        n = digest = 0
        with DB.open(path, read_only=True, **offline.engine_options(cfg)) as db:
            for key, value in db.scan():
                n += 1
                digest += pair_digest(key, value)
        if n != p.keys_after:
            raise CliError(f"{p.name}: {format_count(p.keys_after)} keys were written to its "
                           f"new copy, which holds {format_count(n)}: nothing was resharded "
                           f"(the staged copies are removed)", ERROR)
        if digest % DIGEST_MOD != p.digest_after:
            raise CliError(f"{p.name}: its new copy holds {format_count(n)} keys as written, "
                           f"but not the same keys and values (digest of the pairs read back "
                           f"differs): nothing was resharded (the staged copies are removed)",
                           ERROR)
        status.show(f"checked {p.name}: {format_count(n)} keys, the pairs written", final=True)
        written += n
        fs.sync_dir(path)
    if written != read:
        raise CliError(f"{format_count(read)} keys were read from the changed shards, "
                       f"{format_count(written)} written to the new ones: nothing was resharded "
                       f"(the staged copies are removed)", ERROR)
    fs.sync_dir(cfg.data_dir)


def _copy_shard(cfg, p: ShardPlan, dbs, by_index, owner, status) -> None:
    """Scan old shard ``p`` and write each live key to its new owner's staged DB."""
    path = cs.shard_dir(cfg.data_dir, p.index)
    lo, hi = p.old
    if is_empty_shard_dir(path):  # a shard that never opened (or never wrote) its DB: no keys
        status.show(_reading_line(p, done=True), final=True)
        return
    try:
        # Read-only (engine/read_only.py): recovery replays the logs without writing, so a
        # refusal after reading (or a crash) leaves the old shard byte for byte as it was.
        src = DB.open(path, read_only=True, **offline.engine_options(cfg))
    except LockedError:
        raise CliError(f"{p.name}'s data directory is open in another process: stop it first; "
                       f"nothing was resharded", CONFLICT) from None
    except CorruptionError as exc:
        raise CliError(f"{p.name} is damaged: {exc}; nothing was resharded", ERROR) from None
    batches: dict[int, list] = {}
    sizes: dict[int, int] = {}
    try:
        st = src.stats()
        p.entries_at_most = (sum(lv["entries"] - lv["tombstones"] for lv in st["levels"])
                             + st["memtable"]["entries"])  # (read-only: no frozen memtable)
        for key, value in src.scan():
            slot = slot_of(key)
            if not lo <= slot <= hi:
                raise CliError(f"{p.name} holds a key of slot {slot}, outside its slot range "
                               f"{lo}-{hi} (the router never sent it there): it is not copied "
                               f"anywhere by guess; nothing was resharded", ERROR)
            j = owner(slot)
            n = len(key) + len(value)
            p.keys_before += 1
            p.bytes_before += n
            p.to[j] = p.to.get(j, 0) + 1
            dst = by_index[j]
            dst.keys_after += 1
            dst.bytes_after += n
            dst.digest_after = (dst.digest_after + pair_digest(key, value)) % DIGEST_MOD
            if j != p.index:
                p.moved_out += 1
            b = batches.setdefault(j, [])
            b.append((key, value))
            sizes[j] = sizes.get(j, 0) + n
            if len(b) >= BATCH_KEYS or sizes[j] >= BATCH_BYTES:
                dbs[j].write(b, sync=False)
                batches[j], sizes[j] = [], 0
                status.show(_reading_line(p))
        for j, b in batches.items():
            if b:
                dbs[j].write(b, sync=False)
    finally:
        src.close()
    status.show(_reading_line(p, done=True), final=True)


def _reading_line(p: ShardPlan, done: bool = False) -> str:
    head = (f"reading {p.name}: {'done, ' if done else ''}{format_count(p.keys_before)} keys, "
            f"{format_bytes(p.bytes_before)}")
    if not done:
        # The old shard's entries (overwritten versions and deletions included) bound its keys
        # from above: the percentage is a lower bound of the progress.
        most = max(p.entries_at_most, p.keys_before, 1)
        return (f"{head} ({min(100, 100 * p.keys_before // most)}% of at most "
                f"{format_count(most)} entries)")
    to = ", ".join(f"shard-{j} {format_count(n)}" for j, n in sorted(p.to.items()))
    return f"{head} -> {to or 'none'} ({format_count(p.moved_out)} moved to another shard)"


def _swap(cfg, entries, backup, old, new, fs) -> None:
    rel = [dict(e, **{k: rj.relative(cfg.data_dir, e[k]) for k in ("data", "staged", "backup")})
           for e in entries]
    doc = {"operation": rj.RESHARD, "backup": rj.relative(cfg.data_dir, backup),
           "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "old_layout": {"slots": [list(r) for r in old]},
           "new_layout": {"slots": [list(r) for r in new]}, "shards": rel}
    offline.swap(cfg, doc, entries, backup, fs, rj.RESHARD, doc["new_layout"])


def _shards(n: int) -> str:
    return f"{n} shard{'' if n == 1 else 's'}"


def _report(cfg, shards, entries, backup, old, new) -> None:
    where = {e["name"]: e["backup"] for e in entries}

    def rng(r):
        return f"{r[0]}-{r[1]}"

    for p in shards:
        before = f"{format_count(p.keys_before)} keys, {format_bytes(p.bytes_before)}"
        after = f"{format_count(p.keys_after)} keys, {format_bytes(p.bytes_after)}"
        if p.kind == "unchanged":
            line = f"unchanged ({rng(p.new)}), not read"
        elif p.kind == "new":
            line = f"new ({rng(p.new)}): {after}"
        elif p.kind == "removed":
            line = (f"removed (was {rng(p.old)}): {before} moved to other shards; old data in "
                    f"{where[p.name]}")
        else:
            line = (f"{rng(p.old)} -> {rng(p.new)}: {before} -> {after}; old data in "
                    f"{where[p.name]}")
        print(f"{p.name:<10} {line}", flush=True)
    read = sum(p.keys_before for p in shards)
    moved = sum(p.moved_out for p in shards)
    print(f"resharded from {_shards(len(old))} to {_shards(len(new))} in {cfg.data_dir}: "
          f"{format_count(read)} keys rewritten, {format_count(moved)} moved to another shard; "
          f"next: sievekv cluster start{offline.config_hint(cfg)}", flush=True)
