"""Review of session 16's early open of output tables (fee8ae4, 2cb1762): engine/background.py
``_open_outputs`` opens a flush's or compaction's outputs before the manifest edit, outside
the DB mutex, and ``_log_and_apply`` closes them again if the edit fails.

Plain tests pin what was checked and holds: the reference counts of engine/table_set.py
(an early-opened table sits at zero references, listed by no read state, until the publish
takes one) with read states held across the install and the releaser thread running inside
that window; an early open failing part-way (any error, EMFILE included) closes what it
opened and its second try opens them once more (session 17: before the edit, no longer in
the publish); a trivial move keeps its (published) table
when its edit fails; a flush or compaction whose manifest edit fails leaves no output open,
keeps its inputs, and fails the DB as before (not retried); subcompactions; the filter cap's
bookkeeping. Every DB is closed, and the process-wide count of open tables
(engine/open_files.py) is back where it started after each close: no table leaked open.

The one finding (fixed in session 16; its two tests were strict xfails, now plain): the clean-up of the early-opened tables
is not best effort. ``TableSet.unref`` pops every table first, then closes them one by one; a
close that raises (close(2) may report EIO, e.g. on NFS) escapes it, leaving the rest never
closed. ``_log_and_apply`` then raises that close error in place of the manifest's, and
``_open_outputs`` (documented "best effort: on any error ... left to the publish") raises it
instead of leaving the publish to open the tables.

Docs (no test; see the report): the manifest edit that fails is never retried (the manifest
is failed for good, so ``_full_disk`` is false: tested below), so _open_outputs' docstring and
2cb1762's reason, "a compaction retried after a full disk would otherwise leave its tables
open at every try", describe a case that cannot happen; what the close does buy is a failed
DB kept open for reads holding no unpublished table.

Faults come from the fault-injecting file layer (tests/test_review_recovery.py ReviewFS:
faults chosen by file name) and, as tests/test_install_opens.py does, by wrapping the table
set's ``_open_table`` (an open that fails, a table whose close fails). No engine part is
mocked; nothing asserts speed.
"""

from __future__ import annotations

import errno
import gc
import os
import random
import threading

import pytest

from engine import DB, filenames
from engine import open_files
from engine.compaction.picker import CompactionTask
from engine.errors import StorageIOError

from .conftest import wait_until
from .test_review_recovery import ReviewFS

SMALL = dict(memtable_bytes=64 * 1024, target_file_size=16 * 1024, table_workers=0,
             disable_auto_compactions=True)


def _open_count() -> int:
    """Tables open in this process, over every DB (engine/open_files.py)."""
    with open_files._process.lock:
        return open_files._process.count


def _fill(db, n: int, seed: int) -> dict:
    rng = random.Random(seed)
    model = {}
    for _ in range(n):
        k, v = rng.randbytes(16), rng.randbytes(100)
        db.put(k, v)
        model[k] = v
    return model


def _reopened_holds(path, model: dict) -> None:
    """A reopen of ``path`` (default options) reads the writes of ``model`` back."""
    with DB.open(path) as db:
        _holds(db, model)


def _holds(db, model: dict, sample: int = 300) -> None:
    keys = random.Random(7).sample(sorted(model), min(sample, len(model)))
    assert db.multi_get(keys) == [model[k] for k in keys]


def _settled(db) -> bool:
    """The releaser has caught up: exactly the live tables are open, one reference each
    (held by the current read state). gc first: a read state is released by its finalizer."""
    gc.collect()
    ts = db._tables
    live = set(db._version.live_numbers())
    with ts._lock:
        return set(ts._tables) == live and all(ts._refs.get(n) == 1 for n in live)


def _settle(db) -> None:
    wait_until(lambda: _settled(db), "the open tables to be the live ones, one reference each")


