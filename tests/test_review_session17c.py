"""Review of the write timeout (ff6340c "Writes take a timeout: a write stall fails them,
unapplied, instead of outliving the caller", d87e19a "Group commit: the group's bytes are
counted only when the leader must make room").

Checked and holds (plain tests below, or by reading):

- The central promise: a write that raises WriteStalledError was neither logged nor applied.
  ``Withdrawn`` comes from two places only: a follower that leaves the queue (under the DB
  mutex, only when it is not the head and not ``taken``; ``taken`` is set under the same
  mutex by ``_build_group`` before ``commit`` releases it, so a follower is either in a group
  or out of the queue, never both), and ``_make_room_for_write`` inside the leader's prepare,
  which runs before anything is encoded or logged (a memtable switch it made first writes
  nothing of the write). ``_commit`` no longer makes room, so a group's commit never raises
  Withdrawn to its followers. A group is a prefix of the queue, so the leader's ``popleft``
  per member and a follower's ``remove`` from the middle never touch each other's writers.
  A seeded stress (threads with mixed timeouts, sync and unsynced, flush() as a solo writer,
  the stall switched on and off) ends with every key holding the last value acknowledged to
  its thread, before and after a reopen.
- A leader whose prepare raises pops itself and wakes the queue; the next writer leads, with
  its own deadline (or none). A solo writer (flush's forced switch) skips prepare; a timed
  write behind it withdraws while it waits at the stop. The unsynced fast path never runs
  while a leader waits in prepare (the queue is not empty), so it cannot overtake a held
  write; it checks the same room conditions as prepare.
- No lost wake-up: a withdrawal never changes the head (only non-heads withdraw); a failed
  prepare and a finished group notify whenever writers remain. close() while writers wait
  (with and without timeouts) ends each with ClosedError (or WriteStalledError), none
  applied, and close() returns.
- The group budget: ``group_bytes()`` includes the leader, so the group is never empty; a
  sync write still never joins an unsynced leader; writers charged are a prefix of the
  queue at prepare time and stay one (new writers append), so none of them is cut from the
  group and charged again by the next leader on that account.
- The shard: ``write_timeout`` is None without a deadline (gRPC's ~9.2e18 s), the remaining
  time less min(10 %, 0.25 s) otherwise, 0 for an expired deadline; WriteStalledError maps to
  RESOURCE_EXHAUSTED; the router counts that as an answer (call slots not hung); a Write
  spanning two shards reports ``applied=False`` with RESOURCE_EXHAUSTED for the stalled shard
  and ``applied=True`` for the other; the CLI maps the message to exit 7 (BUSY).

Findings (strict xfails when written; all fixed in session 17, now plain tests):

1. A refused write stays charged to the write controller. ``wc.delay(nbytes)`` moves the
   token bucket's ``_next_refill`` forward by nbytes / rate, and only then does
   ``_make_room_for_write`` compare the pause with the deadline and raise Withdrawn. Nothing
   is written, but every later write waits for those bytes too, and each retry of a refused
   write pushes the horizon further: at 10 kB/s three refused 100 kB writes leave 30 s of
   debt, so a 2-byte write with a 5 s timeout is refused as well. Under a shard's load, where
   every write has a timeout and clients retry RESOURCE_EXHAUSTED ("retry later"), a slowdown
   becomes a stop for as long as the delay lasts. The same charge makes a refused leader's
   followers pay twice (its prepare charged the group; the next leader charges them again).
2. ``timeout=float("inf")`` (or any timeout over ``threading.TIMEOUT_MAX``, ~292 years) passes
   ``_deadline``'s check, but a follower with it calls ``Condition.wait(inf)``, which raises
   OverflowError after its Writer was queued: the Writer stays in the queue with no thread
   behind it. Once it reaches the head nobody leads: every later write waits for ever (or is
   refused at its timeout, "queued behind other writes"), and close() spins for ever in
   ``while self._gc.pending()``. Had a leader taken it into a group, the write would have
   been applied while its caller got an exception.
3. In the full-disk failed state (recoverable) a timed write waits in ``_check_writable`` for
   the flush thread's retry, up to RETRY_WAIT_S (5 s), whatever its timeout: prepare calls
   ``_make_room_for_write``, whose first step is ``_check_writable``, which knows no deadline.
   A shard's Put with a 1 s deadline then answers DEADLINE_EXCEEDED, and is applied
   afterwards if the retry succeeds: what the commit says it ends.
4. A timed write queued behind a leader that is not held at all (its log append or fsync is
   merely slow) withdraws at its deadline and raises WriteStalledError "the DB holds writes
   (queued behind other writes)", counted in ``write_stall.timeouts``. DB.put's docstring
   bounds only the wait "for room while writes are held (a write stall ...)" and says "A
   write that finds room is applied, however late"; engine/errors.py says "queued behind such
   a write" (a held one). Either the refusal or the docs and message are wrong.

Noted, no test:

- The group module's docstring says prepare "returns the bytes it charged (to the write
  controller)"; it returns the group's bytes whenever a stall condition held, also when it
  charged nothing (a memtable switch, a stop, disable_auto_compactions past the slowdown
  trigger), and the group is then capped at that size anyway.
- A follower whose deadline passes while the DB mutex is held (a leader's memtable switch
  fsyncs the old log under it), or at the moment the leader wakes from its stall, is taken
  into the group and applied late, returning success: allowed by the docs ("late or not"),
  but a shard's caller may have given up by then (the margin is at most 0.25 s).
- docs/cli.md "Exit codes" (7: "a full disk or its limit of scans at once"), the same table in
  router/cli/exit_codes.py and router/client_errors.py's RESOURCE_EXHAUSTED row do not name
  a write stall, which now answers RESOURCE_EXHAUSTED too.
- docs/cli.md's paragraph names L0 at l0_stop_trigger and a held rate, not
  max_frozen_memtables, which holds writes the same way.
"""

