"""A chaos check of the whole cluster (issues 3 and 4): no acknowledged write is lost, and no
value appears that was never written, while shard and router processes die.

A small Jepsen-style test, with real parts only: ``sievekv cluster start`` (a supervisor, 3
shards with ``sync = true`` and 128 KiB memtables, so flushes and compactions run during the
test, and one router, all on 127.0.0.1 ports chosen at start) in a temporary directory.

- **Clients**: WRITERS threads, each with its own :class:`router.client.Client` to the router
  and its own keys, issue Puts of unique keys (``u/T/N``), Puts and Deletes of a few keys with
  increasing versions (``o/T/J``), and multi-key Writes that span shards (``b/T/N/K``). Every
  attempt is recorded *before* it is sent, and then its outcome: ``ok`` (acknowledged),
  ``failed`` (the router says it sent nothing: a hung shard's slots, or a call-slot wait that
  passed the deadline) or ``unknown`` (any other error: it may or may not have applied). A
  cross-shard Write records the outcome per shard from its per-shard report. Writers also read
  their own keys back (read-your-writes), and one thread scans other threads' keys.
- **Nemesis** (seeded, in the main thread): SIGKILLs shards (one, two at once, one again while
  it recovers), SIGKILLs the router, SIGSTOPs a shard for a few seconds, and once runs
  ``cluster restart --shard N``; after each fault it waits for the supervisor to bring the
  process back to SERVING, then for the clients' writes to reach every shard again.
- **Checks**, when everything is healthy again, through the router, and again after
  ``cluster stop`` / ``cluster start`` on the same data directory: every acknowledged write is
  there with its value (an overwritten key holds its last acknowledged version or a later one
  that was acknowledged or unknown: versions never go backwards); nothing else is there (a value
  that was never written, or a write the router said it never sent); each shard's part of a
  Write is all there or all absent (atomic per shard), and all there where the per-shard report
  said "applied"; a scan of everything is in key order without duplicates and equals the point
  reads; range scans with limits are slices of it; and the restarted cluster holds exactly what
  the stopped one did.

What is asserted does not depend on timing: the randomness is seeded (``SIEVEKV_CHAOS_SEED``
overrides it), and how many operations run between faults only changes how much is checked.
Every process is stopped by a finalizer registered before the cluster starts (``cluster stop``,
then SIGKILL of every recorded pid and of the supervisor's process group; a SIGSTOPped shard is
sent SIGCONT first), even when the test fails.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import textwrap
import threading
import time
from dataclasses import dataclass, field

import grpc
import pytest

from router import cluster_state as cs
from router import health_probe
from router.client import Client
from router.client_errors import ClientError, PartialWriteError
from router.slots import SLOT_COUNT, slot_of

from sievekv_proto import sievekv_pb2 as pb
from sievekv_proto import sievekv_pb2_grpc as pbg

from .conftest import (sigstop, start_router_process, start_shard_process, wait_until,
                       write_cluster_map)
from .test_cli_e2e import cli_env_cleared  # noqa: F401 (a fixture, used by pytestmark)
from .test_review_lifecycle import Lab

pytestmark = pytest.mark.usefixtures("cli_env_cleared")

SEED = int(os.environ.get("SIEVEKV_CHAOS_SEED", "20240605"))
SHARDS = 3
SHARD_NAMES = {f"shard-{i}" for i in range(SHARDS)}  # as `cluster start` names them
WRITERS = 4
OVERWRITE_KEYS = 6  # o/T/J keys per writer, overwritten with increasing versions
CALL_TIMEOUT = 10.0  # seconds per write or read during the run
SHORT_TIMEOUT = 1.0  # a quarter of the writes: their deadline passes while a shard is stopped

OK, UNKNOWN, FAILED, PENDING = "ok", "unknown", "failed", "pending"

CONFIG = textwrap.dedent("""
    [cluster]
    data_dir = "data"
    [router]
    listen = "127.0.0.1:0"
    [shards]
    count = %d
    base_port = 0
    [engine]
    sync = true
    memtable_bytes = "128KiB"
    table_workers = 1
    l0_compaction_trigger = 2
    target_file_size = "64KiB"
    max_bytes_for_level_base = "256KiB"
    [supervisor]
    start_timeout = 60.0
    stop_timeout = 20.0
    restart_delay = 0.2
    restart_delay_max = 1.0
    max_restarts = 1000
    restart_window = 60.0
