"""Opening a DB directory: lock, manifest, log replay, leftovers removed.

Steps (LevelDB's ``DB::Open``):

1. Create the directory if allowed, take ``LOCK`` (flock; LockedError if held).
2. ``CURRENT`` present: recover the manifest (a new manifest is written holding a snapshot);
   absent: create a new DB, unless tables or logs are there (a DB that lost its ``CURRENT``:
   CorruptionError, nothing written).
3. Replay every log numbered >= the manifest's log number, oldest first (a torn last record
   is dropped; damage before the tail raises CorruptionError). The logs before the last one
   are replayed into a memtable that is written to L0 tables (synced, directory synced)
   whenever it fills up and at the end.
4. The last log's writes are *carried over*: they become the DB's first memtable, and its
   records (the clean prefix, a torn tail dropped) are copied into a new log, fsynced, the
   directory synced. So a restart adds no L0 table: a process that keeps crashing before
   its background work finishes cannot pile up L0 (it did, one table per open). The records
   are written anew, not appended to the old file: after a failed fsync Linux marks the
   unwritten pages clean, so a later fsync of the old file would report success without
   making them durable (tests/test_review_log_reuse.py). A last log whose writes take
   ``CARRY_MAX_BYTES`` or more in the memtable (or fill it) is written to L0 instead and the
   new log starts empty: carrying costs its replay and copy at every open until a flush
   (~0.15 s per MB measured), a table costs that once (RocksDB and LevelDB by default always
   write recovered logs to L0).
5. Open and check each new L0 table (engine/output_check.py; one that fails fails the open,
   with the logs still on disk), then record in one manifest edit the new L0 tables, the new
   log's number (every older log is then obsolete) and the last sequence number.
6. Remove what a crash left behind: tables no version references, logs below the log number,
   old manifests, temp files.

An open that fails before its edit is written (a damaged log, a table that fails its check, a
full disk) removes the tables and the new log it wrote, so repeated failing opens do not
fill the disk; one whose manifest write failed removes nothing: the edit naming them may be
on disk, and the next open settles which files are live (docs/format.md, "Rules the DB
follows" 4). The manifest recovered from is removed once CURRENT names its successor.

The DB then starts its background threads; the compaction thread looks at the recovered
version before it first waits, so an L0 at or past the trigger is compacted right after open
(RocksDB's MaybeScheduleFlushOrCompaction at the end of DB::Open).

Only one thread runs this, before the DB is shared.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import filenames
from .errors import CorruptionError, InvalidArgumentError, SieveError
from .filter_plan import bits_for_new_table, table_options
from .manifest import Manifest, obsolete_files
from .memtable import MemTable
from .output_check import check_new_tables
from .table_writer import write_tables
from .version_edit import VersionEdit
from .wal import LogWriter, decode_batch, encode_batch, read_log


CARRY_MAX_BYTES = 1 << 20  # step 4: a larger last log is written to L0 (see above)


def new_records(result, log_path: str, newest: int):
    """The records of one read log (``read_log``'s result) as ``(first_seq, ops, payload)``,
    without the writes that an earlier log of this replay already held: those with sequence
    numbers <= ``newest``, the largest number replayed before this log (0: none).

    In a DB's own logs numbers only grow from log to log (numbers are never reused, not even
    those of a failed write), so a later log holds an earlier number only as the copy that
    step 4 makes of the last log: a crash before the manifest edit that names the copy
    leaves the old log whole beside a prefix of its copy, and the next open replays both.
    Replayed again after the old log, the copy's older records of a key would replace the
    newer ones (tests/test_review_session18b.py: the last write to a key read back as the
    one before). A record that only starts at or below ``newest`` keeps its later writes.
    """
    for payload, offset in zip(result.records, result.offsets):
        first_seq, ops = decode_batch(payload, path=log_path, offset=offset)
        if not ops:
            continue
        top = first_seq + len(ops) - 1
        if top <= newest:
            continue
        if first_seq <= newest:
            ops = ops[newest - first_seq + 1:]
            first_seq = newest + 1
            payload = encode_batch(first_seq, ops)
        newest = top
        yield first_seq, ops, payload


@dataclass
class RecoveredState:
    lock: object
    manifest: Manifest
    log: LogWriter
    log_number: int
    mem: MemTable  # the last log's carried-over writes (or empty); log_number = the new log
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
        # No CURRENT but tables or logs: a DB that lost its CURRENT, not an empty directory.
        # Creating a DB here would write MANIFEST-000001 over the old one and delete every
        # table and log as obsolete. (A manifest alone is a first open that crashed before
        # CURRENT was written: it held nothing yet, and is created anew.)
        held = [name for kind, _, name in filenames.list_files(fs, path)
                if kind in (filenames.FileKind.TABLE, filenames.FileKind.LOG)]
        if held:
            raise CorruptionError(
                f"CURRENT is missing but the directory holds {len(held)} table or log files "
                f"(e.g. {held[0]}); not creating a new DB over them",
                path=filenames.current_file_name(path))
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

    newest = 0  # the largest sequence number replayed so far (new_records)

    def replay(m: MemTable, result, log_path: str, flush_when_full: bool,
               kept: list | None = None) -> MemTable:
        nonlocal replayed, last_seq, newest
        for first_seq, ops, payload in new_records(result, log_path, newest):
            m.add(first_seq, ops)
            replayed += len(ops)
            newest = first_seq + len(ops) - 1
            last_seq = max(last_seq, newest)
            if kept is not None:
                kept.append(payload)
            if flush_when_full and m.approximate_bytes >= options.memtable_bytes:
                flush_mem(m)
                m = MemTable()
        return m

    log = log_path = None
    try:
        logs = manifest.logs_to_replay()
        live = MemTable()  # the DB's first memtable: the last log's writes, if carried
        carried: list = []  # the last log's records, copied into the new log
        for i, (_number, replay_path) in enumerate(logs):
            result = read_log(fs, replay_path)
            if i == len(logs) - 1:
                kept: list = []  # its records less those an earlier log held (new_records)
                last = replay(MemTable(), result, replay_path, flush_when_full=False, kept=kept)
                if last.approximate_bytes < min(options.memtable_bytes, CARRY_MAX_BYTES):
                    live, carried = last, kept
                else:  # a large one goes to a table once, not replayed and copied every open
                    flush_mem(mem)  # older data first: larger table numbers hold newer data
                    mem = last
            else:
                mem = replay(mem, result, replay_path, flush_when_full=True)
        flush_mem(mem)
        # Before the edit after which the replayed logs are obsolete and deleted: a table
        # that fails its check must not be their only copy (engine/output_check.py).
        check_new_tables(fs, path, metas)
        log_number = manifest.new_file_number()
        live.log_number = log_number
        log_path = filenames.log_file_name(path, log_number)
        log = LogWriter(fs.open_writable(log_path))
        # The carried records are written anew, not appended to the old file: a failed fsync
        # of the old log may have left its pages clean but never written (Linux marks them
        # clean), so no later fsync of that file could make them durable.
        for payload in carried:
            log.add_record(payload)
        if carried:
            log.sync()
        fs.sync_dir(path)
        edit = VersionEdit(log_number=log_number, last_sequence=last_seq)
        for m in metas:  # written in order: larger numbers hold newer data
            edit.add_file(0, m)
        manifest.log_and_apply(edit)
    except BaseException:
        if log is not None:
            log.close()
        if not manifest.failed:
            # The edit was never written: the tables and the new log are this open's alone,
            # and a later open rebuilds them from the logs. Remove them, or every open that
            # fails (a damaged log, a shard restarted by its service manager) adds more.
            # With the manifest failed the edit may be on disk naming them: keep them all
            # (the next open settles it; the new log's records then repeat the old last
            # log's, and new_records skips them). Until session 20 the new log was removed
            # here whatever failed, and a restart lost the carried writes.
            left = [filenames.table_file_name(path, m.number) for m in metas]
            for stale in left + ([log_path] if log_path is not None else []):
                try:
                    fs.remove(stale)
                except SieveError:
                    pass
        raise
    removed = 0
    for stale in obsolete_files(fs, path, manifest, pending={log_number}):
        try:
            fs.remove(stale)
            removed += 1
        except SieveError:
            pass
    return RecoveredState(lock, manifest, log, log_number, live, last_seq, replayed, len(metas),
                          removed)
