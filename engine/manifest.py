"""The manifest: an append-only log of VersionEdits that says which files make up the DB
(docs/format.md, "Manifest").

Records are framed exactly like the write-ahead log (engine.wal), with the same checksums and
the same torn-tail rule. ``CURRENT`` names the live manifest. The first record of every
manifest is a full snapshot (comparator, log number, next file number, last sequence, compact
pointers, every live file), so a manifest never depends on an older one.

Contract for the DB:

* Thread safety: every method is internally serialised by one lock, and ``current`` (an
  immutable Version) may be read without any lock. ``log_and_apply`` holds that lock across an
  fsync, so do not call it while holding a lock that readers need. The caller must still
  serialise *computing* an edit with applying it (an edit computed against an old version may
  no longer apply; it is then refused with InvalidArgumentError, nothing written).
* Durability order: a table, and the directory entry naming it, are fsynced before an edit
  that adds it is passed to ``log_and_apply``; an edit's files are removed from disk only after
  ``log_and_apply`` has returned a version that no longer holds them (and no reader uses them).
* After ``log_and_apply`` raises an I/O error the manifest is *failed*: whether the edit reached
  the disk is unknown, so every later ``log_and_apply`` raises StorageIOError and the DB must
  stop changing files (delete neither the edit's inputs nor its outputs) until it is reopened;
  recovery and :func:`obsolete_files` then settle which files are live.

Opening a DB, in order::

    m = Manifest.recover(fs, d) if fs.exists(filenames.current_file_name(d)) else Manifest.create(fs, d)
    for number, path in m.logs_to_replay():            # number order; marks the numbers used
        log = read_log(fs, path)                       # torn tail dropped, else CorruptionError
        for payload, offset in zip(log.records, log.offsets):
            first_seq, ops = decode_batch(payload, path=path, offset=offset)
    new_log = m.new_file_number()                      # never append to a replayed log
    ...open log_file_name(d, new_log), fs.sync_dir(d), flush the replayed memtable to a table...
    m.log_and_apply(VersionEdit(log_number=new_log, last_sequence=seq, new_files=[(0, meta)]))
    for path in obsolete_files(fs, d, m):
        fs.remove(path)
"""

from __future__ import annotations

import errno
import os
import threading

from . import filenames
from .errors import ClosedError, CorruptionError, InvalidArgumentError, StorageIOError
from .filenames import FileKind
from .format import COMPARATOR_NAME, DEFAULT_MAX_MANIFEST_BYTES, NUM_LEVELS
from .version import Version
from .version_edit import VersionEdit
from .wal import LogWriter, read_log

__all__ = ["Manifest", "obsolete_files"]