from __future__ import annotations

import errno
import random
import threading
import time

import grpc
import pytest

from engine import DB
from engine.errors import ClosedError, InvalidArgumentError, StorageIOError, WriteStalledError
from router.cli.exit_codes import BUSY, from_client_error
from router.client import Client
from router.client_errors import ClientError, PartialWriteError
from router.cluster_map import ClusterMap
from router.server import create_router_server
from shard.server import create_server
from shard.servicer import write_timeout
from shard.status import status_of

from .conftest import poll_until
from .test_review_recovery import ReviewFS
from .test_write_timeout import VALUE, _stopped

SLOWED = dict(l0_compaction_trigger=2, l0_slowdown_trigger=2, l0_stop_trigger=100,
              delayed_write_rate=10_000, table_workers=0)


def _two_tables_in_l0(db) -> None:
    for i in range(2):
        db.put(b"base%d" % i, b"v")
        db.flush()


def _run(fn, out: dict, name: str) -> threading.Thread:
    """Run ``fn`` in a thread; ``out[name]`` becomes "ok" or the exception it raised."""
    def body():
        try:
            fn()
            out[name] = "ok"
        except BaseException as exc:  # noqa: BLE001 (reported to the test)
            out[name] = exc

    t = threading.Thread(target=body, name=f"review17c-{name}")
    t.start()
    return t


# ---------------------------------------------------------------------------------------------
# Finding 1: a refused write stays charged to the write controller
# ---------------------------------------------------------------------------------------------
# Fixed in session 17; was a strict xfail: finding 1: a write refused at its timeout leaves its
# bytes charged to the write controller; later writes wait for them
def test_a_refused_write_leaves_no_debt_for_the_writes_after_it(tmp_path):
    with DB.open(tmp_path / "db", **SLOWED) as db:
        db._compaction_lock.acquire()
        try:
            _two_tables_in_l0(db)
            for _ in range(3):  # a client retrying its refused write
                with pytest.raises(WriteStalledError, match="writes are held to"):
                    db.put(b"big", b"x" * 100_000, timeout=1.0)  # owes ~10 s at 10 kB/s
            assert db.get(b"big") is None
            # Nothing was written: a 2-byte write owes ~0.2 ms of the rate (at least the 1 ms
            # refill interval), not the 30 s the three refused writes were charged.
            db.put(b"small", b"y", timeout=5.0)
            assert db.get(b"small") == b"y"
        finally:
            db._compaction_lock.release()


# ---------------------------------------------------------------------------------------------
# Finding 2: an infinite (or huge) timeout leaves a ghost writer in the queue
# ---------------------------------------------------------------------------------------------
def _drop_ghosts(db, key: bytes) -> None:
    """Test hygiene only: remove an untaken Writer of ``key`` whose thread is gone, so that
    close() can finish."""
    with db._mu:
        q = db._gc.queue
        for w in list(q):
            if not w.taken and not w.done and any(op[1] == key for op in w.ops):
                q.remove(w)
        db._gc._cv.notify_all()


