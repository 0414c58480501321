"""A FileSystem that injects faults and simulates crashes, for recovery tests.

In the manner of LevelDB's ``fault_injection_test.cc`` and Pebble's crashable ``vfs.MemFS``:
the files are real (under the real file system), and this layer remembers what a power loss
would keep:

* per file, the size at its last successful ``sync`` (a file opened for append starts as fully
  synced; a file created or truncated starts at 0);
* per directory, the names that existed at its last ``sync_dir`` (or when this layer first
  touched the directory), and which file each name pointed at.

:meth:`FaultInjectionFS.crash` then rewrites the directories to that state: names created or
renamed since the directory's last sync disappear, names removed or replaced come back with
their synced contents, and every file is cut to its synced size. Modes: ``"drop"`` (power loss:
lose all unsynced data), ``"torn"`` (power loss, but each file keeps a random prefix of its
unsynced bytes, so logs end in torn records), ``"keep"`` (process crash only: everything the OS
accepted stays, and counts as durable from then on), ``"process"`` (the same, but what was
never synced stays unsynced, so a later power loss still drops it unless someone syncs it).

Faults: :meth:`fail_writes_with` (e.g. ENOSPC, optionally after N more bytes, with a partial
write), :meth:`fail_sync`, :meth:`fail_reads_with`; each raises StorageIOError carrying the
errno. :meth:`garble_on_sync` silently flips a bit of chosen files (bad media: no error).
:meth:`crash_after` raises :class:`InjectedCrash` at the n-th following mutating operation
(create, append, sync, sync_dir, rename, remove, makedirs) and every call after it, as if the
process had died there, until :meth:`crash` "reboots". Files opened before a crash
refuse all use afterwards.

Not modelled: directories' own durability (a created directory always survives), reordering of
unsynced writes within a file, hard links. ``WritableFile.start_writeback`` (advice to the OS to
write early) reaches the real file and changes nothing here: only ``sync`` makes bytes durable.
Thread safe: one lock serialises all bookkeeping and the I/O done under it. Meant for tests;
slower than FileSystem.
"""

from __future__ import annotations

import collections
import errno as errno_mod
import os
import random
import threading

from .errors import StorageIOError
from .vfs import FileSystem, RandomAccessFile, WritableFile

__all__ = ["FaultInjectionFS", "InjectedCrash"]


class InjectedCrash(Exception):
    """The simulated process died at this operation (see FaultInjectionFS.crash_after).

    Deliberately not a SieveError: engine code must not mistake it for an I/O error it can
    handle and carry on.
    """


def _key(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)


class _FaultWritableFile(WritableFile):
    def __init__(self, fs: "FaultInjectionFS", path: str, fd: int, size: int):
        super().__init__(fs, path, fd, size)
        self._key = _key(os.fstat(fd))
        self._generation = fs._generation

    def append(self, data) -> None:
        if self.closed:  # EBADF, as the real call
            return super().append(data)
        fs: FaultInjectionFS = self._fs  # type: ignore[assignment]
        with fs._mu:
            fs._check_file(self)
            n = len(data)
            try:
                fs._op("append")
            except InjectedCrash:
                cut = fs._rng.randrange(0, n + 1) if n else 0
                if cut:
                    super().append(memoryview(data)[:cut])  # the process died mid-write
                raise
            if fs._write_errno is not None:
                if fs._write_budget is None or n > fs._write_budget:
                    allowed = fs._write_budget or 0
                    fs._write_budget = 0 if fs._write_budget is not None else None
                    if allowed:
                        super().append(memoryview(data)[:allowed])
                    raise StorageIOError(
                        f"write failed ({os.strerror(fs._write_errno)}, injected)",
                        path=self.path, errno_=fs._write_errno,
                    )
                fs._write_budget -= n
            super().append(data)

    def sync(self) -> None:
        if self.closed:  # EBADF, as the real call: no fault of this layer reaches the file
            return super().sync()
        fs: FaultInjectionFS = self._fs  # type: ignore[assignment]
        with fs._mu:
            fs._check_file(self)
            fs._op("sync")
            fs._check_sync(self.path)
            fs._garble(self)
            super().sync()
            fs._synced[self._key] = self.size

    def close(self) -> None:
        # Closing is not a mutation and is allowed after a crash (tests tidy up old handles).
        super().close()


