"""Review of aedc8e6 (a write batch becomes visible to lock-free readers at once), 09366d8
(recovery checks the tables it writes; flush() raises corruption as such) and the two
docstring commits on DB.write (5e9881b, 219d8ae).

Checked and holds (plain tests below, or by reading):

- The atomicity claim, for CPython 3.11 with its GIL. ``MemTable.add`` stores a multi-entry
  batch with one ``dict.update(dict)``: ``dict_merge`` with an exact dict as the argument
  (the clone path when the memtable is empty, else one resize up front and ``insertdict`` per
  entry). Nothing in it reaches the eval loop, so the GIL is not handed over: hashes come
  from the batch dict, equal hashes are compared with ``bytes_richcompare`` (C), a replaced
  record is a bytes object whose dealloc runs no Python code, and the only allocations are a
  keys table (``PyObject_Malloc``, not a GC-tracked object, so no collection starts). That
  needs the memtable's keys to be exact ``bytes`` on every path that reaches ``add``:
  DB.put/delete/write take a key only if ``type(key) is bytes`` or convert a
  bytearray/memoryview with ``bytes()``, and refuse a bytes subclass (which could carry a
  Python ``__eq__``/``__hash__``); values likewise; recovery and a read-only open feed
  slices of ``bytes`` (engine/wal/batch.py); the shard's Write passes protobuf ``bytes``;
  reshard writes keys from a scan; checkpoint and restore copy tables, not writes.
- No other path shows half a batch: a group (several writers' batches) is one ``add`` into
  the memtable the leader captured after its memtable switch, and only a group-commit leader
  (or the unsynced fast path, which runs only when no writer is queued) switches memtables,
  so a group never spans two memtables and a frozen memtable is never written again; a flush
  installs its table and drops the memtable from the read state in one publish under the
  mutex; DB.get and a later read each load the newest read state, so "once a read has
  returned one of its writes, every later read sees all of them" (219d8ae's wording) holds
  for get, multi_get and scan. A multi_get or a scan running *while* a batch lands may show
  its first keys old and its last keys new (the memtable's dict or chunks are read key by
  key); 219d8ae's wording allows that, 5e9881b's ("a concurrent get or multi_get that sees
  one of its writes sees every one of them") did not, and is gone. A Write through the router
  is atomic per shard only, as documented.
- ``_pending`` with repeated keys, and a key deleted then put again, in one batch: the batch
  dict keeps one entry per key (the last), so the SortedList gets each new key once; scan
  and get give the last pair; ``approximate_bytes`` still charges every pair of the batch.
- Recovery: every table recovery writes (older logs flushed when the memtable fills, a last
  log too large to carry) is in ``metas`` and checked before the edit; a failure removes
  them all, creates no log, closes the manifest and releases the lock (recover()'s own
  handler), keeps every log, and a later open on a sound disk recovers every write.
- flush() and close(): a close while flush() waits ends it with ClosedError (or a return,
  if the flush finished first); the shard maps a CorruptionError to DATA_LOSS.

Findings (strict xfails when written; both fixed in session 17, now plain tests):

1. flush() raises the DB's CorruptionError as soon as it sees one while it waits, without
   asking whether its own memtable is being flushed. When a background compaction fails (here
   its output fails its check) while the flush thread is installing flush()'s memtable, the
   flush completes (``_flush_memtable`` does not stop for the DB's error) and the memtable's
   writes are in L0, yet flush() has raised the compaction's CorruptionError: the shard's
   Flush answers DATA_LOSS for a flush that succeeded and lost nothing. Before 09366d8 it
   raised the write refusal (StorageIOError, "DB refuses writes after an earlier failure"),
   which is true of the DB and claims nothing about the flush.
2. ``sievekv flush`` (and ``compact``, same code: router/cli/report_cmds.py
   ``_print_sections``) exits 4, "partial failure: some shards failed while others
   succeeded" (docs/cli.md "Exit codes"), when every shard failed, DATA_LOSS included, and
   its error line ("Flush failed on 1 of 1 shards") does not say why (the cause is on
   stdout). docs/cli.md gives 1 for "data loss reported by a shard", as ``sievekv verify``
   does.

Noted, no test: flush() answers DATA_LOSS only when the DB fails *during* its wait; a flush()
called after (a retry of the same Flush) meets ``_check_writable`` first and answers INTERNAL
for the same failure (the docstring's "if it fails meanwhile" says so, but a caller sees two
codes for one state). engine/recovery.py step 5 has a 125-character line.

Faults come from the fault-injecting file layer (engine/faultfs.py) and from wrapping the table
set's ``_open_table`` (to hold a job at a known point, or to garble a file before it is
opened). Nothing asserts speed; every thread a test starts is joined and every DB closed.
"""