# Fixed in session 17; was a strict xfail: finding 2: timeout=inf/1e10 passes the check, then
# Condition.wait raises OverflowError and the queued Writer is orphaned
@pytest.mark.parametrize("timeout", [float("inf"), 1e10])
def test_an_unbounded_timeout_is_refused_or_means_no_bound(tmp_path, timeout):
    """A timeout of inf (or over threading.TIMEOUT_MAX) must either be refused up front
    (InvalidArgumentError, nothing queued) or wait as None does; the queue must move on."""
    with _stopped(tmp_path / "db") as (db, _written, release):
        out: dict = {}
        leader = _run(lambda: db.put(b"leader", VALUE), out, "leader")  # waits at the stop
        big = None
        try:
            assert poll_until(lambda: db._gc.pending() >= 1, 10.0)
            big = _run(lambda: db.put(b"inf", VALUE, timeout=timeout), out, "inf")
            assert poll_until(lambda: db._gc.pending() >= 2 or "inf" in out, 10.0)
            release()
            leader.join(30)
            big.join(30)
            assert out.get("leader") == "ok"
            result = out.get("inf")
            assert result == "ok" or isinstance(result, InvalidArgumentError), repr(result)
            db.put(b"after", VALUE, timeout=10)  # the queue still moves
            assert db.get(b"after") == VALUE
        finally:
            release()
            leader.join(30)
            if big is not None:
                big.join(30)
            _drop_ghosts(db, b"inf")


# ---------------------------------------------------------------------------------------------
# Finding 3: the full-disk retry wait ignores the timeout
# ---------------------------------------------------------------------------------------------
# Fixed in session 17; was a strict xfail: finding 3: in the full-disk failed state a timed
# write waits for the flush retry up to RETRY_WAIT_S (5 s), ignoring its timeout
def test_a_timed_write_does_not_wait_past_its_timeout_for_a_full_disk_retry(tmp_path):
    fs = ReviewFS(seed=17)
    db = DB.open(str(tmp_path / "db"), fs=fs, disable_auto_compactions=True)
    gate = threading.Event()
    try:
        for i in range(50):
            db.put(b"k%03d" % i, b"v")
        fs.append_fault = lambda p: p.endswith(".sst")  # tables cannot be written
        with pytest.raises(StorageIOError) as full:
            db.flush()
        assert full.value.errno == errno.ENOSPC
        # The next flush retry blocks where it creates its table (a slow retry).
        fs.gate = (lambda p: p.endswith(".sst"), gate)
        t0 = time.monotonic()
        with pytest.raises((StorageIOError, WriteStalledError)):
            db.put(b"late", b"1", timeout=0.2)
        waited = time.monotonic() - t0
        assert waited < 2.5, f"a write with a 0.2 s timeout waited {waited:.1f} s"
    finally:
        fs.append_fault = None
        fs.gate = None
        gate.set()
        db.close()


# ---------------------------------------------------------------------------------------------
# Finding 4: refused behind a leader that is not held
# ---------------------------------------------------------------------------------------------
# Fixed in session 17; was a strict xfail: finding 4: a timed write queued behind a slow (not
# held) leader is refused as a write stall, against DB.put's docstring
def test_a_write_queued_behind_slow_io_is_not_refused_as_a_stall(tmp_path):
    """No stall: L0 empty, memtable near empty. A synced leader's fsync is slow (blocked); a
    write with a 0.2 s timeout behind it finds room once the fsync ends. Per DB.put's docstring
    it is applied; if it is refused instead, the message must not claim the DB holds writes."""
    fs = ReviewFS(seed=18)
    db = DB.open(str(tmp_path / "db"), fs=fs, disable_auto_compactions=True)
    armed, entered, gate = threading.Event(), threading.Event(), threading.Event()

    def slow_log_sync(path: str) -> bool:
        if path.endswith(".log") and armed.is_set():
            entered.set()
            gate.wait(60)
        return False  # never a fault: only slow

    fs.sync_fault = slow_log_sync
    out: dict = {}
    leader = follower = None
    try:
        armed.set()
        leader = _run(lambda: db.put(b"synced", b"1", sync=True), out, "leader")
        assert entered.wait(30)
        follower = _run(lambda: db.put(b"queued", b"2", timeout=0.2), out, "follower")
        follower.join(5)  # refused at 0.2 s, or still waiting behind the fsync
        gate.set()
        leader.join(30)
        follower.join(30)
        assert out["leader"] == "ok"
        result = out["follower"]
        if isinstance(result, WriteStalledError):
            assert "holds writes" not in str(result), str(result)
            # (session 17's choice: refused, naming the queue, and counted as a timeout)
            assert "in the write queue" in str(result), str(result)
        else:
            assert result == "ok" and db.get(b"queued") == b"2"
    finally:
        armed.clear()
        gate.set()
        for t in (leader, follower):
            if t is not None:
                t.join(30)
        fs.sync_fault = None
        db.close()


