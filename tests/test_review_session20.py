"""Session 20 review: crash consistency and recovery, adversarially.

The contract (engine/db.py): a synced write survives a process crash and a power loss; an
unsynced one survives a process crash; after a power loss recovery gives a prefix of the
acknowledged writes (no hole, no half batch, no wrong value, no resurrected key); damage
before a log's tail is an error; what a crash left is removed on open. Faults come from
engine/faultfs.py (``crash_after`` at an operation index, the crash modes, failed fsyncs and
appends chosen by file name and count in :class:`CountedFaultFS`). No engine part is mocked.

Findings (strict xfails until fixed; both fixed in session 20, now plain tests):

- ``_replay`` in engine/recovery.py removes the new log (the copy of the last log's writes)
  when ``manifest.log_and_apply`` raises. A failed manifest fsync leaves the outcome unknown
  (docs/format.md, "Rules the DB follows" 4): the edit that names the new log is in the
  file, a process restart reads it, finds that log gone and the last log below the log
  number, and deletes the last log as obsolete. Every write of the last log is lost, synced
  and acknowledged ones included. Fixed: with the manifest failed, a failed open removes
  nothing (the next open settles which files are live).
- An open that fails on a damaged log (CorruptionError) leaves behind the L0 tables it wrote
  from the older logs (``flush_when_full`` in ``_replay``) and the manifest it switched to
  (``Manifest.recover`` never removes the one it replaced); only a successful open sweeps
  them, so every retry on a damaged DB grows its directory. Fixed: a failed open whose edit
  was never written removes its tables and new log; the manifest recovered from is removed
  as soon as CURRENT names the new one.

Checked and holding (plain tests below):

- a crash at every k-th file operation of a script of synced and unsynced puts, batches,
  deletes, memtable switches (a 1.5 KiB memtable), background flushes, L0 compactions,
  tombstone compactions and manual flush/compact, in each crash mode, sometimes a second
  crash during the recovery, then two reopens with a power loss between them: the state is
  the model after a prefix of the script that holds every synced (power loss) or every
  acknowledged (process crash) write, and the second reopen reads the same;
- generations of open, writes, crash, crash during recovery, reopen on one directory: each
  reopen is a prefix of that generation's operations on top of the previous state;
- a read-only open of the directory a crash left (also one whose recovery crashed) reads
  what the writable open then reads, and changes no file (bytes and mtimes);
- ENOSPC at each append and EIO at each fsync of a log, a table, a temp file or the
  directory during a recovery (three logs; the last one carried or written to L0): the
  open fails or succeeds, and a process restart and then a power loss read what a clean
  recovery reads;
- EIO at the fsync that ends a log at a memtable switch: the triggering write fails, the DB
  refuses writes, reads go on; after a restart every acknowledged write is there, after a
  power loss a prefix;
- deletes then compact() (tombstones dropped at the bottom), a crash at every operation of
  the compaction: no deleted key comes back.
"""

from __future__ import annotations

import errno
import os
import random
import shutil

import pytest

from engine import DB, StorageIOError
from engine.errors import CorruptionError, SieveError
from engine.faultfs import FaultInjectionFS, InjectedCrash, _FaultWritableFile

from .test_db_durability import matches_a_prefix


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
class _CountedFile(_FaultWritableFile):
    """A file of :class:`CountedFaultFS`: its append may be the one that fails."""

    def append(self, data) -> None:
        fs: CountedFaultFS = self._fs  # type: ignore[assignment]
        with fs._mu:
            if fs._hit("append", self.path):
                raise StorageIOError("write failed (No space left on device, injected)",
                                     path=self.path, errno_=errno.ENOSPC)
        super().append(data)


class CountedFaultFS(FaultInjectionFS):
    """FaultInjectionFS whose fsync (``sync_fault``) or append (``append_fault``) fails with
    EIO / ENOSPC at the n-th call (counted from when the fault is set) whose path the fault's
    predicate accepts: ``(predicate, n)``. An append that fails writes nothing."""

    def __init__(self, *, seed: int = 0):
        super().__init__(seed=seed)
        self.sync_fault = None
        self.append_fault = None
        self._counts = {"sync": 0, "append": 0}

    def set_fault(self, kind: str, predicate, n: int) -> None:
        with self._mu:
            self._counts[kind] = 0
            setattr(self, kind + "_fault", (predicate, n))

    def _hit(self, kind: str, path: str) -> bool:
        fault = getattr(self, kind + "_fault")
        if fault is None or not fault[0](path):
            return False
        self._counts[kind] += 1
        return self._counts[kind] == fault[1]

    def _check_sync(self, path: str) -> None:
        if self._hit("sync", path):
            raise StorageIOError("fsync failed (Input/output error, injected)", path=path,
                                 errno_=errno.EIO)
        super()._check_sync(path)

    def open_writable(self, path: str):
        f = super().open_writable(path)
        f.__class__ = _CountedFile
        return f

    def crash(self, unsynced: str = "drop") -> None:
        with self._mu:
            super().crash(unsynced)
            self.sync_fault = self.append_fault = None