class _Opens:
    """Wraps the DB's ``TableSet._open_table``: records each table object opened, by
    number, and whether the number was an output (not live in the version at that moment);
    ``fail(number, is_output, nth_output)`` may raise to make that open fail."""

    def __init__(self, db, fail=None):
        self.db = db
        self.fail = fail
        self.objects: dict[int, list] = {}
        self.outputs: list[int] = []
        self.thread: dict[int, str] = {}  # output number -> the thread that first opened it
        ts = db._tables
        real = ts._open_table

        def open_table(path, number):
            is_output = number not in db._version.live_numbers()
            if is_output and number not in self.outputs:
                self.outputs.append(number)
                self.thread[number] = threading.current_thread().name
            if self.fail is not None:
                self.fail(number, is_output, len(self.outputs))
            t = real(path, number)
            self.objects.setdefault(number, []).append(t)
            return t

        ts._open_table = open_table


def _two_flushes(db, seed: int = 1) -> dict:
    model = _fill(db, 1500, seed)
    db.flush()
    model.update(_fill(db, 1500, seed + 1))
    db.flush()
    return model


# ------------------------------------------------------------------------------------------
# reference counts: what holds
# ------------------------------------------------------------------------------------------
def test_each_output_is_opened_once_and_ends_with_one_reference(tmp_path):
    """A manual compaction with many outputs: each output is opened exactly once (early; the
    publish finds it), and afterwards exactly the live tables are open, one reference each."""
    base = _open_count()
    with DB.open(tmp_path / "db", **SMALL) as db:
        model = _two_flushes(db)
        opens = _Opens(db)
        db.compact()
        assert len(opens.outputs) >= 5, opens.outputs
        assert all(len(opens.objects[n]) == 1 for n in opens.outputs), opens.objects
        _settle(db)
        ts = db._tables.open_tables()
        assert all(ts[n] is opens.objects[n][0] for n in opens.outputs)
        _holds(db, model)
    assert _open_count() == base


def test_read_states_held_across_the_install_and_the_releaser_in_its_window(tmp_path):
    """An old read state (A) and a scan in progress (on the current one, C) hold the
    compaction's inputs. Inside the window between the early open and the publish (in the
    manifest edit), A is dropped and the releaser runs: it takes A's references off and
    closes nothing (the outputs sit open at zero references, the inputs keep C's). After the
    publish the outputs have one reference each; the scan, started before, completes on the
    inputs, which close once it is gone."""
    base = _open_count()
    with DB.open(tmp_path / "db", **SMALL) as db:
        model = _two_flushes(db)
        pinned = [db._rs]  # A: lists the two tables
        a_numbers = set(pinned[0].numbers)
        db.put(b"extra", b"1")
        model[b"extra"] = b"1"
        db.flush()  # a third table; the current read state C lists all three
        inputs = set(db._version.live_numbers())
        scan = db.scan()  # holds C
        first = next(scan)
        ts = db._tables

        def refs_are(want) -> bool:
            gc.collect()
            with ts._lock:
                return all(ts._refs.get(n) == want(n) for n in inputs)

        # Settled: A and C hold A's tables, C alone the third (the switch's read state in
        # between is released by now).
        wait_until(lambda: refs_are(lambda n: 2 if n in a_numbers else 1),
                   "the references of A and C")
        manifest = db._manifest
        real_apply = manifest.log_and_apply
        seen = {}

        def apply(edit):
            outs = [m.number for _, m in edit.new_files]
            pinned.clear()  # A goes: its finalizer queues its release for the releaser
            wait_until(lambda: refs_are(lambda n: 1), "the releaser to drop A's references")
            open_now = ts.open_tables()
            with ts._lock:
                seen["refs"] = [ts._refs.get(n) for n in outs]
            seen["outputs"] = outs
            seen["open"] = all(n in open_now for n in outs)
            seen["inputs_open"] = inputs <= set(open_now)
            return real_apply(edit)

        manifest.log_and_apply = apply
        try:
            db.compact()
        finally:
            manifest.log_and_apply = real_apply
        assert seen["outputs"] and seen["open"] and seen["inputs_open"], seen
        assert seen["refs"] == [0] * len(seen["outputs"])
        with ts._lock:
            assert all(ts._refs[n] == 1 for n in seen["outputs"])
        rest = list(scan)
        assert dict([first] + rest) == model  # the scan read the inputs to the end
        del scan, rest
        _settle(db)
        assert not inputs & set(ts.open_tables())
        _holds(db, model)
    assert _open_count() == base