""") % SHARDS

# What the router says when it sent a call to no shard (router/shards.py, kv_servicer.py).
NOT_SENT = ("gets no more for now", "write not sent to any shard",
            "while waiting for one of its")
# Codes a client may see while processes die; anything else is a finding.
EXPECTED_CODES = {"UNAVAILABLE", "DEADLINE_EXCEEDED"}


def classify(details: str) -> str:
    return FAILED if any(s in details for s in NOT_SENT) else UNKNOWN


# ---------------------------------------------------------------------------------------------
# History
# ---------------------------------------------------------------------------------------------

@dataclass
class Attempt:
    """One Put (value) or Delete (value None) of a key; ``version`` counts from 1 per key."""

    version: int
    value: bytes | None
    outcome: str = PENDING
    sent: float = 0.0  # seconds since the run began
    done: float = 0.0
    error: str = ""


@dataclass
class Batch:
    """One multi-key Write: its mutations grouped by shard name, and each part's outcome."""

    ident: str
    parts: dict[str, list[tuple[bytes, bytes]]]
    outcome: dict[str, str] = field(default_factory=dict)
    sent: float = 0.0
    done: float = 0.0
    error: str = ""


class History:
    """What every client attempted and how each attempt ended. Thread-safe."""

    def __init__(self):
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.puts: dict[bytes, list[Attempt]] = {}  # one writer per key: versions in order
        self.batches: list[Batch] = []
        self.acked_unique: dict[int, list[bytes]] = collections.defaultdict(list)
        self.codes: collections.Counter = collections.Counter()
        self.violations: list[str] = []
        self.events: list[str] = []  # the nemesis's log
        self.unexpected: list[str] = []  # calls that failed with a code not in EXPECTED_CODES
        self.counts: collections.Counter = collections.Counter()

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    def event(self, text: str) -> None:
        with self.lock:
            self.events.append(f"{self.now():8.3f} {text}")

    def violation(self, text: str) -> None:
        with self.lock:
            self.violations.append(f"{self.now():8.3f} {text}")

    def loaded_since(self, since: float, scans: int) -> bool:
        """True once every shard has acknowledged a part of a Write sent at or after ``since``
        (History.now() seconds) and the scanner has finished a scan beyond its first ``scans``:
        the clients' load reached the whole cluster."""
        with self.lock:
            batches = list(self.batches)
        acked = {s for b in batches if b.sent >= since for s, o in b.outcome.items() if o == OK}
        return acked >= SHARD_NAMES and self.counts["scan ok"] > scans

    def error(self, op: str, exc: ClientError) -> None:
        with self.lock:
            self.codes[exc.code.name] += 1
            if exc.code.name not in EXPECTED_CODES:
                self.unexpected.append(f"{self.now():8.3f} {op}: {exc.code.name}: {exc.details}")


def allowed_values(attempts: list[Attempt]) -> set:
    """The values a key may hold now: its last acknowledged version or a later one that was
    acknowledged or may have applied (None: absent), or absent while nothing was
    acknowledged. A version older than an acknowledged one is not allowed (going back)."""
    acked = max((a.version for a in attempts if a.outcome == OK), default=0)
    allowed = {a.value for a in attempts if a.version >= acked and a.outcome != FAILED}
    if acked == 0:
        allowed.add(None)
    return allowed


def describe(key: bytes, attempts: list[Attempt]) -> str:
    """The key's last six attempts: version, value's head, outcome, [sent..done] seconds."""
    return f"{key!r}: " + ("... " if len(attempts) > 6 else "") + "; ".join(
        f"v{a.version} {'delete' if a.value is None else a.value[:24]!r} {a.outcome} "
        f"[{a.sent:.3f}..{a.done:.3f}]{' ' + a.error[:100] if a.error else ''}"
        for a in attempts[-6:])


def show(value) -> str:
    return "absent" if value is None else repr(value[:24])


# ---------------------------------------------------------------------------------------------
# Clients
# ---------------------------------------------------------------------------------------------

def make_value(rng: random.Random, tag: bytes) -> bytes:
    """``tag`` (names key and version) plus 64..1500 random bytes: every value is distinct."""
    return tag + b"|" + rng.randbytes(rng.randint(64, 1500))