from __future__ import annotations

import os
import threading

import grpc
import pytest

from engine import DB
from engine.errors import ClosedError, CorruptionError, InvalidArgumentError, SieveError
from engine.faultfs import FaultInjectionFS
from engine.memtable import ENTRY_OVERHEAD
from shard.status import status_of

from .conftest import wait_until
from .test_review_session16b import SMALL, _fill  # noqa: F401


def _holds(db, model: dict) -> None:
    keys = sorted(model)
    assert db.multi_get(keys) == [model[k] for k in keys]
    assert dict(db.scan()) == model


def _files(path, ext: str) -> dict[str, int]:
    return {f: os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
            if f.endswith(ext)}


# ------------------------------------------------------------------------------------------
# what holds
# ------------------------------------------------------------------------------------------
def test_a_bytes_subclass_key_or_value_never_reaches_the_memtable(tmp_path):
    """A key with a Python __eq__/__hash__ would run Python code inside dict.update."""

    class Key(bytes):
        def __hash__(self):
            return 1

        def __eq__(self, other):
            return bytes.__eq__(self, other)

    with DB.open(str(tmp_path / "db"), **SMALL) as db:
        for call in (lambda: db.put(Key(b"k"), b"v"), lambda: db.delete(Key(b"k")),
                     lambda: db.write([(b"a", b"1"), (Key(b"k"), b"v")]),
                     lambda: db.write([(b"a", b"1"), (b"k", Key(b"v"))])):
            with pytest.raises(InvalidArgumentError):
                call()
        db.write([(bytearray(b"b"), memoryview(b"2")), (b"c", bytearray(b"3"))])
        assert all(type(k) is bytes and type(r) is bytes for k, r in db._mem._data.items())
        assert db.multi_get([b"a", b"b", b"c", b"k"]) == [None, b"2", b"3", None]


def test_a_batch_repeating_keys_keeps_one_sorted_entry_per_key(tmp_path):
    with DB.open(str(tmp_path / "db"), **SMALL) as db:
        db.put(b"old", b"0")
        mem = db._mem
        before = mem.approximate_bytes
        batch = [(b"k", b"1"), (b"old", None), (b"k", None), (b"j", None), (b"k", b"2"),
                 (b"old", b"3"), (b"j", b"4"), (b"j", None), (b"m", b"5")]
        db.write(batch)
        assert db.multi_get([b"j", b"k", b"m", b"old"]) == [None, b"2", b"5", b"3"]
        assert list(db.scan()) == [(b"k", b"2"), (b"m", b"5"), (b"old", b"3")]
        with mem.lock:
            keys = list(mem._sorted_keys())
        assert keys == sorted(set(keys)) == [b"j", b"k", b"m", b"old"]
        assert mem._pending == [] and len(mem) == 4
        # every pair charged, as one store after another would (module docstring "Sizes")
        assert mem.approximate_bytes - before == sum(
            len(k) + len(v or b"") + ENTRY_OVERHEAD for k, v in batch)


def test_recovery_that_fails_its_check_keeps_every_log_and_removes_every_table(tmp_path):
    """Several recovery tables (an older log replayed into 64 KiB memtables), one garbled."""
    path = str(tmp_path / "db")
    fs = FaultInjectionFS(seed=5)
    db = DB.open(path, fs=fs, **dict(SMALL, memtable_bytes=1 << 20))
    try:
        model = _fill(db, 900, seed=5)  # ~270 KB charged: one memtable, one log
        fs.garble_on_sync(lambda p: p.endswith(".sst"), from_end=3)
        with pytest.raises(CorruptionError):  # its flush fails: the log stays, not flushed
            db.flush()
        fs.garble_on_sync(None)
    finally:
        db.close()
    logs = _files(path, ".log")
    assert len(logs) == 2 and not _files(path, ".sst")  # the data's log, the empty new one

    fs = FaultInjectionFS(seed=6)
    seen: list[str] = []

    def third_table(p: str) -> bool:
        if p.endswith(".sst") and p not in seen:
            seen.append(p)
        return len(seen) == 3 and p == seen[2]

    fs.garble_on_sync(third_table, from_end=3)
    with pytest.raises(CorruptionError, match="recovery output failed its check"):
        DB.open(path, fs=fs, **SMALL)
    assert len(seen) >= 4  # recovery wrote several tables, and checked them all
    assert not _files(path, ".sst")  # every one removed, not only the garbled one
    assert _files(path, ".log") == logs  # no log removed, changed or created
    with DB.open(path, **SMALL) as db:  # the lock was released; the disk is sound now
        assert db.counters.recovered_tables >= 4
        _holds(db, model)