# ---------------------------------------------------------------------------------------------
# What holds
# ---------------------------------------------------------------------------------------------
def test_a_leader_that_gives_up_hands_the_queue_to_the_next_writer(tmp_path):
    """Queue: a leader with a timeout (held at the stop), a follower without one, a follower
    with a long one. The leader fails alone, unapplied; the next writer leads and waits; once L0
    comes down both followers are applied, in queue order."""
    path = tmp_path / "db"
    with _stopped(path) as (db, _written, release):
        out: dict = {}
        threads = [_run(lambda: db.put(b"k", b"leader", timeout=2.0), out, "leader")]
        try:
            assert poll_until(lambda: db._gc.pending() >= 1, 10.0)
            threads.append(_run(lambda: db.put(b"k", b"f1"), out, "f1"))
            assert poll_until(lambda: db._gc.pending() >= 2, 10.0)
            threads.append(_run(lambda: db.put(b"k", b"f2", timeout=60), out, "f2"))
            threads[0].join(30)
            assert isinstance(out["leader"], WriteStalledError)
            assert "f1" not in out and "f2" not in out  # still held, not lost
            assert db._gc.pending() == 2
            release()
            for t in threads:
                t.join(30)
            assert out["f1"] == "ok" and out["f2"] == "ok"
            assert db.get(b"k") == b"f2"
        finally:
            release()
            for t in threads:
                t.join(30)
    with DB.open(path) as db:
        assert db.get(b"k") == b"f2"


def test_a_timed_write_behind_a_held_flush_withdraws_and_the_flush_completes(tmp_path):
    with _stopped(tmp_path / "db") as (db, _written, release):
        out: dict = {}
        flusher = _run(db.flush, out, "flush")  # a solo writer, held at the stop
        try:
            assert poll_until(lambda: db._gc.pending() >= 1, 10.0)
            with pytest.raises(WriteStalledError, match="write not applied"):
                db.put(b"behind", VALUE, timeout=0.3)
            assert "flush" not in out
            release()
            flusher.join(60)
            assert out["flush"] == "ok"
            assert db.get(b"behind") is None
            db.put(b"after", VALUE, timeout=30)
        finally:
            release()
            flusher.join(60)


def test_close_ends_stalled_writers_with_and_without_timeouts(tmp_path):
    path = tmp_path / "db"
    keys = [b"w-none", b"w-long", b"w-short"]
    timeouts = [None, 60, 0.5]
    with _stopped(path) as (db, written, release):
        out: dict = {}
        threads = []
        closer = None
        try:
            for i, (key, timeout) in enumerate(zip(keys, timeouts)):
                threads.append(_run(lambda k=key, t=timeout: db.put(k, VALUE, timeout=t),
                                    out, key.decode()))
                assert poll_until(lambda n=i + 1: db._gc.pending() >= n, 10.0)
            closer = _run(db.close, out, "close")  # L0 still held: nothing can be applied
            for t in threads:
                t.join(30)
            for key in keys:
                assert isinstance(out[key.decode()], (ClosedError, WriteStalledError)), out
            assert isinstance(out["w-none"], ClosedError)
            release()  # the compaction thread, waiting for the lock, sees the close
            closer.join(60)
            assert out["close"] == "ok"
        finally:
            release()
            for t in threads:
                t.join(30)
            if closer is not None:
                closer.join(60)
    with DB.open(path) as db:
        assert all(db.get(k) is None for k in keys)
        assert all(db.get(k) == VALUE for k in written)