def test_flushes_compactions_and_readers_at_once_keep_the_counts_exact(tmp_path):
    """Automatic flushes and compactions (the background threads' early opens) while a
    reader thread runs gets and scans: every read is right, none fails, and once idle the
    open tables are exactly the live ones with one reference each."""
    base = _open_count()
    errors = []
    with DB.open(tmp_path / "db", memtable_bytes=64 * 1024, target_file_size=16 * 1024,
                 l0_compaction_trigger=2, table_workers=0) as db:
        fixed = _fill(db, 500, seed=50)
        stop = threading.Event()

        def reader():
            keys = sorted(fixed)
            i = 0
            try:
                while not stop.is_set():
                    k = keys[i % len(keys)]
                    if db.get(k) != fixed[k]:
                        errors.append(f"wrong value for {k!r}")
                    if i % 50 == 0:
                        for _ in db.scan(start=k, limit=20):
                            pass
                    i += 1
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(repr(exc))

        t = threading.Thread(target=reader)
        t.start()
        try:
            rng = random.Random(51)
            for _ in range(6000):  # other keys: the fixed ones keep their values
                db.put(b"z" + rng.randbytes(15), rng.randbytes(100))
            db.flush()
            assert db.wait_for_compactions(timeout=120)
        finally:
            stop.set()
            t.join()
        assert errors == []
        st = db.stats()
        assert st["flushes"] >= 5 and st["compactions"] >= 2 and st["failed"] is None
        _settle(db)
        _holds(db, fixed)
    assert _open_count() == base


def test_split_compactions_open_their_outputs_before_publishing(tmp_path):
    """Subcompactions (_run_split -> _install): the combined outputs are opened before the
    publish, once each, and end with one reference."""
    base = _open_count()
    opts = dict(memtable_bytes=64 * 1024, target_file_size=16 * 1024, table_workers=1,
                max_subcompactions=2, disable_auto_compactions=True)
    with DB.open(tmp_path / "db", **opts) as db:
        model = _two_flushes(db, seed=60)
        model.update(_fill(db, 1500, 62))
        db.flush()
        inside = threading.local()
        under = []
        real_publish = db._publish

        def publish():
            inside.on = True
            try:
                real_publish()
            finally:
                inside.on = False

        def note(number, is_output, nth):
            if getattr(inside, "on", False):
                under.append(number)

        db._publish = publish
        opens = _Opens(db, fail=note)
        db.compact()
        st = db.stats()
        assert st["subcompactions"] >= 2, st["subcompactions"]  # the split path ran
        assert st["failed"] is None
        assert under == [], f"outputs opened while publishing: {under}"
        assert opens.outputs and all(len(opens.objects[n]) == 1 for n in opens.outputs)
        _settle(db)
        _holds(db, model)
    assert _open_count() == base