class Writer(threading.Thread):
    def __init__(self, t: int, address: str, hist: History, shard_of, stop: threading.Event):
        super().__init__(name=f"chaos-writer-{t}", daemon=True)
        self.t = t
        self.client = Client(address, timeout=CALL_TIMEOUT)
        self.hist = hist
        self.shard_of = shard_of
        self.stop_event = stop
        self.rng = random.Random(f"{SEED}/writer/{t}")
        self.unique = 0
        self.batch_n = 0
        self.versions = [0] * OVERWRITE_KEYS
        self.crash: BaseException | None = None

    def run(self):
        try:
            while not self.stop_event.is_set():
                r = self.rng.random()
                if r < 0.40:
                    self.put_unique()
                elif r < 0.70:
                    self.overwrite()
                elif r < 0.90:
                    self.batch()
                else:
                    self.read_back()
        except BaseException as exc:  # reported by the test
            self.crash = exc
        finally:
            self.client.close()

    def timeout(self) -> float:
        return SHORT_TIMEOUT if self.rng.random() < 0.25 else CALL_TIMEOUT

    def _failed(self, op: str, exc: ClientError) -> None:
        self.hist.error(op, exc)
        time.sleep(0.02)  # a dead process fails calls at once: do not spin

    def _put(self, key: bytes, value: bytes | None) -> Attempt:
        hist = self.hist
        with hist.lock:
            attempts = hist.puts.setdefault(key, [])
            a = Attempt(len(attempts) + 1, value, sent=hist.now())
            attempts.append(a)  # recorded before it is sent
        try:
            if value is None:
                self.client.delete(key, timeout=self.timeout())
            else:
                self.client.put(key, value, timeout=self.timeout())
            a.outcome = OK
        except ClientError as exc:
            a.outcome, a.error = classify(exc.details), f"{exc.code.name}: {exc.details}"
            self._failed(f"{'delete' if value is None else 'put'} {key!r}", exc)
        a.done = hist.now()
        hist.counts[f"put {a.outcome}"] += 1
        return a

    def put_unique(self):
        self.unique += 1
        key = b"u/%d/%06d" % (self.t, self.unique)
        a = self._put(key, make_value(self.rng, key))
        if a.outcome == OK:
            with self.hist.lock:
                self.hist.acked_unique[self.t].append(key)

    def overwrite(self):
        j = self.rng.randrange(OVERWRITE_KEYS)
        key = b"o/%d/%d" % (self.t, j)
        self.versions[j] += 1
        delete = self.rng.random() < 0.15
        self._put(key, None if delete else make_value(self.rng, b"%s#%d" % (key, self.versions[j])))
        if self.rng.random() < 0.3:
            self.check_read(key)

    def batch(self):
        self.batch_n += 1
        ident = "%d/%d" % (self.t, self.batch_n)
        muts = []
        for k in range(self.rng.randint(3, 8)):
            key = b"b/%s/%d" % (ident.encode(), k)
            muts.append((key, make_value(self.rng, key)))
        parts: dict[str, list] = {}
        for key, value in muts:
            parts.setdefault(self.shard_of(key), []).append((key, value))
        b = Batch(ident, parts, {s: PENDING for s in parts}, sent=self.hist.now())
        with self.hist.lock:
            self.hist.batches.append(b)
        try:
            results = self.client.write(muts, timeout=self.timeout())
            got = {r.shard: OK if r.applied else UNKNOWN for r in results}
        except PartialWriteError as exc:
            self._failed(f"write {ident}", exc)
            b.error = f"{exc.code.name}: {exc.details}"
            got = {r.shard: OK if r.applied else classify(r.message) for r in exc.results}
        except ClientError as exc:
            self._failed(f"write {ident}", exc)
            b.error = f"{exc.code.name}: {exc.details}"
            got = {s: classify(exc.details) for s in parts}
        if set(got) != set(parts):
            self.hist.violation(f"batch {ident}: per-shard report names {sorted(got)}, its keys "
                                f"are on {sorted(parts)}")
        b.outcome = {s: got.get(s, UNKNOWN) for s in parts}
        b.done = self.hist.now()
        self.hist.counts["batch " + ",".join(sorted(set(b.outcome.values())))] += 1

    def check_read(self, key: bytes):
        """Read ``key`` back: it holds its last acknowledged version or a later one."""
        hist = self.hist
        with hist.lock:
            attempts = list(hist.puts.get(key, ()))
        sent = hist.now()
        try:
            value = self.client.get(key, timeout=CALL_TIMEOUT)
        except ClientError as exc:
            self._failed(f"get {key!r}", exc)
            return
        hist.counts["read ok"] += 1
        if value not in allowed_values(attempts):
            hist.violation(f"read-your-writes: get {key!r} at {sent:.3f} returned "
                           f"{show(value)}; history {describe(key, attempts)}")

    def read_back(self):
        if self.rng.random() < 0.5:
            self.check_read(b"o/%d/%d" % (self.t, self.rng.randrange(OVERWRITE_KEYS)))
            return
        with self.hist.lock:
            acked = list(self.hist.acked_unique[self.t])
        if acked:
            self.check_read(self.rng.choice(acked))