class Manifest:
    """The live manifest of one DB directory. Create with :meth:`create` or :meth:`recover`."""

    def __init__(self, fs, dirname: str, *, max_manifest_bytes: int, read_only: bool):
        self._fs = fs
        self.dirname = dirname
        self.max_manifest_bytes = max_manifest_bytes
        self.read_only = read_only
        self._mu = threading.Lock()
        self._writer: LogWriter | None = None
        self._failed: BaseException | None = None
        self._closed = False
        self.current: Version = Version.empty()
        self.log_number = 0
        self.next_file_number = 2
        self.last_sequence = 0
        self.manifest_number = 0
        self.compact_pointers: dict[int, bytes] = {}
        self.recovered_torn_bytes = 0  # torn-tail bytes dropped from the manifest at recovery

    # -- opening ---------------------------------------------------------------------------
    @classmethod
    def create(cls, fs, dirname: str, *, max_manifest_bytes: int = DEFAULT_MAX_MANIFEST_BYTES) -> "Manifest":
        """Start a new, empty DB in ``dirname`` (created if missing).

        Writes ``MANIFEST-000001`` holding a snapshot edit, fsyncs it, then points ``CURRENT``
        at it (temp file, fsync, rename, directory fsync). Raises InvalidArgumentError if
        ``CURRENT`` already exists. Next file number afterwards: 2.
        """
        fs.makedirs(dirname)
        if fs.exists(filenames.current_file_name(dirname)):
            raise InvalidArgumentError(f"{dirname} already holds a DB (CURRENT exists)")
        m = cls(fs, dirname, max_manifest_bytes=max_manifest_bytes, read_only=False)
        m.next_file_number = 1
        m._switch_to_new_manifest(m.current, m.compact_pointers)
        return m

    @classmethod
    def write_snapshot(cls, fs, dirname: str, version: Version, *, log_number: int,
                       next_file_number: int, last_sequence: int,
                       compact_pointers: dict[int, bytes]) -> str:
        """Describe ``version`` in a new manifest in ``dirname`` (which holds no DB yet) and
        point ``CURRENT`` at it, both synced: what a checkpoint (engine/checkpoint.py) writes
        beside the tables it links. The manifest is numbered ``next_file_number``. Returns its
        path. The caller syncs ``dirname``'s own entry in its parent."""
        if fs.exists(filenames.current_file_name(dirname)):
            raise InvalidArgumentError(f"{dirname} already holds a DB (CURRENT exists)")
        m = cls(fs, dirname, max_manifest_bytes=DEFAULT_MAX_MANIFEST_BYTES, read_only=False)
        m.current = version
        m.log_number = log_number
        m.next_file_number = next_file_number
        m.last_sequence = last_sequence
        m.compact_pointers = dict(compact_pointers)
        m._switch_to_new_manifest(version, m.compact_pointers)
        m.close()
        return m.manifest_path

    @classmethod
    def recover(
        cls,
        fs,
        dirname: str,
        *,
        read_only: bool = False,
        max_manifest_bytes: int = DEFAULT_MAX_MANIFEST_BYTES,
    ) -> "Manifest":
        """Rebuild the state from the manifest that ``CURRENT`` names.

        Replays every edit; a torn last record (short, or ending in unwritten zero sectors) is
        dropped (``recovered_torn_bytes``), any other damage, a complete last record with a bad
        checksum included, raises CorruptionError naming the manifest and offset. Unless ``read_only``,
        then writes the state as a snapshot to a new manifest and switches ``CURRENT`` to it
        (never appending after a torn tail); the old manifest is left for :func:`obsolete_files`.
        O(size of the manifest).
        """
        name = filenames.read_current_file(fs, dirname)
        path = os.path.join(dirname, name)
        m = cls(fs, dirname, max_manifest_bytes=max_manifest_bytes, read_only=read_only)
        m.manifest_number = filenames.parse_file_name(name)[1]
        try:
            # strict_tail: the last edit was synced and may have been acted on (logs and
            # compaction inputs deleted); dropping a damaged one would serve older values.
            result = read_log(fs, path, strict_tail=True)
        except StorageIOError as exc:
            if exc.errno == errno.ENOENT:  # LevelDB: "CURRENT points to a non-existent file"
                raise CorruptionError(f"CURRENT names {name}, which does not exist",
                                      path=filenames.current_file_name(dirname)) from None
            raise
        if not result.records:
            raise CorruptionError("manifest holds no complete record", path=path, offset=0)
        seen = set()
        version = Version.empty()
        for payload, offset in zip(result.records, result.offsets):
            edit = VersionEdit.decode(payload, path=path, offset=offset)
            try:
                version = version.apply(edit)
            except CorruptionError as exc:
                raise CorruptionError(f"edit does not apply: {exc.message}", path=path, offset=offset) from exc
            if edit.comparator is not None and edit.comparator != COMPARATOR_NAME:
                raise CorruptionError(
                    f"comparator {edit.comparator!r} is not {COMPARATOR_NAME!r}", path=path, offset=offset
                )
            for attr in ("log_number", "next_file_number", "last_sequence"):
                value = getattr(edit, attr)
                if value is not None:
                    setattr(m, attr, value)
                    seen.add(attr)
            for level, key in edit.compact_pointers:
                m.compact_pointers[level] = key
        missing = {"log_number", "next_file_number", "last_sequence"} - seen
        if missing:
            raise CorruptionError(f"manifest never records {sorted(missing)}", path=path)
        m.current = version
        m.recovered_torn_bytes = result.dropped_bytes
        # Never hand out a number that is already in use: not by the version, and not by a
        # file a crash left behind (outputs of a compaction whose edit was never written use
        # numbers past the last recorded next_file_number; a new log must not share one).
        on_disk = max((n for _, n, _ in filenames.list_files(fs, dirname)), default=0)
        m.next_file_number = max(
            m.next_file_number, m.manifest_number + 1, m.log_number + 1,
            max(version.live_numbers(), default=0) + 1, on_disk + 1,
        )
        if not read_only:
            with m._mu:
                m._switch_to_new_manifest(version, m.compact_pointers)
        return m

    # -- changing the state ----------------------------------------------------------------
    def log_and_apply(self, edit: VersionEdit) -> Version:
        """Record ``edit`` durably, then make the resulting Version current and return it.

        Fills in ``edit.next_file_number`` (always) and ``log_number`` / ``last_sequence``
        (when None) from the current state, so every record carries them; a given log number or
        last sequence must not go backwards. Appends one record and fsyncs; past
        ``max_manifest_bytes`` writes a fresh manifest holding a snapshot instead and switches
        CURRENT. Raises InvalidArgumentError (nothing written) for an edit that does not apply,
        StorageIOError on I/O failure (the manifest is then failed: see the module docstring).
        """
        with self._mu:
            self._check_writable()
            if edit.log_number is None:
                edit.log_number = self.log_number
            elif not self.log_number <= edit.log_number < self.next_file_number:
                raise InvalidArgumentError(
                    f"log number {edit.log_number} is not in [{self.log_number}, {self.next_file_number})"
                )
            if edit.last_sequence is None:
                edit.last_sequence = self.last_sequence
            elif edit.last_sequence < self.last_sequence:
                raise InvalidArgumentError(f"last sequence {edit.last_sequence} < {self.last_sequence}")
            if edit.comparator is not None and edit.comparator != COMPARATOR_NAME:
                raise InvalidArgumentError(f"comparator {edit.comparator!r} is not {COMPARATOR_NAME!r}")
            for _, meta in edit.new_files:
                if meta.number >= self.next_file_number:
                    raise InvalidArgumentError(f"file {meta.number} was not allocated by new_file_number()")
            edit.next_file_number = self.next_file_number
            try:
                version = self.current.apply(edit)
            except CorruptionError as exc:
                raise InvalidArgumentError(f"edit does not apply to the current version: {exc.message}") from exc
            for level, key in edit.compact_pointers:
                if not 0 <= level < NUM_LEVELS:
                    raise InvalidArgumentError(f"compact pointer level {level} is not in 0..{NUM_LEVELS - 1}")
            try:
                payload = edit.encode()
            except (ValueError, TypeError) as exc:
                raise InvalidArgumentError(f"edit cannot be encoded: {exc}") from exc
            pointers = dict(self.compact_pointers)
            pointers.update(edit.compact_pointers)
            try:
                if self._writer.size >= self.max_manifest_bytes:
                    self.log_number = edit.log_number  # the snapshot must carry the new values
                    self.last_sequence = edit.last_sequence
                    self._switch_to_new_manifest(version, pointers)
                else:
                    self._writer.add_record(payload)
                    self._writer.sync()
            except BaseException as exc:
                self._failed = exc
                raise
            self.log_number = edit.log_number
            self.last_sequence = edit.last_sequence
            self.compact_pointers = pointers
            self.current = version
            return version

    def new_file_number(self) -> int:
        """Reserve a file number (for a table, a log, a manifest). Not durable until the next
        ``log_and_apply``; a number lost in a crash is simply never used."""
        with self._mu:
            number = self.next_file_number
            self.next_file_number += 1
            return number

    def mark_file_number_used(self, number: int) -> None:
        """Make sure ``new_file_number`` never returns ``number`` or less (e.g. for a log found
        on disk at recovery)."""
        with self._mu:
            self.next_file_number = max(self.next_file_number, number + 1)

    # -- inspecting ------------------------------------------------------------------------
    @property
    def manifest_path(self) -> str:
        return filenames.manifest_file_name(self.dirname, self.manifest_number)

    @property
    def manifest_size(self) -> int:
        return self._writer.size if self._writer is not None else self._fs.file_size(self.manifest_path)

    def live_files(self) -> set[int]:
        """Numbers of the table files the current version references."""
        return self.current.live_numbers()

    def logs_to_replay(self) -> list[tuple[int, str]]:
        """``(number, path)`` of every log in the directory with number >= ``log_number``, in
        number order: the logs whose writes may not be in any table yet. Marks their numbers
        used, so a new log gets a higher number."""
        logs = sorted(
            (number, os.path.join(self.dirname, name))
            for kind, number, name in filenames.list_files(self._fs, self.dirname)
            if kind is FileKind.LOG and number >= self.log_number
        )
        if logs:
            self.mark_file_number_used(logs[-1][0])
        return logs

    def close(self) -> None:
        """Close the manifest file. Idempotent; later ``log_and_apply`` calls raise."""
        with self._mu:
            if self._writer is not None:
                self._writer.close()
            self._closed = True

    @property
    def failed(self) -> bool:
        """A write of the manifest failed: it refuses every edit until the DB is reopened."""
        return self._failed is not None

    # -- internals (REQUIRES: self._mu held, or the object not yet shared) -------------------
    def _check_writable(self) -> None:
        if self._closed:
            raise ClosedError("manifest is closed")
        if self.read_only:
            raise InvalidArgumentError("manifest was recovered read-only")
        if self._failed is not None:
            raise StorageIOError(
                f"manifest refused: an earlier write failed ({self._failed}); reopen the DB",
                path=self.manifest_path,
            )

    def _snapshot(self, version: Version, pointers: dict[int, bytes]) -> VersionEdit:
        edit = version.snapshot_edit()
        edit.comparator = COMPARATOR_NAME
        edit.log_number = self.log_number
        edit.next_file_number = self.next_file_number
        edit.last_sequence = self.last_sequence
        edit.compact_pointers = sorted(pointers.items())
        return edit

    def _switch_to_new_manifest(self, version: Version, pointers: dict[int, bytes]) -> None:
        """Write a snapshot of ``version`` to a new manifest file, sync it, point CURRENT at it."""
        number = self.next_file_number
        self.next_file_number += 1
        path = filenames.manifest_file_name(self.dirname, number)
        writer = LogWriter(self._fs.open_writable(path))
        try:
            writer.add_record(self._snapshot(version, pointers).encode())
            writer.sync()
            filenames.set_current_file(self._fs, self.dirname, number)
        except BaseException:
            writer.close()
            # Remove the new file unless CURRENT already names it (rename done, dir sync failed).
            try:
                if filenames.read_current_file(self._fs, self.dirname) != os.path.basename(path):
                    self._fs.remove(path)
            except Exception:
                pass
            raise
        old_writer, old_number = self._writer, self.manifest_number
        self._writer, self.manifest_number = writer, number
        if old_writer is not None:
            old_writer.close()
        if old_number:  # the one recovered from too: CURRENT no longer names it (durably)
            # Until session 20 only a live DB's old manifest went here; the one an open
            # recovered from waited for the open's sweep (obsolete_files), and every open
            # that failed after this point (a damaged log) left one more behind.
            try:
                self._fs.remove(filenames.manifest_file_name(self.dirname, old_number))
            except StorageIOError:
                pass  # harmless: obsolete_files() lists it


def obsolete_files(fs, dirname: str, manifest: Manifest, *, pending: frozenset[int] | set[int] = frozenset()) -> list[str]:
    """Paths of files in ``dirname`` that the DB no longer needs, for removal.

    * tables not referenced by ``manifest.current`` and not in ``pending``;
    * logs numbered below ``manifest.log_number`` (their writes are all in tables);
    * manifests other than the live one;
    * temp files (``*.tmp``) not in ``pending``.

    ``CURRENT``, ``LOCK`` and foreign files are never listed. ``pending`` holds the numbers the
    DB has reserved for work in flight (tables being written by a flush or compaction) and
    tables still read through an older Version. Call it at open after recovery, or later under
    the DB mutex with that ``pending`` set.
    """
    live = manifest.live_files()
    out = []
    for kind, number, name in filenames.list_files(fs, dirname):
        if kind is FileKind.TABLE:
            dead = number not in live and number not in pending
        elif kind is FileKind.LOG:
            dead = number < manifest.log_number and number not in pending
        elif kind is FileKind.MANIFEST:
            dead = number != manifest.manifest_number
        elif kind is FileKind.TEMP:
            dead = number not in pending
        else:
            dead = False
        if dead:
            out.append(os.path.join(dirname, name))
    return out
