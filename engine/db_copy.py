"""Read and copy a closed DB directory (a checkpoint, engine/checkpoint.py) without opening it:
what ``sievekv cluster restore`` stages before it swaps a shard's data directory.

* :func:`describe` reads the manifest that ``CURRENT`` names (read-only: nothing is written)
  and checks that every table it lists is there with the recorded size.
* :func:`copy_db` writes a new directory that opens as the same DB: tables hard-linked where
  the file system allows (they are immutable), else copied; ``CURRENT`` and the manifest are
  always *copied*, because an open DB appends to its manifest and a shared inode would change
  the source. Every file and the directory are synced; the caller syncs ``dest``'s parent.

Not thread safe with a DB open on ``src`` (a live DB's tables come and go; use a checkpoint).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from . import filenames
from .checkpoint import NO_LINK_ERRNOS, copy_table
from .errors import AlreadyExistsError, InvalidArgumentError, StorageIOError
from .manifest import Manifest
from .progress import Progress
from .version_edit import FileMeta


class IncompleteError(InvalidArgumentError):
    """The directory is not a complete DB: no ``CURRENT``, or a listed table is missing or has
    another size than its manifest records."""


@dataclass(frozen=True)
class DbFiles:
    """What :func:`describe` found: the manifest's file name and the live tables."""

    manifest: str  # file name, e.g. "MANIFEST-000042"
    tables: tuple[tuple[int, FileMeta], ...]  # (level, meta), in level order

    @property
    def bytes(self) -> int:
        return sum(m.size for _, m in self.tables)


def describe(fs, path: str) -> DbFiles:
    """The live files of the DB in ``path``. Raises IncompleteError (see the class),
    CorruptionError if the manifest is damaged, StorageIOError if it cannot be read. O(size of
    the manifest + tables)."""
    if not fs.exists(filenames.current_file_name(path)):
        raise IncompleteError(f"{path} holds no DB (no {filenames.CURRENT})")
    m = Manifest.recover(fs, path, read_only=True)
    try:
        name = os.path.basename(m.manifest_path)
        tables = tuple((level, f) for level, files in enumerate(m.current.levels) for f in files)
    finally:
        m.close()
    for _, f in tables:
        p = filenames.table_file_name(path, f.number)
        try:
            size = fs.file_size(p)
        except StorageIOError as exc:
            raise IncompleteError(f"{p}, listed by {name}, cannot be read: "
                                  f"{os.strerror(exc.errno) if exc.errno else exc}") from None
        if size != f.size:
            raise IncompleteError(f"{p} is {size} bytes, {name} records {f.size}")
    return DbFiles(name, tables)


def copy_db(fs, src: str, dest: str, files: DbFiles | None = None,
            progress: Progress | None = None) -> dict:
    """Write the DB in ``src`` to the new directory ``dest`` (module docstring). ``files``:
    :func:`describe`'s answer if the caller has it. ``progress`` counts copied bytes and every
    table. Returns ``{"tables", "bytes", "linked", "copied"}``. Raises AlreadyExistsError if
    ``dest`` exists; on any failure ``dest`` is left partial (the caller removes it)."""
    files = files or describe(fs, src)
    if os.path.lexists(dest):
        raise AlreadyExistsError(f"{dest} exists already")
    fs.makedirs(dest)
    linked = copied = 0
    for _, f in files.tables:
        s, d = filenames.table_file_name(src, f.number), filenames.table_file_name(dest, f.number)
        try:
            fs.link(s, d)
            linked += 1
            if progress is not None:
                progress.add(f.size)
        except StorageIOError as exc:
            if exc.errno not in NO_LINK_ERRNOS:
                raise
            src_file = fs.open_readable(s)
            try:
                copy_table(fs, src_file, d, f.size, progress or Progress(0, 0))
            finally:
                src_file.close()
            copied += 1
        if progress is not None:
            progress.tables_done += 1
    for name in (files.manifest, filenames.CURRENT):  # copied: the engine appends / replaces
        data = fs.read_file(os.path.join(src, name))
        out = fs.open_writable(os.path.join(dest, name))
        try:
            out.append(data)
            out.sync()
        finally:
            out.close()
    fs.sync_dir(dest)
    return {"tables": len(files.tables), "bytes": files.bytes, "linked": linked,
            "copied": copied}