class Scanner(threading.Thread):
    """Scans the unique keys of a random writer: key order, no duplicates, only values that
    were written, and every key acknowledged before the scan began (within the range read)."""

    def __init__(self, address: str, hist: History, stop: threading.Event):
        super().__init__(name="chaos-scanner", daemon=True)
        self.client = Client(address, timeout=CALL_TIMEOUT)
        self.hist = hist
        self.stop_event = stop
        self.rng = random.Random(f"{SEED}/scanner")
        self.crash: BaseException | None = None

    def run(self):
        try:
            while not self.stop_event.is_set():
                self.scan_once()
                time.sleep(0.05)
        except BaseException as exc:
            self.crash = exc
        finally:
            self.client.close()

    def scan_once(self):
        hist, rng = self.hist, self.rng
        t = rng.randrange(WRITERS)
        start, end = b"u/%d/" % t, b"u/%d0" % t  # "0" follows "/"
        limit = rng.choice([0, 0, rng.randint(1, 300)])
        with hist.lock:
            acked = set(hist.acked_unique[t])
        sent = hist.now()
        try:
            got = list(self.client.scan(start, end, limit or None, timeout=30.0))
        except ClientError as exc:
            hist.error(f"scan [{start!r}, {end!r}) limit {limit}", exc)
            time.sleep(0.05)
            return
        hist.counts["scan ok"] += 1
        keys = [k for k, _ in got]
        where = f"scan [{start!r}, {end!r}) limit {limit} at {sent:.3f}"
        if any(a >= b for a, b in zip(keys, keys[1:])):
            bad = next(i for i in range(len(keys) - 1) if keys[i] >= keys[i + 1])
            hist.violation(f"{where}: out of order or duplicated at {keys[bad]!r}, "
                           f"{keys[bad + 1]!r}")
        if limit and len(keys) > limit:
            hist.violation(f"{where}: {len(keys)} entries, over the limit")
        with hist.lock:
            histories = {k: list(hist.puts.get(k, ())) for k in keys}
        for k, v in got:
            if not start <= k < end:
                hist.violation(f"{where}: key {k!r} outside the range")
            elif v not in {a.value for a in histories[k] if a.outcome != FAILED}:
                hist.violation(f"{where}: {k!r} = {show(v)}, never written (or not sent); "
                               f"history {describe(k, histories[k])}")
        last = keys[-1] if keys and limit and len(keys) == limit else None
        missing = sorted(k for k in acked if last is None or k <= last)
        missing = [k for k in missing if k not in set(keys)]
        if missing:
            hist.violation(f"{where}: {len(missing)} key(s) acknowledged before the scan are "
                           f"missing, first {missing[0]!r}")


# ---------------------------------------------------------------------------------------------
# Cluster
# ---------------------------------------------------------------------------------------------

class Cluster(Lab):
    """The cluster under test (tests/test_review_lifecycle.py's Lab: config, data directory,
    the CLI, cleanup), plus the processes this test SIGSTOPped, resumed before cleanup."""

    def __init__(self, root, request):
        super().__init__(root, request, CONFIG)
        self.stopped: set[int] = set()  # pids we sent SIGSTOP and not yet SIGCONT

    def cli(self, *argv, timeout=180):
        return super().cli(*argv, timeout=timeout)

    def start(self) -> str:
        return super().start().stdout.strip()

    def stop(self) -> None:
        r = self.cli("cluster", "stop")
        assert r.returncode == 0, r.stderr
        assert "exit code 0" in r.stdout, r.stdout  # drained, not killed

    def cleanup(self) -> None:
        for pid in self.stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        super().cleanup()

    def healthy(self) -> bool:
        """Every process is recorded SERVING, runs, and answers SERVING on its health service."""
        try:
            doc = self.state()
        except cs.StateError:
            return False
        return doc["state"] == "running" and all(
            p["status"] == cs.ProcStatus.SERVING and cs.pid_alive(p["pid"], p["create_time"])
            and health_probe.probe(p["address"], 2.0) == health_probe.SERVING
            for p in doc["processes"])


