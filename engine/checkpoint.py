"""``DB.checkpoint``: a consistent copy of a live DB that ``engine.DB.open`` opens as it is
(RocksDB's Checkpoint, Cassandra's ``nodetool snapshot``), made while the DB serves.

Steps:

1. ``flush()``: every write acknowledged before the call is in a table. Writes made while the
   checkpoint runs may or may not be in it.
2. Claim the staging directory ``<dest>.checkpoint-tmp`` (``STAGING_SUFFIX``) next to
   ``dest``: create it (or take over one a crashed checkpoint left) and hold an ``flock`` on
   the marker file ``STAGING_MARKER`` inside it for the whole call. A staging directory whose
   marker another call (in any process) holds means that call is writing ``dest``: refused with
   AlreadyExistsError. One without a marker is not ours: refused, never deleted (it may be a
   user's directory, or a DB). One with an unheld marker is a crashed checkpoint's: its files
   are removed and it is reused. Claiming comes before the flush, so an unwritable destination
   fails at once.
3. ``flush()``: every write acknowledged before the call is in a table. Writes made while the
   checkpoint runs may or may not be in it.
4. Under the DB's version lock (no flush or compaction installs a version meanwhile, so no file
   of the current one is removed): capture the version and the manifest's log number, next
   file number, last sequence and compact pointers, and hard-link every live table into the
   staging directory. Where the file system refuses a link (``dest`` on another file system:
   EXDEV; one without hard links: EPERM, ENOTSUP, ...), the table is opened instead: an open
   descriptor keeps its bytes even if a compaction removes the file once the lock is released.
5. Outside the lock: copy the opened tables (1 MiB reads, then fsync), write a manifest that
   describes the captured version and ``CURRENT`` (``Manifest.write_snapshot``), fsync the
   staging directory, rename it to ``dest`` (refused if ``dest`` appeared meanwhile), fsync
   ``dest``'s parent, remove the marker, release the lock.

While it runs, ``stats()["checkpoint_running"]`` shows its progress (``Progress.report``:
tables and bytes linked or copied so far). One checkpoint runs per process at a time; a second
waits for the first (then finds ``dest`` taken, if it named the same one).

A failure removes the staging directory; a crash leaves it (with its marker) for the next
checkpoint to the same ``dest``, never a partial ``dest``. A crash between the rename and the
marker's removal leaves ``dest`` complete, with the marker file in it (ignored by the DB).

No log is copied: a checkpoint holds the flushed state and replays nothing when opened; open
it with any options. Linked tables share the source's disk blocks, so a checkpoint costs no
space until the source compacts those tables away, and it does not survive the loss of that
disk: copy it elsewhere for a backup (it is a directory of immutable files; rsync or tar it).
"""

from __future__ import annotations

import errno
import os
import threading
import time

from . import filenames
from .errors import AlreadyExistsError, InvalidArgumentError, LockedError, StorageIOError
from .manifest import Manifest
from .progress import Progress

STAGING_SUFFIX = ".checkpoint-tmp"
STAGING_MARKER = "CHECKPOINT-STAGING.lock"  # flocked while a checkpoint writes its staging dir
COPY_CHUNK_BYTES = 1 << 20

_lock = threading.Lock()  # one checkpoint per process at a time (one progress to show)

# errnos of a link the file system refuses (copy instead); any other link error fails the call.
# Shared with engine/db_copy.py, as is copy_table.
NO_LINK_ERRNOS = frozenset({errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP,
                            errno.EMLINK, errno.ENOSYS})


def checkpoint_db(db, dest, create_parents: bool = False) -> dict:
    """Write a checkpoint of ``db`` to the new directory ``dest`` (module docstring). Returns::

        {"path": dest, "tables": n, "bytes": n, "linked": n, "copied": n,
         "last_sequence": s, "seconds": s}

    ``create_parents``: create missing parent directories (each synced into its own parent)
    instead of refusing.

    Raises AlreadyExistsError (an InvalidArgumentError) if ``dest`` exists or another
    checkpoint is writing it; InvalidArgumentError if its parent does not exist, it lies inside
    the DB's directory, it cannot be created (permissions, a read-only file system, a file in
    the way) or a staging directory that is not a checkpoint's is in the way; ClosedError if
    the DB is closed; StorageIOError if the file system fails (nothing is left at ``dest``).
    """
    with _lock:
        try:
            return _checkpoint(db, dest, create_parents)
        finally:
            db._checkpoint_progress = None