class _FaultRandomAccessFile(RandomAccessFile):
    def __init__(self, fs: "FaultInjectionFS", path: str, fd: int, size: int):
        super().__init__(fs, path, fd, size)
        self._generation = fs._generation

    def read_at(self, offset: int, n: int) -> bytes:
        fs: FaultInjectionFS = self._fs  # type: ignore[assignment]
        fs._check_file(self)
        fs._check_read(self.path)
        return super().read_at(offset, n)

    def map(self, offset: int, length: int):
        fs: FaultInjectionFS = self._fs  # type: ignore[assignment]
        fs._check_file(self)
        fs._check_read(self.path)
        return super().map(offset, length)


class FaultInjectionFS(FileSystem):
    """A real file system plus crash simulation and injected errors. See the module docstring.

    ``op_count`` counts mutating operations; ``ops`` counts them by name.
    """

    def __init__(self, *, seed: int = 0):
        super().__init__()
        self._mu = threading.RLock()
        self._rng = random.Random(seed)
        # directory -> {name: (dev, ino) of the file the durable name points at, or the bytes
        # it held, when that file has since been removed or replaced}
        self._durable: dict[str, dict[str, tuple[int, int] | bytes]] = {}
        self._synced: dict[tuple[int, int], int] = {}  # file -> size at its last sync
        self._generation = 0
        self._dead = False
        self._crash_at: int | None = None
        self._write_errno: int | None = None
        self._write_budget: int | None = None
        self._sync_errno: int | None = None
        self._read_errno: int | None = None
        self._garble_match = None
        self._garble_from_end = 0
        self.garbled: list[tuple[str, int]] = []
        self.op_count = 0
        self.ops: collections.Counter = collections.Counter()
        self.crashes = 0
        self._held_locks: list = []

    # -- fault controls --------------------------------------------------------------------
    def fail_writes_with(self, errno_: int | None, *, after_bytes: int | None = None) -> None:
        """Make appends fail with ``errno_`` (None: stop failing). With ``after_bytes``, the
        next ``after_bytes`` bytes still succeed, and the append that crosses the limit writes
        the part that fits before it fails (a partial write, as a full disk does)."""
        with self._mu:
            self._write_errno = errno_
            self._write_budget = after_bytes

    def fail_sync(self, on: bool = True, *, errno_: int = errno_mod.EIO) -> None:
        """Make file and directory syncs fail (nothing becomes durable) while ``on``."""
        with self._mu:
            self._sync_errno = errno_ if on else None

    def fail_reads_with(self, errno_: int | None) -> None:
        """Make opening for read and reading fail with ``errno_`` (None: stop failing)."""
        with self._mu:
            self._read_errno = errno_

    def garble_on_sync(self, match, *, from_end: int = 1) -> None:
        """Make the next sync of each file whose path ``match(path)`` accepts flip one bit of
        the byte ``from_end`` bytes before the file's end first (None: stop), as a disk or
        controller that stores other bytes than it was given: the writer's checksums were
        computed over the right bytes. Each such file is garbled once; ``garbled`` lists
        ``(path, offset)``."""
        with self._mu:
            self._garble_match = match
            self._garble_from_end = from_end

    def _garble(self, f: "_FaultWritableFile") -> None:
        match = self._garble_match
        if match is None or not match(f.path) or any(p == f.path for p, _ in self.garbled):
            return
        offset = f.size - self._garble_from_end
        if offset < 0:
            return
        fd = os.open(f.path, os.O_RDWR)  # the writer's own descriptor may be write-only
        try:
            byte = os.pread(fd, 1, offset)
            os.pwrite(fd, bytes([byte[0] ^ 0x10]), offset)
        finally:
            os.close(fd)
        self.garbled.append((f.path, offset))

    def crash_after(self, n_ops: int) -> None:
        """Raise InjectedCrash at the ``n_ops``-th mutating operation from now (1 = the next),
        which does not happen (an append writes a random prefix of its data), and at every
        call after it until :meth:`crash`."""
        if n_ops < 1:
            raise ValueError("n_ops must be >= 1")
        with self._mu:
            self._crash_at = self.op_count + n_ops

    @property
    def dead(self) -> bool:
        """True between an InjectedCrash and the next :meth:`crash`."""
        return self._dead

    def crash(self, unsynced: str = "drop") -> None:
        """Simulate a machine crash and reboot: put every touched directory and file back to
        what was durable (see the module docstring for ``unsynced`` = drop / torn / keep).

        ``unsynced="process"``: only the process dies, the machine stays up. Files stay as the
        OS has them, as with "keep", but the layer goes on remembering what was never synced,
        so a later ``crash("drop")`` loses it unless the next process syncs it (with "keep",
        every byte counts as durable afterwards, so no test could see a missing fsync).

        Afterwards (except after "process") the current files count as durable; all injected
        faults are cleared, and files opened before the crash refuse all use.
        """
        if unsynced not in ("drop", "torn", "keep", "process"):
            raise ValueError(f"unknown crash mode {unsynced!r}")
        with self._mu:
            if unsynced in ("drop", "torn"):
                self._restore_durable_state(torn=unsynced == "torn")
            if unsynced != "process":
                self._durable.clear()
                self._synced.clear()
            self._generation += 1
            for held in self._held_locks:
                held.release()
            self._held_locks.clear()
            self._dead = False
            self._crash_at = None
            self._write_errno = self._write_budget = None
            self._sync_errno = self._read_errno = None
            self._garble_match = None  # (``garbled`` stays: what the disk holds)
            self.crashes += 1

    drop_unsynced_data = crash  # LevelDB's name for the same thing

    # -- FileSystem overrides ----------------------------------------------------------------
    def open_writable(self, path: str) -> WritableFile:
        with self._mu:
            self._op("create")
            self._track_dir(os.path.dirname(os.path.abspath(path)))
            base = super().open_writable(path)
            f = _FaultWritableFile(self, path, base._fd, 0)
            self._synced[f._key] = 0
            return f

    def open_appendable(self, path: str) -> WritableFile:
        with self._mu:
            self._op("create")
            self._track_dir(os.path.dirname(os.path.abspath(path)))
            existed = os.path.exists(path)
            base = super().open_appendable(path)
            f = _FaultWritableFile(self, path, base._fd, base.size)
            if not existed:
                self._synced[f._key] = 0
            else:
                self._synced.setdefault(f._key, base.size)
            return f

    def open_readable(self, path: str) -> RandomAccessFile:
        self._alive()
        self._check_read(path)
        base = super().open_readable(path)
        return _FaultRandomAccessFile(self, path, base._fd, base.size)

    def read_file(self, path: str) -> bytes:
        with self.open_readable(path) as f:
            return f.read_at(0, f.size)

    def exists(self, path: str) -> bool:
        self._alive()
        return super().exists(path)

    def listdir(self, path: str) -> list[str]:
        self._alive()
        return super().listdir(path)

    def file_size(self, path: str) -> int:
        self._alive()
        return super().file_size(path)

    def makedirs(self, path: str) -> None:
        with self._mu:
            self._op("makedirs")
            super().makedirs(path)

    def remove(self, path: str) -> None:
        with self._mu:
            self._op("remove")
            self._track_dir(os.path.dirname(os.path.abspath(path)))
            self._forget_durable_file(path)
            super().remove(path)

    def rename(self, src: str, dst: str) -> None:
        with self._mu:
            self._op("rename")
            self._track_dir(os.path.dirname(os.path.abspath(src)))
            self._track_dir(os.path.dirname(os.path.abspath(dst)))
            try:
                replacing = not os.path.samefile(src, dst)
            except OSError:  # src or dst missing: nothing is replaced (or the rename fails)
                replacing = False
            if replacing:
                self._forget_durable_file(dst)
            super().rename(src, dst)

    def link(self, src: str, dst: str) -> None:
        with self._mu:
            self._op("link")
            self._track_dir(os.path.dirname(os.path.abspath(dst)))
            super().link(src, dst)

    def rmdir(self, path: str) -> None:
        with self._mu:
            self._op("rmdir")
            self._track_dir(os.path.dirname(os.path.abspath(path)))
            super().rmdir(path)

    def lock(self, path: str, *, create: bool = True):
        """As FileSystem.lock; :meth:`crash` releases every lock taken here, as the kernel
        does when a process dies."""
        self._alive()
        held = super().lock(path, create=create)
        with self._mu:
            self._held_locks.append(held)
        return held

    def sync_dir(self, path: str) -> None:
        with self._mu:
            self._op("sync_dir")
            self._check_sync(path)
            super().sync_dir(path)
            d = os.path.abspath(path)
            self._durable[d] = self._listing(d)

    # -- internals (REQUIRES: self._mu held where they change state) --------------------------
    def _alive(self) -> None:
        if self._dead:
            raise InjectedCrash("the simulated process has crashed; call crash() to reboot")

    def _op(self, name: str) -> None:
        self._alive()
        self.op_count += 1
        self.ops[name] += 1
        if self._crash_at is not None and self.op_count >= self._crash_at:
            self._dead = True
            raise InjectedCrash(f"injected crash at operation {self.op_count} ({name})")

    def _check_file(self, f) -> None:
        self._alive()
        if f._generation != self._generation:
            raise InjectedCrash(f"{f.path} was opened before a simulated crash")

    def _check_sync(self, path: str) -> None:
        if self._sync_errno is not None:
            raise StorageIOError(
                f"fsync failed ({os.strerror(self._sync_errno)}, injected)", path=path, errno_=self._sync_errno
            )

    def _check_read(self, path: str) -> None:
        if self._read_errno is not None:
            raise StorageIOError(
                f"read failed ({os.strerror(self._read_errno)}, injected)", path=path, errno_=self._read_errno
            )

    @staticmethod
    def _listing(d: str) -> dict[str, tuple[int, int]]:
        out = {}
        for entry in os.scandir(d):
            if entry.is_file(follow_symlinks=False):
                out[entry.name] = _key(entry.stat(follow_symlinks=False))
        return out

    def _track_dir(self, d: str) -> None:
        if d not in self._durable and os.path.isdir(d):
            self._durable[d] = self._listing(d)

    def _synced_bytes(self, path: str, key: tuple[int, int]) -> bytes:
        with open(path, "rb") as f:
            data = f.read()
        synced = self._synced.get(key)
        return data if synced is None else data[:synced]

    def _forget_durable_file(self, path: str) -> None:
        """``path`` is about to be unlinked or replaced: durable names that point at its file
        keep its synced bytes instead (the file itself will be gone)."""
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return
        key = _key(st)
        content = None
        for entries in self._durable.values():
            for name, ref in entries.items():
                if ref == key:
                    if content is None:
                        content = self._synced_bytes(path, key)
                    entries[name] = content
        self._synced.pop(key, None)

    def _restore_durable_state(self, *, torn: bool) -> None:
        # 1. Where does each file live now?
        where: dict[tuple[int, int], str] = {}
        for d in self._durable:
            if os.path.isdir(d):
                for name, key in self._listing(d).items():
                    where[key] = os.path.join(d, name)
        # 2. Decide every durable name's contents before touching anything.
        keep_in_place: dict[str, int] = {}  # path -> size to cut it to
        rewrite: dict[str, bytes] = {}
        for d, entries in self._durable.items():
            for name, ref in entries.items():
                path = os.path.join(d, name)
                if isinstance(ref, bytes):
                    rewrite[path] = ref
                    continue
                now = where.get(ref)
                if now is None:
                    continue  # removed behind this layer's back: nothing to restore from
                size = os.path.getsize(now)
                synced = self._synced.get(ref, size)
                keep = synced + self._rng.randrange(0, size - synced + 1) if torn and size > synced else synced
                if now == path:
                    keep_in_place[path] = keep
                else:
                    with open(now, "rb") as f:
                        rewrite[path] = f.read(keep)
        # 3. Remove every name that is not durable (or must be rewritten), then restore.
        for d in self._durable:
            if not os.path.isdir(d):
                continue
            for name in self._listing(d):
                path = os.path.join(d, name)
                if path not in keep_in_place:
                    os.remove(path)
        for path, size in keep_in_place.items():
            os.truncate(path, size)
        for path, data in rewrite.items():
            with open(path, "wb") as f:
                f.write(data)