# ------------------------------------------------------------------------------------------
# an early open that fails
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("err", ["eio", "emfile"])
def test_an_early_open_failing_part_way_closes_what_it_opened(tmp_path, err):
    """The third output fails to open early (an I/O error; or EMFILE, with the DB not
    allowed to raise the limit): the two opened before are closed again, the second try (since
    session 17; the publish used to) opens all of them afresh, and the compaction installs. With a filter cap, no closed table is
    left in the cap's ring."""
    base = _open_count()
    failed = []

    def fail(number, is_output, nth):
        if is_output and nth == 3 and not failed:
            failed.append(number)
            raise StorageIOError("injected open failure", path=f"{number}.sst",
                                 errno_=errno.EIO if err == "eio" else errno.EMFILE)

    with DB.open(tmp_path / "db", filter_memory_cap=16 * 1024, raise_open_file_limit=False,
                 **SMALL) as db:
        model = _two_flushes(db, seed=70)
        for k in list(model)[:400]:  # probes fault filter partitions in (the cap's ring)
            db.get(k)
        db.get(b"\x00absent")
        opens = _Opens(db, fail=fail)
        db.compact()
        assert failed and db.stats()["failed"] is None
        first_two = opens.outputs[:2]
        for n in first_two:
            early, again = opens.objects[n]  # opened twice: early, then the second try
            assert early._closed and not again._closed
        assert len(opens.objects[failed[0]]) == 1  # only the second try's open succeeded
        _settle(db)
        open_now = db._tables.open_tables()
        assert all(open_now[n] is opens.objects[n][-1] for n in opens.outputs)
        _holds(db, model)
        ring_tables = {id(t) for t, _, _ in db.filter_cap._ring.values()}
        assert ring_tables <= {id(t) for t in open_now.values()}
    assert _open_count() == base


def test_an_output_that_cannot_be_opened_at_all_is_not_installed(tmp_path):
    """The early open and its second try both fail. Session 17 changed what follows: the
    flush fails *before* its manifest edit (it used to make the edit, then fail to publish,
    leaving a manifest that lists a table no open could read). flush() raises, the DB is failed
    for good, the output file is gone, the memtable's log is kept, and the reopen replays it:
    every write is there and the failed output is in no version."""
    base = _open_count()
    path = tmp_path / "db"
    # 300 puts fit one memtable here: no background flush may run (and hit the injected
    # failure) before db.flush() below (with SMALL's 64 KiB one did, once in ~10 runs)
    db = DB.open(path, **{**SMALL, "memtable_bytes": 1 << 20})
    try:
        model = _fill(db, 300, seed=80)
        assert db.stats()["flushes"] == 0
        log_number = db._mem.log_number
        bad = []

        def fail(number, is_output, nth):
            if is_output or number in bad:  # the second try opens the same number again
                bad.append(number)
                raise StorageIOError("injected open failure", path=f"{number}.sst",
                                     errno_=errno.EIO)

        _Opens(db, fail=fail)
        with pytest.raises(StorageIOError, match="flush output failed its check before "
                                                 "install, so nothing was installed"):
            db.flush()
        assert len(bad) == 2 and bad[0] == bad[1]  # the early open, then its second try
        st = db.stats()
        assert st["failed"] is not None and st["failed_retrying"] is False
        assert st["flushes"] == 0
        assert not set(bad) & set(db._tables.open_tables())
        assert not os.path.exists(filenames.table_file_name(str(path), bad[0]))
        assert os.path.exists(filenames.log_file_name(str(path), log_number))
        assert db._pending_outputs == set()
        _holds(db, model)  # reads go on (the memtable is still in the read state)
    finally:
        db.close()
    assert _open_count() == base
    with DB.open(path, **SMALL) as db:
        _holds(db, model)
        assert bad[0] not in db._version.live_numbers()