def is_manifest(path: str) -> bool:
    return os.path.basename(path).startswith("MANIFEST-")


def not_manifest(path: str) -> bool:
    return not is_manifest(path)


def close_dead(db) -> None:
    try:
        db.close()
    except (InjectedCrash, SieveError):
        pass


def script(seed: int, n: int, keys: int = 60, deletes: float = 0.3) -> list:
    """Operations: ("write", [(key, value or None)], sync), ("flush",), ("compact",)."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        r = rnd.random()
        if r < 0.03:
            out.append(("flush", None, False))
        elif r < 0.05:
            out.append(("compact", None, False))
        else:
            size = rnd.randrange(1, 5) if r < 0.25 else 1
            out.append(("write", [(b"k%03d" % rnd.randrange(keys),
                                   None if rnd.random() < deletes
                                   else b"v%d." % i * rnd.randrange(1, 8))
                                  for _ in range(size)], rnd.random() < 0.2))
    return out


def is_prefix(got: dict, base: dict, ops: list, lo: int, hi: int) -> bool:
    """``got`` is ``base`` after ``ops[:n]`` for some ``lo <= n <= hi``."""
    return matches_a_prefix(got, base, ops, lo, hi)


def run_script(db, ops) -> tuple[int, int, int]:
    """Run ``ops`` until the first failure; (durable, acknowledged, started) op counts."""
    durable = acked = started = 0
    try:
        for i, op in enumerate(ops):
            started = i + 1
            if op[0] == "write":
                db.write(op[1], sync=op[2])
                acked = i + 1
                if op[2]:
                    durable = i + 1
            else:
                db.flush() if op[0] == "flush" else db.compact()
                acked = durable = i + 1  # everything before is in synced tables
    except (InjectedCrash, SieveError):
        pass
    close_dead(db)
    return durable, acked, started


def read_all(db) -> dict:
    got = dict(db.scan())
    for k, v in got.items():
        assert db.get(k) == v, k
    return got


SMALL = dict(memtable_bytes=1500, target_file_size=1024, max_bytes_for_level_base=4096,
             block_size=256, l0_compaction_trigger=2, level_size_multiplier=2.0,
             table_workers=0, max_frozen_memtables=1, tombstone_compaction_delay=0.0)


def synced_puts_then_process_death(path, fs, n=10):
    """``n`` synced puts, then the process dies (no close): one log, all of it acknowledged
    and synced."""
    db = DB.open(path, fs=fs, table_workers=0)
    for i in range(n):
        db.put(b"k%d" % i, b"v%d" % i, sync=True)
    fs.crash_after(1)
    close_dead(db)
    fs.crash("process")


# ---------------------------------------------------------------------------------------------
# Finding: recovery removes the new log after a manifest failure whose outcome is unknown
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("then", ["restart", "restart-then-power-loss", "power-loss"])
def test_a_failed_manifest_fsync_while_opening_loses_no_synced_write(tmp_path, then):
    """The open's manifest edit fails its fsync; then the process restarts (the edit is in the
    file: the new log must still be there), or restarts and later loses power, or the machine
    loses power first (the edit never reached the disk: the old log is replayed)."""
    path = str(tmp_path / "db")
    fs = CountedFaultFS(seed=1)
    synced_puts_then_process_death(path, fs)
    # The open: a new manifest (its snapshot: manifest fsync 1), the last log copied into a
    # new log (synced), then the edit naming that log: manifest fsync 2 fails (EIO). The
    # record is in the file all the same, as after any failed fsync.
    fs.set_fault("sync", is_manifest, 2)
    with pytest.raises(StorageIOError):
        DB.open(path, fs=fs, table_workers=0)
    for crash in {"restart": ["process"], "restart-then-power-loss": ["process", "drop"],
                  "power-loss": ["drop"]}[then]:
        fs.crash(crash)  # "process": the OS still has what it was given
        with DB.open(path, fs=fs, table_workers=0) as db:
            got = [db.get(b"k%d" % i) for i in range(10)]
        assert got == [b"v%d" % i for i in range(10)], (then, crash, "synced writes lost")


# ---------------------------------------------------------------------------------------------
# Crash points: writes, switches, flushes, compactions (holds)
# ---------------------------------------------------------------------------------------------
def crash_trial(tmp_path, ops, n: int, mode: str, seed: int, recovery_crash: int | None,
                opts: dict) -> None:
    """Run ``ops`` with a crash at file operation ``n`` (mode ``mode``), maybe crash again at
    operation ``recovery_crash`` of the next open, then reopen twice (a power loss between):
    a prefix holding every write the crash(es) may not lose, the same both times."""
    path = str(tmp_path / "db")
    shutil.rmtree(path, ignore_errors=True)
    fs = FaultInjectionFS(seed=seed)
    db = DB.open(path, fs=fs, **opts)
    fs.crash_after(n)
    durable, acked, started = run_script(db, ops)
    fs.crash(mode)
    lo = acked if mode == "process" else durable  # a process crash loses nothing acknowledged
    if recovery_crash is not None:
        fs.crash_after(recovery_crash)
        close_dead_open(path, fs, opts)
        mode2 = ("drop", "torn", "process")[seed % 3]
        fs.crash(mode2)
        if mode2 != "process":
            lo = durable
    states = []
    for _ in range(2):
        with DB.open(path, fs=fs, **opts) as db:
            states.append(read_all(db))
        fs.crash("drop")  # what the open recovered is durable now
    assert states[0] == states[1], (n, mode, recovery_crash)
    assert is_prefix(states[0], {}, ops, lo, started), (n, mode, recovery_crash, durable, acked,
                                                        started)


def close_dead_open(path, fs, opts) -> None:
    try:
        DB.open(path, fs=fs, **opts).close()
    except (InjectedCrash, SieveError):
        pass


def test_a_crash_at_every_few_operations_with_switches_flushes_and_compactions(tmp_path):
    """A 1.5 KiB memtable switches every few writes (one frozen at most, so writers wait for
    the flush thread), L0 compacts at two tables, tombstone compactions run without delay;
    synced and unsynced writes, batches, deletes, manual flushes and compactions."""
    ops = script(11, 90, keys=40, deletes=0.35)
    fs = FaultInjectionFS()
    db = DB.open(str(tmp_path / "dry"), fs=fs, **SMALL)
    at_open = fs.op_count
    run_script(db, ops)
    total = fs.op_count - at_open
    assert total > 500 and fs.ops["remove"] > 20  # logs and compacted tables were removed
    for n in range(1, total + 1, 9):
        for j, mode in enumerate(("drop", "torn", "process")):
            rc = (n * 7 + j) % 23 + 1 if (n + j) % 3 == 0 else None
            crash_trial(tmp_path, ops, n, mode, n * 3 + j, rc, SMALL)


def test_generations_of_crashes_on_one_directory_keep_a_prefix_each_time(tmp_path):
    """Open, write, crash (any mode), sometimes crash again in the recovery, reopen: each
    time the state is the previous one plus a prefix of this generation's operations that
    holds what the crash may not lose; the next generation starts from it."""
    for seed in range(6):
        rnd = random.Random(seed)
        path = str(tmp_path / f"g{seed}")
        fs = FaultInjectionFS(seed=seed)
        opts = dict(SMALL, memtable_bytes=rnd.choice([1200, 4000, 64 << 10]))
        base: dict = {}
        for g in range(5):
            ops = script(seed * 100 + g, 50)
            db = DB.open(path, fs=fs, **opts)
            assert read_all(db) == base, (seed, g)
            fs.crash_after(rnd.randrange(1, 300))
            durable, acked, started = run_script(db, ops)
            mode = rnd.choice(["drop", "torn", "process"])
            fs.crash(mode)
            lo = acked if mode == "process" else durable
            if rnd.random() < 0.5:
                fs.crash_after(rnd.randrange(1, 40))
                close_dead_open(path, fs, opts)
                mode2 = rnd.choice(["drop", "torn", "process"])
                fs.crash(mode2)
                if mode2 != "process":
                    lo = durable
            with DB.open(path, fs=fs, **opts) as db:
                got = read_all(db)
            assert is_prefix(got, base, ops, lo, started), (seed, g, mode, lo, acked, started)
            base = got
            if rnd.random() < 0.3:
                fs.crash("drop")  # the open made what it recovered durable


def file_images(path) -> dict:
    out = {}
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        with open(full, "rb") as f:
            out[name] = (f.read(), os.stat(full).st_mtime_ns)
    return out


def test_a_read_only_open_of_a_crashed_directory_reads_what_recovery_reads(tmp_path):
    """After a crash (and sometimes a crash in the next recovery), a read-only open reads
    what a writable open then reads, and leaves every file as it was."""
    ops = script(12, 80)
    fs = FaultInjectionFS()
    db = DB.open(str(tmp_path / "dry"), fs=fs, **SMALL)
    at_open = fs.op_count
    run_script(db, ops)
    total = fs.op_count - at_open
    path = str(tmp_path / "db")
    for n in range(1, total + 1, 17):
        for j, mode in enumerate(("drop", "torn", "process")):
            shutil.rmtree(path, ignore_errors=True)
            fs = FaultInjectionFS(seed=n * 3 + j)
            db = DB.open(path, fs=fs, **SMALL)
            fs.crash_after(n)
            run_script(db, ops)
            fs.crash(mode)
            if (n + j) % 2:
                fs.crash_after((n + j) % 29 + 1)
                close_dead_open(path, fs, SMALL)
                fs.crash(("drop", "torn", "process")[n % 3])
            before = file_images(path)
            with DB.open(path, fs=fs, read_only=True) as ro:
                seen = read_all(ro)
            assert file_images(path) == before, (n, mode)
            with DB.open(path, fs=fs, **SMALL) as db:
                assert read_all(db) == seen, (n, mode)


# ---------------------------------------------------------------------------------------------
# Faults during a recovery, and at a memtable switch (holds)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("memtable_bytes", [1024, 64 * 1024],
                         ids=["last-log-to-L0", "last-log-carried"])
def test_enospc_or_eio_at_each_step_of_a_recovery_loses_nothing(tmp_path, memtable_bytes):
    """Three logs to replay; ENOSPC at each append and EIO at each fsync of a log, a table, a
    temp file or the directory (the manifest's edit fsync is the finding above; its first
    fsync, the new manifest's snapshot, is included) during the open. Whether the open
    fails or not, a restart and then a power loss read what a clean recovery reads."""
    from .test_review_recovery import SWEEP, _build_three_logs

    base = str(tmp_path / "base")
    _build_three_logs(base)
    opts = dict(SWEEP, memtable_bytes=memtable_bytes)
    path = str(tmp_path / "db")

    def fresh() -> str:
        shutil.rmtree(path, ignore_errors=True)
        shutil.copytree(base, path)
        return path

    fs = FaultInjectionFS()
    with DB.open(fresh(), fs=fs, **opts) as db:
        want = read_all(db)
    assert want
    cases = [("append", lambda p: True, k) for k in range(1, fs.ops["append"] + 1)]
    cases += [("sync", not_manifest, k) for k in range(1, fs.ops["sync"] + fs.ops["sync_dir"])]
    cases.append(("sync", is_manifest, 1))
    failed_opens = 0
    for kind, pred, k in cases:
        fs = CountedFaultFS(seed=k)
        fs.set_fault(kind, pred, k)
        try:
            DB.open(fresh(), fs=fs, **opts).close()
        except StorageIOError:
            failed_opens += 1
        for mode in ("process", "drop"):
            fs.crash(mode)
            with DB.open(path, fs=fs, **opts) as db:
                assert read_all(db) == want, (kind, k, mode)
    assert failed_opens >= len(cases) // 2


def test_a_failed_fsync_ending_a_log_at_a_switch_fails_the_db_and_loses_nothing(tmp_path):
    """The fsync that ends the old log at a memtable switch fails: the write that switched
    fails, the DB refuses writes and still reads; a restart finds every acknowledged write,
    a power loss a prefix of them (they were unsynced)."""
    for mode in ("process", "drop"):
        path = str(tmp_path / mode)
        fs = CountedFaultFS(seed=4)
        db = DB.open(path, fs=fs, memtable_bytes=2048, table_workers=0,
                     disable_auto_compactions=True)
        first_log = "%06d.log" % db._mem.log_number
        fs.set_fault("sync", lambda p: p.endswith(first_log), 1)
        acked = 0
        with pytest.raises(StorageIOError):
            for i in range(200):
                db.put(b"k%03d" % i, b"v%d" % i)
                acked = i + 1
        assert 3 < acked < 200
        assert db.stats()["failed"] is not None
        with pytest.raises(StorageIOError):
            db.put(b"later", b"x")
        assert [db.get(b"k%03d" % i) for i in range(acked)] == [b"v%d" % i for i in range(acked)]
        db.close()
        fs.crash(mode)
        with DB.open(path, fs=fs, table_workers=0) as db:
            got = read_all(db)
        n = len(got)
        assert got == {b"k%03d" % i: b"v%d" % i for i in range(n)}
        assert n == acked if mode == "process" else n <= acked


def test_deleted_keys_stay_deleted_through_a_crash_at_every_operation_of_a_compaction(tmp_path):
    """Keys written over three flushes, most of them deleted (unsynced), then compact(): its
    flush makes the deletes durable and its merge drops the tombstones at the bottom. A
    crash at each operation of compact() and each mode: no deleted key comes back, no live
    key is lost, whichever side of the manifest edit the crash fell."""
    opts = dict(table_workers=0, disable_auto_compactions=True, target_file_size=1024,
                block_size=256)

    def prepare(path, fs):
        db = DB.open(path, fs=fs, **opts)
        for r in range(3):
            for i in range(60):
                db.put(b"k%03d" % i, b"r%d-%d" % (r, i) + b"x" * 20)
            db.flush()
        for i in range(60):
            if i % 4:
                db.delete(b"k%03d" % i)
        return db

    fs = FaultInjectionFS()
    db = prepare(str(tmp_path / "dry"), fs)
    at = fs.op_count
    db.compact()
    total = fs.op_count - at
    assert db.stats()["tombstones_dropped"] >= 45
    db.close()
    want = {b"k%03d" % i: b"r2-%d" % i + b"x" * 20 for i in range(0, 60, 4)}
    path = str(tmp_path / "db")
    for n in range(1, total + 1):
        for j, mode in enumerate(("drop", "torn", "process")):
            shutil.rmtree(path, ignore_errors=True)
            fs = FaultInjectionFS(seed=n * 3 + j)
            db = prepare(path, fs)
            fs.crash_after(n)
            done = False
            try:
                db.compact()
                done = True
            except (InjectedCrash, SieveError):
                pass
            close_dead(db)
            fs.crash(mode)
            with DB.open(path, fs=fs, **opts) as db:
                got = read_all(db)
            if done or mode == "process":
                assert got == want, (n, mode)
            else:  # the deletes were unsynced: a power loss before the flush may lose a
                # suffix of them (never one without those before it)
                deleted = [i for i in range(60) if i % 4]
                kept = sum(1 for i in deleted if b"k%03d" % i not in got)
                model = {b"k%03d" % i: b"r2-%d" % i + b"x" * 20 for i in range(60)
                         if i not in deleted[:kept]}
                assert got == model, (n, mode)


# ---------------------------------------------------------------------------------------------
# Finding: every open that fails on a damaged log leaves tables and a manifest behind
# ---------------------------------------------------------------------------------------------
def kinds(path) -> tuple[set, set]:
    names = os.listdir(path)
    return ({n for n in names if n.endswith(".sst")},
            {n for n in names if n.startswith("MANIFEST-")})


def test_opens_failing_on_a_damaged_log_do_not_pile_up_files(tmp_path):
    """Three logs; the last one damaged in its first record (valid records follow it:
    corruption, not a torn tail). Each open writes the older logs' writes to L0 tables
    (the memtable fills during the replay) and a new manifest, then fails on the damage:
    nothing removes them, so a shard restarted in a loop (deploy/sievekv-shard@.service:
    Restart=on-failure, RestartSec=1) grows its directory at every attempt."""
    from .test_review_recovery import SWEEP, _build_three_logs

    path = str(tmp_path / "db")
    _build_three_logs(path)
    clean = str(tmp_path / "clean")
    shutil.copytree(path, clean)
    with DB.open(clean, fs=FaultInjectionFS(), **SWEEP) as db:  # the older logs fill L0
        assert db.stats()["recovered_tables"] >= 2
    last = max(n for n in os.listdir(path) if n.endswith(".log"))
    with open(os.path.join(path, last), "r+b") as f:
        f.seek(12)  # a payload byte of the first record
        b = f.read(1)
        f.seek(12)
        f.write(bytes([b[0] ^ 1]))
    tables_before, _ = kinds(path)
    seen = []
    for _ in range(3):
        with pytest.raises(CorruptionError):
            DB.open(path, fs=FaultInjectionFS(), **SWEEP)
        seen.append(kinds(path))
    assert seen[-1][0] == tables_before, "tables written by failed opens were left behind"
    assert len(seen[-1][1]) == len(seen[0][1]), "each failed open left one more manifest"