class Nemesis:
    """Seeded faults, one after another, each waited out until the cluster is whole again."""

    ACTIONS = ["kill_shard", "stop_shard", "kill_router", "kill_two_shards", "restart_shard",
               "kill_while_recovering", "kill_shard_and_router", "stop_shard", "kill_router",
               "kill_shard"]

    def __init__(self, cluster: Cluster, hist: History):
        self.cluster = cluster
        self.hist = hist
        self.rng = random.Random(f"{SEED}/nemesis")

    def run(self) -> None:
        actions = list(self.ACTIONS)
        self.rng.shuffle(actions)
        after = "the start"
        for action in actions:
            self.wait_for_load(f"after {after}")  # load between faults
            getattr(self, action)()
            wait_until(self.cluster.healthy, f"the cluster to be whole after {action}", 120, 0.1)
            self.hist.event(f"healthy after {action}")
            after = action

    def wait_for_load(self, when: str) -> None:
        """Wait until the clients' calls reach every shard again (History.loaded_since)."""
        since, scans = self.hist.now(), self.hist.counts["scan ok"]
        wait_until(lambda: self.hist.loaded_since(since, scans),
                   f"writes acknowledged by every shard and a scan {when}", 120)
        self.hist.event(f"load on every shard {when}")

    def _shard(self) -> str:
        return f"shard-{self.rng.randrange(SHARDS)}"

    def _kill(self, name: str) -> dict:
        p = self.cluster.proc(name)
        assert cs.pid_alive(p["pid"], p["create_time"]), p
        os.kill(p["pid"], signal.SIGKILL)
        self.hist.event(f"SIGKILL {name} pid {p['pid']}")
        return p

    def _respawned(self, name: str, old_pid: int) -> dict:
        return wait_until(lambda: (lambda p: p if p["pid"] not in (None, old_pid) else None)(
            self.cluster.proc(name)), f"the supervisor to respawn {name}", 60, 0.02)

    def kill_shard(self):
        self._kill(self._shard())

    def kill_router(self):
        self._kill("router")

    def kill_shard_and_router(self):
        self._kill(self._shard())
        self._kill("router")

    def kill_two_shards(self):
        names = self.rng.sample([f"shard-{i}" for i in range(SHARDS)], 2)
        for name in names:
            self._kill(name)

    def kill_while_recovering(self):
        """SIGKILL a shard, then its successor as soon as it is spawned (opening the engine,
        replaying the log)."""
        name = self._shard()
        old = self._kill(name)
        new = self._respawned(name, old["pid"])
        time.sleep(self.rng.uniform(0.0, 0.5))
        try:
            os.kill(new["pid"], signal.SIGKILL)
            self.hist.event(f"SIGKILL {name} pid {new['pid']} (recovering)")
        except ProcessLookupError:
            pass

    def stop_shard(self):
        name = self._shard()
        p = self.cluster.proc(name)
        sigstop(p["pid"])
        self.cluster.stopped.add(p["pid"])
        self.hist.event(f"SIGSTOP {name} pid {p['pid']}")
        try:
            # A sleep: how long the shard stays stopped is the fault itself (longer than
            # SHORT_TIMEOUT, so such calls pass their deadline); any outcome is allowed.
            time.sleep(self.rng.uniform(2.0, 4.0))
        finally:
            os.kill(p["pid"], signal.SIGCONT)
            self.cluster.stopped.discard(p["pid"])
            self.hist.event(f"SIGCONT {name} pid {p['pid']}")

    def restart_shard(self):
        n = self.rng.randrange(SHARDS)
        self.hist.event(f"cluster restart --shard {n}")
        r = self.cluster.cli("cluster", "restart", "--shard", str(n))
        assert r.returncode == 0, r.stderr
        self.hist.event(f"cluster restart --shard {n} done")


# ---------------------------------------------------------------------------------------------
# The final check
# ---------------------------------------------------------------------------------------------