# ------------------------------------------------------------------------------------------
# a manifest edit that fails
# ------------------------------------------------------------------------------------------
def test_a_flush_whose_manifest_edit_fails_behaves_as_before(tmp_path):
    """ENOSPC on the manifest append: the flush fails, the DB is failed for good (a failed
    manifest refuses every edit: no retry), its output is not left open, the memtable's log
    stays on disk, no number stays reserved; the reopen holds every write."""
    base = _open_count()
    path = tmp_path / "db"
    fs = ReviewFS(seed=90)
    # one memtable holds the 300 puts: no background flush may meet the fault first
    db = DB.open(str(path), fs=fs, **{**SMALL, "memtable_bytes": 1 << 20})
    try:
        model = _fill(db, 300, seed=90)
        assert db.stats()["flushes"] == 0
        log_number = db._mem.log_number
        opens = _Opens(db)
        fs.append_fault = lambda p: "MANIFEST" in p
        with pytest.raises(StorageIOError):
            db.flush()
        fs.append_fault = None
        assert opens.outputs and all(t._closed for n in opens.outputs for t in opens.objects[n])
        assert not set(opens.outputs) & set(db._tables.open_tables())
        assert os.path.exists(filenames.log_file_name(str(path), log_number))
        assert db._pending_outputs == set()
        st = db.stats()
        assert st["failed"] is not None and st["failed_retrying"] is False
        with pytest.raises(StorageIOError, match="reopen"):
            db.put(b"x", b"y")
        _holds(db, model)
    finally:
        db.close()
    assert _open_count() == base
    _reopened_holds(path, model)


def test_a_compaction_whose_manifest_edit_fails_is_not_retried_and_leaves_no_output_open(
        tmp_path):
    """ENOSPC on the compaction's manifest append, in the compaction thread only: the DB is
    failed for good and the compaction thread ends (no retry after a failed manifest: the
    "retried after a full disk" of _open_outputs' docstring cannot happen). No output is
    left open; the inputs stay open, one reference each; reads go on."""
    base = _open_count()
    path = tmp_path / "db"
    fs = ReviewFS(seed=91)
    db = DB.open(str(path), fs=fs, memtable_bytes=64 * 1024, target_file_size=16 * 1024,
                 l0_compaction_trigger=2, table_workers=0)
    try:
        fs.append_fault = (lambda p: "MANIFEST" in p
                           and threading.current_thread().name.startswith("sievekv-compact"))
        opens = _Opens(db)
        with db._compaction_lock:  # the compactor waits: the fill is not refused half-way
            model = _fill(db, 800, seed=91)
            db.flush()
        wait_until(lambda: db.stats()["failed"] is not None, "the compaction to fail")
        compactor = db._threads[1]
        compactor.join(60)
        assert not compactor.is_alive()  # not retried
        st = db.stats()
        assert st["failed_retrying"] is False and st["compaction_retrying"] is None
        assert st["compactions"] == 0
        outputs = [n for n in opens.outputs if opens.thread[n].startswith("sievekv-compact")]
        assert outputs and all(o._closed for n in outputs for o in opens.objects[n])
        _settle(db)  # the inputs: open, one reference each; no output among the open
        _holds(db, model)
    finally:
        db.close()
    assert _open_count() == base
    _reopened_holds(path, model)


def test_a_trivial_move_whose_manifest_edit_fails_keeps_its_table(tmp_path):
    """A trivial move's "output" is its input, published already: when its edit fails, the
    table keeps its reference and stays open (2cb1762 leaves trivial moves out of the early
    open; without that the failed edit's unref would close a table the read state uses)."""
    base = _open_count()
    fs = ReviewFS(seed=92)
    db = DB.open(str(tmp_path / "db"), fs=fs, **SMALL)
    try:
        model = _fill(db, 60, seed=92)
        db.flush()
        db.compact()  # one table, in L1
        levels = db._version.levels
        assert not levels[0] and len(levels[1]) == 1
        f = levels[1][0]
        table = db._tables.open_tables()[f.number]
        task = CompactionTask(1, 2, (f,), (), True, True, "manual", 0.0)
        fs.append_fault = lambda p: "MANIFEST" in p
        with pytest.raises(StorageIOError):
            with db._compaction_lock:
                db._run_manual_task(task)
        fs.append_fault = None
        assert not table._closed
        with db._tables._lock:
            assert db._tables._tables.get(f.number) is table
            assert db._tables._refs.get(f.number) == 1
        _holds(db, model)
        assert db.stats()["failed"] is not None
    finally:
        db.close()
    assert _open_count() == base


