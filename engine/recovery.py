"""Opening a DB directory: lock, manifest, log replay, leftovers removed.

Steps (LevelDB's ``DB::Open``):

1. Create the directory if allowed, take ``LOCK`` (flock; LockedError if held).
2. ``CURRENT`` present: recover the manifest (a new manifest is written holding a snapshot);
   absent: create a new DB.
3. Replay every log numbered >= the manifest's log number, oldest first, into a memtable
   (a torn last record is dropped; damage before the tail raises CorruptionError). A
   memtable that fills up during replay, and the one left at the end, are written to L0
   tables (synced, directory synced).
4. Start a new, empty log (directory synced), then record in one manifest edit the new L0
   tables, the new log number (older logs are then obsolete) and the last sequence number.
5. Remove what a crash left behind: tables no version references, logs below the log number,
   old manifests, temp files.

Only one thread runs this, before the DB is shared.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import filenames
from .errors import InvalidArgumentError, SieveError
from .filter_plan import bits_for_new_table, table_options
from .manifest import Manifest, obsolete_files
from .memtable import MemTable
from .table_writer import write_tables
from .version_edit import VersionEdit
from .wal import LogWriter, decode_batch, read_log


@dataclass
class RecoveredState:
    lock: object
    manifest: Manifest
    log: LogWriter
    log_number: int
    last_sequence: int
    replayed_entries: int
    tables_written: int
    removed_files: int


def recover(fs, path: str, options) -> RecoveredState:
    """Open or create the DB in ``path`` (see the module docstring). On failure nothing is
    left locked or open."""
    if not fs.exists(path):
        if not options.create_if_missing:
            raise InvalidArgumentError(f"{path} does not exist (create_if_missing=False)")
    fs.makedirs(path)
    lock = fs.lock(filenames.lock_file_name(path))
    try:
        return _recover_locked(fs, path, options, lock)
    except BaseException:
        lock.release()
        raise


def _recover_locked(fs, path: str, options, lock) -> RecoveredState:
    if fs.exists(filenames.current_file_name(path)):
        if options.error_if_exists:
            raise InvalidArgumentError(f"{path} already holds a DB (error_if_exists=True)")
        manifest = Manifest.recover(fs, path)
    else:
        if not options.create_if_missing:
            raise InvalidArgumentError(f"{path} holds no DB (create_if_missing=False)")
        manifest = Manifest.create(fs, path)
    try:
        return _replay(fs, path, options, lock, manifest)
    except BaseException:
        manifest.close()
        raise


def _replay(fs, path, options, lock, manifest: Manifest) -> RecoveredState:
    last_seq = manifest.last_sequence
    metas = []
    replayed = 0
    mem = MemTable()

    def flush_mem(m: MemTable) -> None:
        if not len(m):
            return
        m.freeze()
        levels = manifest.current.levels
        bits = bits_for_new_table(options, levels, 0, len(m))
        metas.extend(write_tables(fs, path, [list(m.items())],
                                  new_number=manifest.new_file_number,
                                  table_options=table_options(options, bits)))

    for _number, log_path in manifest.logs_to_replay():
        result = read_log(fs, log_path)
        for payload, offset in zip(result.records, result.offsets):
            first_seq, ops = decode_batch(payload, path=log_path, offset=offset)
            if not ops:
                continue
            mem.add(first_seq, ops)
            replayed += len(ops)
            last_seq = max(last_seq, first_seq + len(ops) - 1)
            if mem.approximate_bytes >= options.memtable_bytes:
                flush_mem(mem)
                mem = MemTable()
    flush_mem(mem)
    log_number = manifest.new_file_number()
    log_path = filenames.log_file_name(path, log_number)
    log = LogWriter(fs.open_writable(log_path))
    try:
        fs.sync_dir(path)
        edit = VersionEdit(log_number=log_number, last_sequence=last_seq)
        for m in metas:  # written in order: larger numbers hold newer data
            edit.add_file(0, m)
        manifest.log_and_apply(edit)
    except BaseException:
        log.close()
        raise
    removed = 0
    for stale in obsolete_files(fs, path, manifest, pending={log_number}):
        try:
            fs.remove(stale)
            removed += 1
        except SieveError:
            pass
    return RecoveredState(lock, manifest, log, log_number, last_seq, replayed, len(metas), removed)
