"""The restore journal of a local cluster: ``<data_dir>/restore-journal.json``.

``sievekv cluster restore`` (router/cli/restore_cmd.py) stages every shard's copy first, then
writes this file (synced) and only then swaps directories, one rename pair per shard::

    <data_dir>/shard-N            -> <backup>/shard-N        (the old data, if there was any)
    <data_dir>/shard-N.restore-tmp -> <data_dir>/shard-N     (the staged, verified copy)

and removes the file when every shard is swapped. While it exists, the data directory may hold
some shards restored and others not: ``cluster start`` (router/preflight.py) and ``cluster
restore`` refuse, and ``cluster restore --finish`` or ``--undo`` settle it. Each step is
idempotent and decided from which of the three paths exist, so either can be run again after a
crash of its own. Nothing here deletes old data: ``--undo`` removes only staged or restored
copies (the checkpoint they came from is untouched).

Schema (version 1)::

    {"version": 1, "checkpoint": abs path, "backup": abs path, "started_at": ISO-8601 UTC,
     "shards": [{"name": "shard-0", "data": path, "staged": path, "backup": path,
                 "had_data": bool}, ...]}
"""

from __future__ import annotations

import json
import os
import shutil

from engine.vfs import FileSystem, default_fs

JOURNAL_FILE = "restore-journal.json"
JOURNAL_VERSION = 1
STAGING_SUFFIX = ".restore-tmp"
BACKUP_PREFIX = "restore-backup-"


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


def write(data_dir: str, doc: dict, fs: FileSystem | None = None) -> None:
    """Create the journal (temporary file, fsync, rename, directory fsync)."""
    fs = fs or default_fs()
    doc = dict(doc, version=JOURNAL_VERSION)
    path = journal_path(data_dir)
    tmp = path + ".tmp"
    try:
        f = fs.open_writable(tmp)
        try:
            f.append(json.dumps(doc, indent=1).encode())
            f.sync()
        finally:
            f.close()
        fs.rename(tmp, path)
    except BaseException:
        try:
            fs.remove(tmp)  # a full disk must not leave a half-written file behind
        except OSError:
            pass
        raise
    fs.sync_dir(data_dir)


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
    what = f" from {doc['checkpoint']}" if doc.get("checkpoint") else ""
    return (f"{data_dir} holds an interrupted restore{what} ({path}): some shards may be "
            f"restored and others not; finish it with `sievekv cluster restore --finish` or put "
            f"the old data back with `sievekv cluster restore --undo`")


def _sync_parent(fs: FileSystem, path: str) -> None:
    fs.sync_dir(os.path.dirname(path))


def finish_shard(entry: dict, fs: FileSystem | None = None) -> str:
    """Swap one shard (module docstring). Returns "swapped" or "done already"."""
    fs = fs or default_fs()
    data, staged, backup = entry["data"], entry["staged"], entry["backup"]
    if not os.path.lexists(staged):
        if not os.path.lexists(data):
            raise JournalError(f"{entry['name']}: neither {staged} nor {data} exists; the "
                               f"old data (if any) is in {backup}")
        return "done already"
    if os.path.lexists(data):
        if os.path.lexists(backup):
            raise JournalError(f"{entry['name']}: {data}, {staged} and {backup} all exist; "
                               f"settle this shard by hand")
        os.makedirs(os.path.dirname(backup), exist_ok=True)
        fs.rename(data, backup)
        _sync_parent(fs, backup)
    fs.rename(staged, data)
    _sync_parent(fs, data)
    return "swapped"


def undo_shard(entry: dict, fs: FileSystem | None = None) -> str:
    """Put one shard's old data back and drop its staged or restored copy. Returns what it did."""
    fs = fs or default_fs()
    data, staged, backup = entry["data"], entry["staged"], entry["backup"]
    if os.path.lexists(data) and not os.path.lexists(staged):
        if entry.get("had_data") and not os.path.lexists(backup):
            return "not restored"  # never swapped and never staged (or undone already)
        fs.rename(data, staged)  # the restored copy: out of the way first
        _sync_parent(fs, staged)
    if os.path.lexists(backup):
        if os.path.lexists(data):
            raise JournalError(f"{entry['name']}: both {data} and {backup} exist; settle this "
                               f"shard by hand")
        fs.rename(backup, data)
        _sync_parent(fs, data)
    if os.path.lexists(staged):
        shutil.rmtree(staged)
        _sync_parent(fs, staged)
    return "old data back"


def remove_empty_backup(doc: dict) -> None:
    try:
        os.rmdir(doc["backup"])
    except OSError:
        pass