def check_everything(client: Client, hist: History, what: str) -> list[tuple[bytes, bytes]]:
    """Read every key ever attempted and scan the whole cluster; return the scan. Violations
    go to ``hist.violations``, prefixed with ``what``."""
    bad = lambda text: hist.violation(f"{what}: {text}")  # noqa: E731
    batch_keys = {k: (b, shard) for b in hist.batches for shard, muts in b.parts.items()
                  for k, _ in muts}
    keys = sorted(set(hist.puts) | set(batch_keys))
    values = dict(zip(keys, client.multi_get(keys, timeout=120)))
    for key, attempts in hist.puts.items():  # how unknown outcomes turned out (the report)
        if attempts[-1].outcome == UNKNOWN and attempts[-1].value is not None:
            applied = values[key] == attempts[-1].value
            hist.counts[f"{what}: last put unknown, {'applied' if applied else 'not seen'}"] += 1

    for key, attempts in hist.puts.items():
        if values[key] not in allowed_values(attempts):
            bad(f"{key!r} holds {show(values[key])}; history {describe(key, attempts)}")

    for b in hist.batches:
        for shard, muts in b.parts.items():
            present = [values[k] == v for k, v in muts]
            absent = [values[k] is None for k, _ in muts]
            wrong = [k for k, v in muts if values[k] is not None and values[k] != v]
            outcome = b.outcome[shard]
            where = (f"Write {b.ident} [{b.sent:.3f}..{b.done:.3f}] part on {shard} "
                     f"({len(muts)} keys, {outcome}{', ' + b.error[:120] if b.error else ''})")
            if wrong:
                bad(f"{where}: {wrong[0]!r} holds a value that Write never had")
            elif outcome == OK and not all(present):
                lost = [k for (k, _), p in zip(muts, present) if not p]
                bad(f"{where}: applied, but {len(lost)} key(s) are absent, first {lost[0]!r}")
            elif outcome == FAILED and not all(absent):
                bad(f"{where}: never sent, but {sum(present)} key(s) are present")
            elif not (all(present) or all(absent)):
                bad(f"{where}: not atomic: {sum(present)} of {len(muts)} keys present")

    scan = list(client.scan(timeout=120))
    skeys = [k for k, _ in scan]
    dup = [a for a, b in zip(skeys, skeys[1:]) if a >= b]
    if dup:
        bad(f"full scan out of order or duplicated at {dup[0]!r}")
    found = {k: v for k, v in values.items() if v is not None}
    scanned = dict(scan)
    if scanned != found:
        extra = sorted(set(scanned) - set(found))
        missing = sorted(set(found) - set(scanned))
        differ = sorted(k for k in set(scanned) & set(found) if scanned[k] != found[k])
        bad(f"full scan disagrees with point reads: {len(extra)} key(s) only in the scan "
            f"(first {extra[:1]!r}), {len(missing)} only in point reads (first {missing[:1]!r}),"
            f" {len(differ)} with other values (first {differ[:1]!r})")

    rng = random.Random(f"{SEED}/ranges/{what}")
    for _ in range(8):
        lo, hi = sorted(rng.sample(keys, 2)) if len(keys) >= 2 else (b"a", b"z")
        limit = rng.choice([0, rng.randint(1, 500)])
        got = list(client.scan(lo, hi, limit or None, timeout=60))
        want = [(k, v) for k, v in scan if lo <= k < hi]
        want = want[:limit] if limit else want
        if got != want:
            bad(f"scan [{lo!r}, {hi!r}) limit {limit}: {len(got)} entries, the full scan has "
                f"{len(want)} there")
    return scan


def shard_table(client: Client):
    """key -> shard name, from the router's ClusterInfo (the cluster map it serves)."""
    table = [None] * SLOT_COUNT
    for s in client.cluster_info(timeout=60)["shards"]:
        for first, last in s["slots"]:
            table[first:last + 1] = [s["name"]] * (last - first + 1)
    assert None not in table
    return lambda key: table[slot_of(key)]


def check_client(address: str) -> Client:
    """A client for the checks: its reads retry long enough to outlast the router's reconnect
    backoff to a restarted shard (router/shards.py: up to 2 s, while the default client gives up
    after ~0.35 s)."""
    return Client(address, timeout=120, retries=30, max_backoff=1.0)


def router_reaches_every_shard(client: Client, shard_of) -> bool:
    """True once a MultiGet through the router touching every shard succeeds."""
    keys, seen = [], set()
    for i in range(10000):
        key = b"probe/%d" % i
        if shard_of(key) not in seen:
            seen.add(shard_of(key))
            keys.append(key)
        if len(seen) == SHARDS:
            break
    try:
        client.multi_get(keys, timeout=5)
        return True
    except ClientError:
        return False