# ------------------------------------------------------------------------------------------
# finding: the clean-up of early-opened tables is not best effort
# ------------------------------------------------------------------------------------------
class _CloseFails:
    """Output tables whose close() closes them and then raises OSError(EIO), as close(2) may
    (the descriptor is released all the same)."""

    def __init__(self, opens: _Opens, how_many: int = 1):
        self.left = how_many
        self.raised = 0
        self.opens = opens

    def arm(self) -> None:
        for n in self.opens.outputs:
            for t in self.opens.objects.get(n, []):
                self._wrap(t)

    def _wrap(self, t) -> None:
        real = t.close

        def close():
            real()
            if self.left > 0:
                self.left -= 1
                self.raised += 1
                raise OSError(errno.EIO, "injected: close failed")

        t.close = close

    def close_leftovers(self) -> None:
        """Close (descriptors, mappings) what the finding leaves open, so that the test process
        does not keep it (Table.close is idempotent)."""
        for objs in self.opens.objects.values():
            for t in objs:
                t.close()


# Fixed in session 16; was a strict xfail:  engine/background.py _log_and_apply: the unref of
# the early-opened outputs runs in the  except block unguarded; a close that raises replaces
# the manifest's error (compact()  raises a raw OSError, not the StorageIOError that fails the
# DB), and TableSet.unref  leaves every table after the failing one popped and never closed
def test_a_failing_close_after_a_failed_manifest_edit_keeps_the_manifest_error(tmp_path):
    base = _open_count()
    fs = ReviewFS(seed=93)
    db = DB.open(str(tmp_path / "db"), fs=fs, **SMALL)
    try:
        model = _two_flushes(db, seed=93)
        opens = _Opens(db)
        closes = _CloseFails(opens)
        real_apply = db._manifest.log_and_apply

        def apply(edit):  # the outputs are open now: make their close fail, then the append
            closes.arm()
            fs.append_fault = lambda p: "MANIFEST" in p
            return real_apply(edit)

        db._manifest.log_and_apply = apply
        try:
            with pytest.raises(StorageIOError) as exc:
                db.compact()
        finally:
            db._manifest.log_and_apply = real_apply
            fs.append_fault = None
        assert exc.value.errno == errno.ENOSPC
        assert len(opens.outputs) >= 3
        assert all(t._closed for n in opens.outputs for t in opens.objects[n])
        assert db.stats()["failed"] is not None
        _holds(db, model)
    finally:
        db.close()
        closes.close_leftovers()
    assert _open_count() == base


# Fixed in session 16; was a strict xfail:  engine/background.py _open_outputs: documented
# best effort ('on any error ... left to  the publish'), but the unref in its except block is
# unguarded: a close that raises  escapes, the compaction fails (a raw OSError) instead of
# installing, and tables after  the failing one are never closed
def test_a_failing_close_after_a_failed_early_open_leaves_it_to_the_second_try(tmp_path):
    base = _open_count()
    with DB.open(tmp_path / "db", **SMALL) as db:
        model = _two_flushes(db, seed=94)
        state = {}

        def fail(number, is_output, nth):
            if is_output and nth == 4 and "failed" not in state:
                state["failed"] = number
                closes.arm()  # the three opened before fail to close (the first raises)
                raise StorageIOError("injected open failure", path=f"{number}.sst",
                                     errno_=errno.EIO)

        opens = _Opens(db, fail=fail)
        closes = _CloseFails(opens)
        try:
            db.compact()
            assert closes.raised == 1 and db.stats()["failed"] is None
            assert all(t._closed for n in opens.outputs[:3] for t in opens.objects[n][:1])
            _settle(db)
            _holds(db, model)
        finally:
            db.close()
            closes.close_leftovers()
    assert _open_count() == base