def _checkpoint(db, dest, create_parents: bool) -> dict:
    t0 = time.monotonic()
    fs = db._fs
    dest = _check_dest(db, dest, create_parents)
    staging = dest + STAGING_SUFFIX
    claim = _claim_staging(fs, staging, dest)
    opened = []
    try:
        db.flush()
        with db._version_lock:
            version = db._version
            m = db._manifest
            log_number, next_number = m.log_number, m.next_file_number
            last_seq, pointers = m.last_sequence, dict(m.compact_pointers)
            files = [f for level in version.levels for f in level]
            progress = Progress(len(files), sum(f.size for f in files))
            db._checkpoint_progress = progress
            linked = 0
            for f in files:
                src = filenames.table_file_name(db.path, f.number)
                dst = filenames.table_file_name(staging, f.number)
                try:
                    fs.link(src, dst)
                    linked += 1
                    progress.tables_done += 1
                    progress.add(f.size)
                except StorageIOError as exc:
                    if exc.errno not in NO_LINK_ERRNOS:
                        raise
                    opened.append((f, fs.open_readable(src)))
        for f, src in opened:
            copy_table(fs, src, filenames.table_file_name(staging, f.number), f.size, progress)
            progress.tables_done += 1
        for f in files:
            last_seq = max(last_seq, f.largest_seq)
        Manifest.write_snapshot(fs, staging, version, log_number=log_number,
                                next_file_number=next_number, last_sequence=last_seq,
                                compact_pointers=pointers)
        fs.sync_dir(staging)
        if os.path.lexists(dest):  # (rename would replace an empty directory someone made)
            raise AlreadyExistsError(f"checkpoint destination {dest} appeared while the "
                                     "checkpoint ran; nothing was overwritten")
        fs.rename(staging, dest)
    except BaseException:
        for _, src in opened:
            src.close()
        try:  # ours (we hold its marker): nobody else reads or writes it
            for name in fs.listdir(staging):
                if name != STAGING_MARKER:
                    fs.remove(os.path.join(staging, name))
            fs.remove(os.path.join(staging, STAGING_MARKER))
            fs.rmdir(staging)
        except Exception:
            pass  # left with its marker: the next checkpoint to this dest clears it
        claim.release()
        raise
    try:
        fs.sync_dir(os.path.dirname(dest))
        fs.remove(os.path.join(dest, STAGING_MARKER))
    finally:
        claim.release()
        for _, src in opened:
            src.close()
    return {"path": dest, "tables": len(files), "bytes": sum(f.size for f in files),
            "linked": linked, "copied": len(opened), "last_sequence": last_seq,
            "seconds": round(time.monotonic() - t0, 3)}


def _check_dest(db, dest, create_parents: bool) -> str:
    if isinstance(dest, bytes) or not isinstance(dest, (str, os.PathLike)):
        raise InvalidArgumentError(f"checkpoint destination must be a path, got {dest!r}")
    dest = os.fspath(dest)
    if not dest or "\x00" in dest:
        raise InvalidArgumentError(f"checkpoint destination must be a path, got {dest!r}")
    dest = os.path.abspath(dest)
    if os.path.lexists(dest):
        raise AlreadyExistsError(f"checkpoint destination {dest} already exists; "
                                   "name a directory that does not exist yet")
    home = os.path.realpath(db.path)
    real = os.path.realpath(dest)
    if real == home or real.startswith(home + os.sep):
        raise InvalidArgumentError(f"checkpoint destination {dest} is inside the DB's "
                                   f"directory {db.path}; put it elsewhere")
    parent = os.path.dirname(dest)
    if create_parents and not os.path.lexists(parent):
        _make_parents(db._fs, parent)
    if not os.path.isdir(parent):
        if os.path.lexists(parent):
            raise InvalidArgumentError(f"checkpoint destination's parent {parent} is not a "
                                       "directory")
        raise InvalidArgumentError(f"checkpoint destination's parent {parent} does not "
                                   "exist; create it first")
    return dest


def _make_parents(fs, path: str) -> None:
    """Create ``path`` and its missing ancestors, each synced into its parent."""
    missing = []
    while path and not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    for d in reversed(missing):
        try:
            fs.makedirs(d)
        except StorageIOError as exc:
            raise _path_error(exc, d) from None
        fs.sync_dir(os.path.dirname(d))


def _claim_staging(fs, staging: str, dest: str):
    """Create or take over the staging directory and return the held lock on its marker
    (module docstring, step 2). Raises AlreadyExistsError if another checkpoint holds it,
    InvalidArgumentError if it is not a checkpoint's staging directory or cannot be made."""
    marker = os.path.join(staging, STAGING_MARKER)
    if os.path.lexists(staging):
        if (not os.path.isdir(staging) or os.path.islink(staging)
                or (not os.path.exists(marker) and os.listdir(staging))):
            raise InvalidArgumentError(
                f"{staging} exists and is not a checkpoint's staging directory (no "
                f"{STAGING_MARKER}); remove it or choose another destination")
    else:
        try:
            fs.makedirs(staging)
        except StorageIOError as exc:
            raise _path_error(exc, staging) from None
    try:
        lock = fs.lock(marker)
    except LockedError:
        raise AlreadyExistsError(f"another checkpoint is writing {dest} now (its staging "
                                 f"directory {staging} is in use)") from None
    except StorageIOError as exc:
        if exc.errno == errno.ENOENT:  # the other checkpoint renamed it away just now
            raise AlreadyExistsError(f"another checkpoint just wrote {dest}") from None
        raise _path_error(exc, staging) from None
    try:  # a crashed checkpoint's leftovers (the marker was not held)
        for name in fs.listdir(staging):
            if name != STAGING_MARKER:
                fs.remove(os.path.join(staging, name))
    except BaseException:
        lock.release()
        raise
    return lock


# errnos of a destination the operator named wrongly (not a failing disk): InvalidArgumentError
_PATH_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR,
                          errno.ENOENT, errno.ENAMETOOLONG, errno.ELOOP})


def _path_error(exc: StorageIOError, path: str) -> Exception:
    if exc.errno in _PATH_ERRNOS:
        return InvalidArgumentError(f"cannot create checkpoint directory {path}: "
                                    f"{os.strerror(exc.errno)}")
    return exc


def copy_table(fs, src, path: str, size: int, progress: Progress) -> None:
    """Copy the open table ``src`` (``size`` bytes, as the manifest records) to ``path``,
    synced. A short file is an error, not a short copy."""
    out = fs.open_writable(path)
    try:
        pos = 0
        while pos < size:
            chunk = src.read_at(pos, min(COPY_CHUNK_BYTES, size - pos))
            if not chunk:
                raise StorageIOError(f"table is {pos} bytes, the manifest records {size}",
                                     path=src.path, errno_=errno.EIO)
            out.append(chunk)
            pos += len(chunk)
            progress.add(len(chunk))
        out.sync()
    finally:
        out.close()
