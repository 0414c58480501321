"""The check a new table passes before a manifest edit may make it live.

A flush or compaction writes its output tables (in a table worker or in the DB's thread),
then opens each one and compares it with what the writer reported, *before* the version edit
that would list it (engine/background.py ``_open_outputs``). RocksDB does the same: a
compaction's or flush's outputs are opened through the table cache ("verify that the table is
usable") before they are installed; recovery at open does the same for the L0 tables it
writes from the replayed logs, before the edit after which those logs are deleted
(:func:`check_new_tables`). Opening reads and checksums the footer, the metaindex, the
properties, the index and the filter index (engine/sstable/reader.py), so a table written
wrong, cut short, or different from what its writer meant fails here.

What a failure means: the edit is not made. A flush's memtable stays frozen and its log stays
on disk; a compaction's inputs stay live; an open fails with the logs it replayed still on
disk. The DB enters its failed state (writes refused, reads go on) and a reopen recovers
everything from the log and the inputs. Before this check existed, such a table was committed
first and then failed to open: the reopen met a manifest listing a damaged table, while a
compaction's inputs (or recovery's logs) were no longer listed anywhere.

Not covered:
- Damage on the medium itself. The check reads the file right after it was written, through
  the OS page cache, which still holds the writer's bytes; bytes the disk stores wrong show
  only once those pages are read from the disk again, where every read checks the checksums
  of what it reads and ``DB.verify`` checks them all. RocksDB's check has the same reach.
- Damage inside a data block (only its own checksum, checked when a read or ``DB.verify``
  reaches it, finds that), as with RocksDB's default (its ``paranoid_file_checks`` reads every
  entry back; sievekv has no such option).
"""

from __future__ import annotations

from .errors import CorruptionError, SieveError, StorageIOError
from .filenames import table_file_name
from .sstable.reader import Table


def check_output(table, meta) -> None:
    """Raise CorruptionError (naming the file) unless the open ``table`` is the one its writer
    described in ``meta`` (engine/version_edit.py FileMeta): same file size, entry count and
    key range."""
    props = table.properties
    for what, got, want in (("file size", table.file_size, meta.size),
                            ("entry count", props.num_entries, meta.num_entries),
                            ("smallest key", table.smallest, meta.smallest),
                            ("largest key", table.largest, meta.largest)):
        if got != want:
            raise CorruptionError(f"new table's {what} is {got!r} where its writer wrote "
                                  f"{want!r}", path=table.path)


def open_checked(metas, open_one, close, give_up, job: str, kept: str) -> list:
    """Open each new table of ``metas`` (FileMeta) with ``open_one(meta)`` and
    :func:`check_output` it; returns ``[(number, table)]``. On any failure the tables opened
    so far are passed to ``close`` and all are tried once more (an open can fail for a moment:
    EMFILE while another thread holds many descriptors). A second failure calls
    ``give_up(exc)`` (remove the outputs) and raises :func:`not_installed`'s error for
    ``job`` and ``kept``."""
    for attempt in (1, 2):
        opened: list = []
        try:
            for m in metas:
                table = open_one(m)
                opened.append((m.number, table))  # closed again below if its check fails
                check_output(table, m)
            return opened
        except Exception as exc:  # noqa: BLE001 - tried again, then raised below
            close(opened)
            if attempt == 2:
                give_up(exc)
                err = not_installed(exc, job, kept)
                if err is exc:
                    raise
                raise err from exc
    raise AssertionError("unreachable")


def check_new_tables(fs, dirname: str, metas) -> None:
    """:func:`open_checked` for recovery's tables, before their edit: each is opened with
    ``Table.open`` and closed again; a table that fails twice removes them all."""
    def close(opened) -> None:
        for _number, table in opened:
            table.close()

    def remove_all(_exc) -> None:
        for m in metas:
            try:
                fs.remove(table_file_name(dirname, m.number))
            except SieveError:
                pass  # an unlisted table is removed at the next open

    close(open_checked(
        metas, lambda m: Table.open(fs, table_file_name(dirname, m.number),
                                    file_number=m.number),
        close, remove_all, "recovery", "the write-ahead logs replayed stay on disk, for the "
        "next open"))


def not_installed(exc: BaseException, job: str, kept: str) -> BaseException:
    """``exc``, a new table's failed open or check, as the error the DB reports: the same
    class (a CorruptionError stays DATA_LOSS, an I/O error keeps its errno), its message saying
    that the ``job``'s output was not installed and what still holds the data (``kept``).
    Other exceptions are returned unchanged (a bug: the background thread reports it)."""
    what = f"{job} output failed its check before install, so nothing was installed ({kept})"
    if isinstance(exc, CorruptionError):
        return CorruptionError(f"{what}: {exc.message}", path=exc.path, offset=exc.offset)
    if isinstance(exc, StorageIOError):
        detail = str(exc.strerror)
        suffix = f": {exc.path}"
        if exc.path is not None and detail.endswith(suffix):  # the constructor adds it again
            detail = detail[:-len(suffix)]
        return StorageIOError(f"{what}: {detail}", path=exc.path, errno_=exc.errno,
                              retryable=False)
    return exc