def shape(client: Client) -> dict:
    """Tables per level of each shard, for the report (and to show flushes and compactions
    ran)."""
    stats = client.stats(timeout=60)["shards"]
    return {name: [lv["tables"] for lv in st["levels"]] for name, st in sorted(stats.items())}


def report(hist: History) -> str:
    return ("\nviolations (%d):\n  %s\nnemesis:\n  %s\nerrors: %s\n  %s\ncounts: %s" % (
        len(hist.violations), "\n  ".join(hist.violations[:25]), "\n  ".join(hist.events),
        dict(hist.codes), "\n  ".join(hist.unexpected[:10]), dict(hist.counts)))


# ---------------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------------

def test_the_checker_allows_only_the_last_acknowledged_version_or_a_later_one():
    a = lambda v, value, outcome: Attempt(v, value, outcome)  # noqa: E731
    assert allowed_values([a(1, b"x", UNKNOWN)]) == {b"x", None}
    assert allowed_values([a(1, b"x", FAILED)]) == {None}
    assert allowed_values([a(1, b"x", OK)]) == {b"x"}
    history = [a(1, b"1", OK), a(2, None, UNKNOWN), a(3, b"3", OK), a(4, b"4", UNKNOWN),
               a(5, b"5", FAILED), a(6, None, PENDING)]
    assert allowed_values(history) == {b"3", b"4", None}  # None: version 6 (a delete)
    assert allowed_values(history[:4]) == {b"3", b"4"}  # neither v1 nor v2's delete: older



def test_no_acknowledged_write_is_lost_while_processes_die(tmp_path, request):
    cluster = Cluster(tmp_path, request)
    router = cluster.start()
    hist = History()
    with Client(router, timeout=60) as admin:
        shard_of = shard_table(admin)
    stop = threading.Event()
    threads = [Writer(t, router, hist, shard_of, stop) for t in range(WRITERS)]
    threads.append(Scanner(router, hist, stop))
    for th in threads:
        th.start()
    try:
        nemesis = Nemesis(cluster, hist)
        nemesis.run()
        nemesis.wait_for_load("after the last fault")  # load on the whole cluster
    finally:
        stop.set()
        for th in threads:
            th.join(CALL_TIMEOUT * 6)  # a call has CALL_TIMEOUT; a scan 30 s
    hung = [th.name for th in threads if th.is_alive()]
    assert not hung, f"client threads still in a call long after its deadline: {hung}"
    crashed = [(th.name, th.crash) for th in threads if th.crash is not None]
    assert not crashed, crashed

    wait_until(cluster.healthy, "the cluster to be whole before the check", 120)
    acked = sum(a.outcome == OK for atts in hist.puts.values() for a in atts)
    applied = sum(o == OK for b in hist.batches for o in b.outcome.values())
    assert acked > 0 and applied > 0, report(hist)
    with check_client(router) as client:
        wait_until(lambda: router_reaches_every_shard(client, shard_of),
                   "the router to reach every shard", 60)
        levels = shape(client)
        before = check_everything(client, hist, "after the chaos")
    assert sum(map(sum, levels.values())) > 0, f"no memtable was flushed: {levels}"
    hist.event(f"tables per level: {levels}")

    cluster.stop()
    router = cluster.start()  # the same data directory; ports are chosen afresh
    with check_client(router) as client:
        wait_until(lambda: router_reaches_every_shard(client, shard_of),
                   "the router to reach every shard after the restart", 60)
        after = check_everything(client, hist, "after cluster stop and start")
    if after != before:
        hist.violation(f"the restarted cluster holds {len(after)} entries, the stopped one held "
                       f"{len(before)}; first difference at "
                       f"{next((a for a, b in zip(after, before) if a != b), None)!r}")

    unexpected = {c: n for c, n in hist.codes.items() if c not in EXPECTED_CODES}
    assert not hist.violations and not unexpected, report(hist)
    print(report(hist))


# ---------------------------------------------------------------------------------------------
# Findings
# ---------------------------------------------------------------------------------------------