def test_close_while_flush_waits_ends_the_flush_with_closed_error(tmp_path):
    path = str(tmp_path / "db")
    db = DB.open(path, **SMALL)
    entered = threading.Event()
    outcome: list = []
    real_open = db._tables._open_table

    def hold_flush_output(p, number):
        if threading.current_thread().name.startswith("sievekv-flush"):
            entered.set()
            wait_until(lambda: db._closing, "close() to start", timeout=30, poll=0.01)
        return real_open(p, number)

    db._tables._open_table = hold_flush_output

    def flush():
        try:
            db.flush()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - examined below
            outcome.append(exc)

    try:
        model = _fill(db, 200, seed=8)
        t = threading.Thread(target=flush)
        t.start()
        try:
            assert entered.wait(30), "the flush thread never opened its output"
        finally:
            db.close()
            t.join(30)
        assert not t.is_alive()
    finally:
        db.close()
    assert len(outcome) == 1
    assert outcome[0] is None or isinstance(outcome[0], ClosedError), outcome[0]
    with DB.open(path, **SMALL) as db:
        _holds(db, model)


# ------------------------------------------------------------------------------------------
# findings
# ------------------------------------------------------------------------------------------
# Fixed in session 17; was a strict xfail: flush() raises a compaction's CorruptionError (the
# shard answers DATA_LOSS) for a flush that completes and loses nothing
def test_a_compaction_failing_while_flush_waits_is_not_reported_as_the_flush_losing_data(
        tmp_path):
    path = str(tmp_path / "db")
    fs = FaultInjectionFS(seed=17)
    # Only the compaction's outputs are garbled (table_workers 0: its thread writes them).
    fs.garble_on_sync(lambda p: p.endswith(".sst")
                      and threading.current_thread().name.startswith("sievekv-compact"),
                      from_end=3)
    opts = dict(SMALL, memtable_bytes=1 << 20, disable_auto_compactions=False,
                l0_compaction_trigger=2)
    db = DB.open(path, fs=fs, **opts)
    flush_output_opened = threading.Event()
    release = threading.Event()
    hold_flush = threading.Event()
    real_open = db._tables._open_table

    def gate(p, number):
        if number not in db._version.live_numbers():  # a new output, before its check
            name = threading.current_thread().name
            if name.startswith("sievekv-compact"):
                # the compaction fails its check only once flush() waits on its memtable
                flush_output_opened.wait(30)
            elif name.startswith("sievekv-flush") and hold_flush.is_set():
                flush_output_opened.set()
                release.wait(30)  # until flush() has returned or raised
        return real_open(p, number)

    db._tables._open_table = gate
    raised = None
    try:
        model = _fill(db, 300, seed=1)
        db.flush()
        model.update(_fill(db, 300, seed=2))
        db.flush()  # L0 holds 2 tables: the compaction starts, and waits at its output
        hold_flush.set()
        model.update(_fill(db, 300, seed=3))
        mem = db._mem
        try:
            db.flush()
        except SieveError as exc:
            raised = exc
        finally:
            release.set()
        # The flush it waited for completes: its memtable's writes are in L0 (and durable).
        wait_until(lambda: mem not in db._frozen, "the flush to finish")
        assert len(db._version.levels[0]) == 3
        assert "compaction output failed its check" in (db.stats()["failed"] or "")
        _holds(db, model)
    finally:
        release.set()
        flush_output_opened.set()
        db.close()
    with DB.open(path, **SMALL) as db:
        _holds(db, model)
    code = status_of(raised)[0] if raised is not None else grpc.StatusCode.OK
    assert code != grpc.StatusCode.DATA_LOSS, (
        f"the shard's Flush would answer DATA_LOSS for a flush that succeeded: {raised}")


# Fixed in session 17; was a strict xfail: `sievekv flush` exits 4 (partial) when every shard
# failed with DATA_LOSS; docs/cli.md gives 1 for data loss
def test_flush_with_data_loss_on_every_shard_exits_as_documented(capsys):
    from router.cli import report_cmds
    from router.cli.exit_codes import ERROR, CliError
    from sievekv_proto import sievekv_pb2 as pb

    # What the router's Flush attaches when its only shard answered DATA_LOSS (the CLI reads
    # these sections from the trailer: router/admin_servicer.py _everywhere).
    sections = [pb.ShardSection(shard="shard-0", address="127.0.0.1:1", ok=False,
                                code=grpc.StatusCode.DATA_LOSS.value[0],
                                error="corruption in /d/000012.sst: flush output failed its "
                                      "check before install")]
    with pytest.raises(CliError) as info:
        report_cmds._print_sections(sections, "Flush", "flushed")
    assert "DATA_LOSS" in capsys.readouterr().out  # the cause, on stdout
    assert info.value.code == ERROR, (info.value.code, str(info.value))
