"""The restore journal of a local cluster: ``<data_dir>/restore-journal.json``.

``sievekv cluster restore`` (router/cli/restore_cmd.py) stages every shard's copy first, then
writes this file (synced) and only then swaps directories, one rename pair per shard::

    <data_dir>/shard-N            -> <backup>/shard-N        (the old data, if there was any)
    <data_dir>/shard-N.restore-tmp -> <data_dir>/shard-N     (the staged, verified copy)

and removes the file when every shard is swapped. While it exists, the data directory may hold
some shards restored and others not: ``cluster start`` (router/preflight.py) and ``cluster
restore`` refuse, and ``cluster restore --finish`` or ``--undo`` settle it. Each step is
idempotent and decided from which of the paths exist, so either can be run again after a
crash of its own. Nothing here deletes old data: ``--undo`` removes only staged or restored
copies (the checkpoint they came from is untouched), and first renames such a copy to
``shard-N.restore-discard`` (atomic) so that a partly deleted copy never sits where
``--finish`` looks. ``--undo`` marks the journal (``undo_started``) before it changes anything;
from then on ``--finish`` refuses, and ``--finish`` installs only a staged copy that is complete
(engine/db_copy.py ``describe``).

Paths in the journal are relative to the data directory (a moved data directory settles in
its new place); a journal of an older build may hold absolute paths, which :func:`resolve`
keeps as they are.

Schema (version 1)::

    {"version": 1, "operation": "restore" | "reshard" (absent: "restore", older builds),
     "checkpoint": abs path (restore only), "backup": path, "started_at": ISO-8601 UTC,
     "undo_started": ISO-8601 UTC (only once --undo began),
     "old_layout", "new_layout": cluster-layout.json documents (reshard only),
     "shards": [{"name": "shard-0", "data": path, "staged": path, "backup": path,
                 "had_data": bool, "removed": bool (reshard: no staged copy, the old data
                 only moves to the backup)}, ...]}

``sievekv cluster reshard`` (router/cli/reshard_cmd.py) uses the same journal with
``"operation": "reshard"``: its staged copies are ``shard-N.reshard-tmp``, its backups
``reshard-backup-<UTC>/``, a shard the new layout drops is a ``removed`` entry, and settling it
also writes ``new_layout`` (finish) or ``old_layout`` (undo) to ``cluster-layout.json`` before
the journal is removed (:func:`write_layout`).

While a restore runs it also leaves ``<data_dir>/restore-running.json`` (its pid, see
:func:`mark_running`), so that ``cluster start`` / ``stop`` / ``status`` can say a restore holds
the cluster lock rather than name the last supervisor.
"""

from __future__ import annotations

import json
import os
import shutil
import time

import psutil

from engine.errors import SieveError
from engine.vfs import FileSystem, default_fs

from . import cluster_state as cs

JOURNAL_FILE = "restore-journal.json"
JOURNAL_VERSION = 1
STAGING_SUFFIX = ".restore-tmp"
DISCARD_SUFFIX = ".restore-discard"  # a copy --undo renamed out of the way and deletes
RUNNING_FILE = "restore-running.json"
BACKUP_PREFIX = "restore-backup-"
RESHARD = "reshard"
RESHARD_STAGING_SUFFIX = ".reshard-tmp"
RESHARD_BACKUP_PREFIX = "reshard-backup-"


def operation(doc: dict) -> str:
    """"restore" or "reshard": what wrote the journal (or the running file) ``doc``."""
    return doc.get("operation") or "restore"


class JournalError(Exception):
    """The journal cannot be read or acted on. ``str()`` is one line for the user."""


def journal_path(data_dir: str) -> str:
    return os.path.join(data_dir, JOURNAL_FILE)