def test_stress_refused_writes_are_never_applied_and_later_writes_win(tmp_path):
    """Seeded: 4 threads each write their own key with rising versions, mixed timeouts (None,
    0, short, long), sync or not; one also calls flush() (a solo writer). The stall is switched
    on and off by holding the compaction lock. Each key ends at the last version acknowledged
    to its thread: a refused write applied (or lost ack) would show."""
    path = tmp_path / "db"
    opts = dict(memtable_bytes=16 * 1024, l0_compaction_trigger=2, l0_slowdown_trigger=2,
                l0_stop_trigger=3, delayed_write_rate=400_000, table_workers=0)
    db = DB.open(path, **opts)
    stop = threading.Event()
    acked: dict[bytes, int] = {}
    refused = [0]
    errors: list = []

    def writer(n: int) -> None:
        rng = random.Random(1700 + n)
        key = b"key%d" % n
        version = 0
        while not stop.is_set() and version < 400:
            version += 1
            timeout = rng.choice([None, 0, 0.005, 0.05, 0.3])
            value = b"%08d" % version + b"v" * rng.choice([10, 300, 1500])
            try:
                if n == 3 and version % 50 == 0:
                    db.flush()
                db.put(key, value, sync=rng.random() < 0.3, timeout=timeout)
            except WriteStalledError:
                refused[0] += 1
                continue
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
                return
            acked[key] = version

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    held = False
    try:
        for t in threads:
            t.start()
        rng = random.Random(17)
        for _ in range(12):
            db._compaction_lock.acquire()
            held = True
            time.sleep(rng.uniform(0.05, 0.3))
            db._compaction_lock.release()
            held = False
            time.sleep(rng.uniform(0.02, 0.1))
        stop.set()
        for t in threads:
            t.join(60)
        assert not errors, errors
        for key, version in acked.items():
            assert db.get(key)[:8] == b"%08d" % version
    finally:
        stop.set()
        if held:
            db._compaction_lock.release()
        for t in threads:
            t.join(60)
        db.close()
    with DB.open(path) as db:
        for key, version in acked.items():
            assert db.get(key)[:8] == b"%08d" % version


class _Context:
    """A stand-in for grpc.ServicerContext's time_remaining (not one of our components)."""

    def __init__(self, remaining):
        self.remaining = remaining

    def time_remaining(self):
        return self.remaining


@pytest.mark.parametrize("remaining,expected", [
    (None, None), (9.2e18, None), (10.0, 9.75), (1.0, 0.9), (0.1, 0.09), (0.0, 0.0)])
def test_the_shard_write_timeout_is_the_deadline_less_its_margin(remaining, expected):
    got = write_timeout(_Context(remaining))
    assert got == pytest.approx(expected) if expected is not None else got is None


def test_a_stalled_shard_in_a_router_write_reports_not_applied_and_the_cli_exits_busy(tmp_path):
    """A router over two in-process shards, one stalled: a Write touching both applies the
    healthy shard's part and reports the stalled one applied=False with RESOURCE_EXHAUSTED
    ("write not applied"); a Put to the stalled shard maps to the CLI's exit 7."""
    code, _ = status_of(WriteStalledError("write not applied: x"))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    with _stopped(tmp_path / "s0") as (db0, _w, release), \
            DB.open(tmp_path / "s1", table_workers=0) as db1:
        servers = []
        client = None
        try:
            addrs = []
            for name, db in (("s0", db0), ("s1", db1)):
                serving, port = create_server(db, "127.0.0.1:0", name=name)
                serving.start()
                servers.append(serving)
                addrs.append((name, f"127.0.0.1:{port}"))
            cmap = ClusterMap.even(addrs)
            router, rport = create_router_server(cmap, "127.0.0.1:0")
            router.start()
            servers.append(router)
            client = Client(f"127.0.0.1:{rport}", timeout=2.0, retries=0)
            k0 = next(b"a%d" % i for i in range(10_000) if cmap.shard_index(b"a%d" % i) == 0)
            k1 = next(b"b%d" % i for i in range(10_000) if cmap.shard_index(b"b%d" % i) == 1)
            with pytest.raises(PartialWriteError) as info:
                client.write([(k0, VALUE), (k1, VALUE)])
            assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            by = {r.shard: r for r in info.value.results}
            assert by["s0"].applied is False and "write not applied" in by["s0"].message
            assert by["s0"].code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert by["s1"].applied is True
            assert db0.get(k0) is None and db1.get(k1) == VALUE
            with pytest.raises(ClientError) as put:
                client.put(k0, VALUE)
            err = from_client_error(put.value, "put")
            assert err.code == BUSY and "write not applied" in str(err)
            release()
            client.put(k0, VALUE, timeout=30)
            assert db0.get(k0) == VALUE
        finally:
            release()
            if client is not None:
                client.close()
            for s in servers:
                s.server.stop(0)