def _flood_then_drain(address: str, tag: bytes, channels: int = 4, depth: int = 64):
    """Keep ``channels`` x ``depth`` Puts of unique keys in flight to ``address`` while the
    caller SIGTERMs it; returns (status name -> count, keys of the CANCELLED Puts)."""
    codes: collections.Counter = collections.Counter()
    cancelled: list[bytes] = []
    stop = threading.Event()
    lock = threading.Lock()

    def flood(c: int, stub) -> None:
        pending: collections.deque = collections.deque()
        n = 0
        while not stop.is_set() or pending:
            while not stop.is_set() and len(pending) < depth:
                n += 1
                key = b"%s/%d/%d" % (tag, c, n)
                pending.append((key, stub.Put.future(pb.PutRequest(key=key, value=b"v"),
                                                     timeout=30)))
            key, future = pending.popleft()
            try:
                future.result()
                code = "OK"
            except grpc.RpcError as exc:
                code = exc.code().name
            with lock:
                codes[code] += 1
                if code == "CANCELLED":
                    cancelled.append(key)

    chans = [grpc.insecure_channel(address) for _ in range(channels)]
    threads = [threading.Thread(target=flood, args=(c, pbg.KVStub(ch)), daemon=True)
               for c, ch in enumerate(chans)]
    return codes, cancelled, stop, threads, chans


# Found by this chaos check (a `cluster stop` with clients still writing; then this minimal
# repro): a server that drains on SIGTERM answers some calls with CANCELLED instead of the
# UNAVAILABLE that issue 4 asks for ("new calls are refused with UNAVAILABLE"). Serving.drain
# (shard/serving.py) waits until the guards count no call in flight and then calls
# server.stop(grace): the calls gRPC has received but not yet handed to a handler at that moment
# are cancelled by gRPC itself (the client sees CANCELLED, details "CANCELLED"). Seen in every
# round here: 7 to 252 CANCELLED of ~2,500 calls per drain of a router, none of them applied;
# the same for a shard drained under direct calls (through a router a shard's CANCELLED is
# translated to UNAVAILABLE, router/shards.py translate()). Why it matters: the client library
# retries reads only on UNAVAILABLE, so a get or scan during a router restart fails instead of
# retrying, and a write that failed CANCELLED looks like an unknown outcome (the caller cannot
# tell that it was never applied; CANCELLED normally means the caller cancelled it). Suggested
# fix: keep the server up, refusing with UNAVAILABLE, until no call has arrived for a short
# while (or for a fixed refusal period after NOT_SERVING) before server.stop(), and/or have the
# router client library treat a CANCELLED it did not cause like UNAVAILABLE.
#
# Session 5: mitigated, not fixed. gRPC core itself cancels the calls it has received but not yet
# handed to the application when the server shuts down, and grpcio offers no way to send GOAWAY
# (so that clients stop sending) before that shutdown; under a flood some calls always land
# in that window (7-96 of ~1,400 per drain here, before and after the drain now gives queued
# calls the rest of its grace to be refused). What changed: router.client.Client retries reads
# on a CANCELLED it did not cause, like UNAVAILABLE (tests/test_client.py), and the router
# already maps a shard's CANCELLED to UNAVAILABLE. A write that fails CANCELLED stays an unknown
# outcome for the caller.
@pytest.mark.xfail(strict=True, reason="a draining router answers calls gRPC queued but never "
                   "ran with CANCELLED (gRPC core, at server shutdown), not UNAVAILABLE; reads "
                   "through router.client.Client retry it")
def test_a_router_draining_under_load_refuses_with_unavailable_not_cancelled(procs, tmp_path):
    shard = start_shard_process(procs, str(tmp_path / "s0"), name="s0")
    map_path = write_cluster_map(str(tmp_path / "cluster.toml"), [shard])
    results = []
    for attempt in range(3):  # one round shows it here; three make a miss very unlikely
        router = start_router_process(procs, map_path, name=f"router{attempt}")
        codes, cancelled, stop, threads, chans = _flood_then_drain(router.address,
                                                                   b"r%d" % attempt)
        try:
            for th in threads:
                th.start()
            wait_until(lambda: codes["OK"] >= 200, "the router to answer 200 puts", 60, 0.01)
            router.popen.send_signal(signal.SIGTERM)
            assert router.popen.wait(60) == 0
        finally:
            stop.set()
            for th in threads:
                th.join(60)
            for ch in chans:
                ch.close()
        with Client(shard.address, timeout=30) as direct:
            applied = sum(v is not None for v in direct.multi_get(cancelled))
        results.append((dict(codes), applied))
        if cancelled:
            break
    codes, applied = results[-1]
    assert not codes.get("CANCELLED"), (
        f"calls refused by a draining router, by status: {results} (rounds: status -> "
        f"count, and how many of the CANCELLED puts were applied: {applied}); each should "
        f"have been UNAVAILABLE")