def read(data_dir: str) -> dict | None:
    """The journal of ``data_dir``, or None if there is none. JournalError if unreadable."""
    path = journal_path(data_dir)
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise JournalError(f"cannot read the restore journal {path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("version") != JOURNAL_VERSION:
        raise JournalError(f"restore journal {path} has an unknown format version")
    return doc


def tmp_path(data_dir: str) -> str:
    """The journal's temporary file; one left by a crash is never a journal (the rename that
    makes the journal had not happened, so nothing was swapped): :func:`remove_stale_tmp`."""
    return journal_path(data_dir) + ".tmp"


def remove_stale_tmp(data_dir: str) -> None:
    try:
        os.remove(tmp_path(data_dir))
    except FileNotFoundError:
        pass


def resolve(data_dir: str, entry: dict) -> dict:
    """``entry`` with its paths made absolute (relative ones are relative to ``data_dir``)."""
    return dict(entry, **{k: os.path.join(data_dir, entry[k])
                          for k in ("data", "staged", "backup")})


def relative(data_dir: str, path: str) -> str:
    return os.path.relpath(path, data_dir)


def write(data_dir: str, doc: dict, fs: FileSystem | None = None) -> None:
    """Create the journal (temporary file, fsync, rename, directory fsync)."""
    fs = fs or default_fs()
    doc = dict(doc, version=JOURNAL_VERSION)
    cs.replace_file(fs, data_dir, journal_path(data_dir), tmp_path(data_dir),
                    json.dumps(doc, indent=1).encode())


def remove(data_dir: str, fs: FileSystem | None = None) -> None:
    fs = fs or default_fs()
    fs.remove(journal_path(data_dir))
    fs.sync_dir(data_dir)


def refusal(data_dir: str) -> str | None:
    """One line saying that an interrupted restore must be settled first, or None if there is
    no journal. Used by ``cluster start`` (preflight) and ``cluster restore``."""
    path = journal_path(data_dir)
    if not os.path.lexists(path):
        return None
    try:
        doc = read(data_dir) or {}
    except JournalError:
        doc = {}
    if operation(doc) == RESHARD:
        return (f"{data_dir} holds an interrupted reshard ({path}): some shards may be "
                f"resharded and others not; finish it with `sievekv cluster reshard --finish` "
                f"or put the old data and layout back with `sievekv cluster reshard --undo`")
    what = f" from {doc['checkpoint']}" if doc.get("checkpoint") else ""
    return (f"{data_dir} holds an interrupted restore{what} ({path}): some shards may be "
            f"restored and others not; finish it with `sievekv cluster restore --finish` or put "
            f"the old data back with `sievekv cluster restore --undo`")


def _sync_parent(fs: FileSystem, path: str) -> None:
    fs.sync_dir(os.path.dirname(path))


def check_staged(entry: dict, fs: FileSystem | None = None, op: str = "restore") -> None:
    """JournalError unless the staged copy of ``entry`` (absolute paths) is absent or a complete
    DB: ``CURRENT`` and every live table with its recorded size. Reads only. ``op`` ("restore"
    or RESHARD): the operation whose ``--undo`` the message names."""
    fs = fs or default_fs()
    staged = entry["staged"]
    if not os.path.lexists(staged):
        return
    # Imported here: engine.db_copy loads the manifest and log readers (and numpy), and every
    # `sievekv` command imports this module through lifecycle/status (~0.15 s CPU each).
    from engine.db_copy import describe
    try:
        describe(fs, staged)
    except (SieveError, OSError) as exc:
        raise JournalError(f"{entry['name']}: the staged copy {staged} is not complete ({exc}): "
                           f"it is not installed; put the old data back with `sievekv cluster "
                           f"{op} --undo`") from None


def finish_shard(entry: dict, fs: FileSystem | None = None, op: str = "restore") -> str:
    """Swap one shard (module docstring); ``entry``'s paths absolute (:func:`resolve`).
    Returns "swapped" or "done already". A staged copy that is not complete is refused
    (:func:`check_staged`) before anything is renamed."""
    fs = fs or default_fs()
    data, staged, backup = entry["data"], entry["staged"], entry["backup"]
    if entry.get("removed"):
        return _retire(fs, entry)
    check_staged(entry, fs, op)
    if not os.path.lexists(staged):
        if not os.path.lexists(data):
            raise JournalError(f"{entry['name']}: neither {staged} nor {data} exists; the "
                               f"old data (if any) is in {backup}")
        return "done already"
    if os.path.lexists(data):
        if os.path.lexists(backup):
            raise JournalError(f"{entry['name']}: {data}, {staged} and {backup} all exist; "
                               f"settle this shard by hand")
        _to_backup(fs, data, backup)
    fs.rename(staged, data)
    _sync_parent(fs, data)
    return "swapped"


def _to_backup(fs: FileSystem, data: str, backup: str) -> None:
    parent = os.path.dirname(backup)
    if not os.path.isdir(parent):
        os.makedirs(parent, exist_ok=True)
        _sync_parent(fs, parent)  # the new backup directory's entry
    fs.rename(data, backup)
    _sync_parent(fs, backup)
    if os.path.dirname(data) != parent:
        _sync_parent(fs, data)  # the source directory of a cross-directory rename


def _retire(fs: FileSystem, entry: dict) -> str:
    """finish_shard of a ``removed`` entry (reshard): its data only moves to the backup."""
    data, backup = entry["data"], entry["backup"]
    if os.path.lexists(data):
        if os.path.lexists(backup):
            raise JournalError(f"{entry['name']}: both {data} and {backup} exist; settle this "
                               f"shard by hand")
        _to_backup(fs, data, backup)
        return "removed"
    if not os.path.lexists(backup):
        raise JournalError(f"{entry['name']}: neither {data} nor {backup} exists; settle this "
                           f"shard by hand")
    return "done already"


def _unretire(fs: FileSystem, entry: dict) -> str:
    """undo_shard of a ``removed`` entry: its data comes back from the backup."""
    data, backup = entry["data"], entry["backup"]
    if os.path.lexists(backup):
        if os.path.lexists(data):
            raise JournalError(f"{entry['name']}: both {data} and {backup} exist; settle this "
                               f"shard by hand")
        fs.rename(backup, data)
        _sync_parent(fs, data)
        _sync_parent(fs, backup)
        return "old data back"
    if not os.path.lexists(data):
        raise JournalError(f"{entry['name']}: neither {data} nor {backup} exists; settle this "
                           f"shard by hand")
    return "not moved"


def undo_shard(entry: dict, fs: FileSystem | None = None) -> str:
    """Put one shard's old data back and drop its staged or restored copy; ``entry``'s paths
    absolute (:func:`resolve`). Returns what it did. A copy to drop is first renamed to
    ``<data>.restore-discard`` and only then deleted, so a deletion cut short leaves nothing
    under a name that ``--finish`` would install."""
    fs = fs or default_fs()
    data, staged, backup = entry["data"], entry["staged"], entry["backup"]
    if entry.get("removed"):
        return _unretire(fs, entry)
    discard = data + DISCARD_SUFFIX
    if not any(os.path.lexists(p) for p in (data, staged, backup, discard)):
        if entry.get("had_data"):
            raise JournalError(f"{entry['name']}: none of {data}, {staged}, {backup} exists: "
                               f"the journal's paths are gone (was the data directory moved?); "
                               f"settle this shard by hand")
        return "not restored"
    if os.path.lexists(data) and not os.path.lexists(staged):
        if entry.get("had_data") and not os.path.lexists(backup):
            # never swapped and never staged, or undone already (but for a discard to delete)
            how = "old data back" if os.path.lexists(discard) else "not restored"
            _drop(fs, discard)
            return how
        _discard(fs, data, discard)  # the restored copy: out of the way first
    if os.path.lexists(backup):
        if os.path.lexists(data):
            raise JournalError(f"{entry['name']}: both {data} and {backup} exist; settle this "
                               f"shard by hand")
        fs.rename(backup, data)
        _sync_parent(fs, data)
        _sync_parent(fs, backup)
    if os.path.lexists(staged):
        _discard(fs, staged, discard)
    _drop(fs, discard)
    return "old data back"


def _discard(fs: FileSystem, path: str, discard: str) -> None:
    """Rename ``path`` to ``discard`` (an earlier, cut-short discard is deleted first)."""
    _drop(fs, discard)
    fs.rename(path, discard)
    _sync_parent(fs, discard)


def _drop(fs: FileSystem, discard: str) -> None:
    if os.path.lexists(discard):
        shutil.rmtree(discard)
        _sync_parent(fs, discard)


def write_layout(data_dir: str, layout: dict, fs: FileSystem | None = None) -> None:
    """Atomically make ``layout`` the data directory's ``cluster-layout.json`` (reshard)."""
    fs = fs or default_fs()
    path = os.path.join(data_dir, cs.LAYOUT_FILE)
    cs.replace_file(fs, data_dir, path, path + ".tmp", json.dumps(layout).encode())


def mark_running(data_dir: str, checkpoint: str | None, op: str = "restore") -> None:
    """Record this process as the restore (or reshard: ``op``) holding ``data_dir``'s cluster
    lock (best effort: the file only improves messages). REQUIRES: the cluster lock held."""
    try:
        ct = psutil.Process().create_time()
    except psutil.Error:
        ct = None
    doc = {"pid": os.getpid(), "create_time": ct, "checkpoint": checkpoint, "operation": op,
           "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        with open(os.path.join(data_dir, RUNNING_FILE), "w", encoding="utf-8") as f:
            json.dump(doc, f)
    except OSError:
        pass


def unmark_running(data_dir: str) -> None:
    try:
        os.remove(os.path.join(data_dir, RUNNING_FILE))
    except OSError:
        pass


def running(data_dir: str) -> dict | None:
    """The restore that holds ``data_dir``'s cluster lock now ({"pid", "checkpoint", ...}), or
    None (none recorded, or its process is gone)."""
    try:
        with open(os.path.join(data_dir, RUNNING_FILE), encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not cs.pid_alive(doc.get("pid"), doc.get("create_time")):
        return None
    return doc


def running_line(doc: dict) -> str:
    """"a `sievekv cluster restore` (pid N, from CK)" for messages (or ``cluster reshard``)."""
    what = f", from {doc['checkpoint']}" if doc.get("checkpoint") else ""
    return f"a `sievekv cluster {operation(doc)}` (pid {doc.get('pid')}{what})"


def remove_empty_backup(data_dir: str, doc: dict) -> None:
    try:
        os.rmdir(os.path.join(data_dir, doc["backup"]))
    except OSError:
        pass
