"""Names of the files in a DB directory (docs/format.md, "Manifest", "File names").

LevelDB style: ``000012.sst`` (table), ``000011.log`` (write-ahead log), ``MANIFEST-000003``,
``CURRENT`` (names the live manifest), ``LOCK``, and ``000013.tmp`` (a temporary file, e.g. the
next ``CURRENT`` before its rename). Every file number comes from one counter kept by the
manifest, so numbers never repeat across kinds. A reader can tell what is in a directory from
the names alone: :func:`parse_file_name` returns ``None`` for anything that is not ours.

All functions are pure and thread safe except :func:`set_current_file` and
:func:`read_current_file`, which do I/O through the given FileSystem.
"""

from __future__ import annotations

import enum
import os

from .errors import CorruptionError

CURRENT = "CURRENT"
LOCK = "LOCK"
_MANIFEST_PREFIX = "MANIFEST-"
_DIGITS = 6  # numbers are zero-padded to at least 6 digits; longer numbers are written in full


class FileKind(enum.Enum):
    TABLE = "sst"
    LOG = "log"
    MANIFEST = "manifest"
    CURRENT = "current"
    LOCK = "lock"
    TEMP = "tmp"


_SUFFIX = {".sst": FileKind.TABLE, ".log": FileKind.LOG, ".tmp": FileKind.TEMP}


def _num(number: int) -> str:
    if number < 0:
        raise ValueError(f"file number {number} is negative")
    return f"{number:0{_DIGITS}d}"


def table_file_name(dirname: str, number: int) -> str:
    """``dirname/000012.sst``."""
    return os.path.join(dirname, _num(number) + ".sst")


def log_file_name(dirname: str, number: int) -> str:
    """``dirname/000011.log``."""
    return os.path.join(dirname, _num(number) + ".log")


def manifest_file_name(dirname: str, number: int) -> str:
    """``dirname/MANIFEST-000003``."""
    return os.path.join(dirname, _MANIFEST_PREFIX + _num(number))


def temp_file_name(dirname: str, number: int) -> str:
    """``dirname/000013.tmp``."""
    return os.path.join(dirname, _num(number) + ".tmp")


def current_file_name(dirname: str) -> str:
    return os.path.join(dirname, CURRENT)


def lock_file_name(dirname: str) -> str:
    return os.path.join(dirname, LOCK)


def _parse_number(digits: str) -> int | None:
    # Only plain ASCII digits, at least _DIGITS of them, written the way _num writes them.
    if len(digits) < _DIGITS or not digits.isascii() or not digits.isdigit():
        return None
    number = int(digits)
    return number if _num(number) == digits else None


def parse_file_name(name: str) -> tuple[FileKind, int] | None:
    """``(kind, number)`` for a base name we write, or ``None`` for a foreign file.

    ``CURRENT`` and ``LOCK`` have number 0. Only the exact spellings produced by the functions
    above are recognised (``12.sst`` or ``000012.SST`` are foreign).

    >>> parse_file_name("000012.sst")
    (<FileKind.TABLE: 'sst'>, 12)
    >>> parse_file_name("notes.txt") is None
    True
    """
    if name == CURRENT:
        return FileKind.CURRENT, 0
    if name == LOCK:
        return FileKind.LOCK, 0
    if name.startswith(_MANIFEST_PREFIX):
        number = _parse_number(name[len(_MANIFEST_PREFIX):])
        return None if number is None else (FileKind.MANIFEST, number)
    stem, dot, suffix = name.rpartition(".")
    kind = _SUFFIX.get(dot + suffix) if dot else None
    if kind is None:
        return None
    number = _parse_number(stem)
    return None if number is None else (kind, number)


def list_files(fs, dirname: str) -> list[tuple[FileKind, int, str]]:
    """``(kind, number, base name)`` for every file of ours in ``dirname``, sorted by name."""
    out = []
    for name in fs.listdir(dirname):
        parsed = parse_file_name(name)
        if parsed is not None:
            out.append((parsed[0], parsed[1], name))
    return out


def set_current_file(fs, dirname: str, manifest_number: int) -> None:
    """Make ``MANIFEST-<manifest_number>`` the live manifest, atomically and durably.

    Writes ``MANIFEST-NNNNNN\\n`` to ``NNNNNN.tmp``, fsyncs it, renames it over ``CURRENT`` and
    fsyncs the directory (which also makes the manifest file's own directory entry durable).
    After a crash, ``CURRENT`` names either the old or the new manifest, never a partial name.
    REQUIRES: the manifest file is complete and synced. On failure the temp file is removed
    (best effort) and the error propagates.
    """
    tmp = temp_file_name(dirname, manifest_number)
    contents = (_MANIFEST_PREFIX + _num(manifest_number) + "\n").encode()
    try:
        with fs.open_writable(tmp) as f:
            f.append(contents)
            f.sync()
        fs.rename(tmp, current_file_name(dirname))
    except BaseException:
        try:
            fs.remove(tmp)
        except Exception:
            pass
        raise
    fs.sync_dir(dirname)


def read_current_file(fs, dirname: str) -> str:
    """The base name of the live manifest, read from ``CURRENT``.

    Raises CorruptionError if ``CURRENT`` does not hold exactly one manifest name and a newline;
    StorageIOError if it cannot be read (missing included).
    """
    path = current_file_name(dirname)
    data = fs.read_file(path)
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        text = ""
    name = text[:-1] if text.endswith("\n") else ""
    parsed = parse_file_name(name) if name else None
    if parsed is None or parsed[0] is not FileKind.MANIFEST:
        raise CorruptionError(f"CURRENT does not name a manifest: {data[:80]!r}", path=path)
    return name
