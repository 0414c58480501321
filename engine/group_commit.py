"""Group commit: concurrent writers share one log write and one fsync.

LevelDB's ``DBImpl::Write`` ``writers_`` queue. Every write enters a FIFO queue under the DB
mutex. The writer at the head is the *leader*: it takes the queued writes behind it (the
*group*), and runs ``commit(group)``, which appends one log record for the whole group, syncs
once if the leader asked for sync, and applies the group to the memtable. The followers sleep
until the leader marks them done (with the leader's error, if any), then return. While the
leader works (``commit`` may release the mutex for the I/O), newcomers queue up behind it and
form the next group.

Group rules (as LevelDB): a group holds at most ``max_group_bytes`` of keys and values (less
when the leader is small, so a small write does not wait for a big one); a write that asked for
sync never joins the group of a leader that did not (it would be acknowledged unsynced).

Deadlines (RocksDB's ``no_slowdown`` generalised to a wait bound): a write may carry a
``deadline`` (``time.monotonic()`` seconds). A follower still waiting in the queue when its
deadline passes leaves it and raises :class:`Withdrawn` (it is in no group yet, so nothing of
it is written). Once a leader has taken it into its group it is written with the group, late
or not. A leader runs ``prepare(leader, group_bytes)`` before it forms its group: waiting for
room (a write stall) happens there, for the leader alone, so a leader that gives up at its
deadline fails alone, and the followers behind it keep their own deadlines. ``group_bytes()``
gives the bytes of the group the leader would form now; prepare returns them when it had to
make room (then they may have been charged to the write controller, and it may have waited),
else None; the group then holds at most that many bytes, and writers that queued meanwhile
form the next group.

Thread safety: :meth:`write` may be called from any number of threads. ``commit`` is called
with the mutex held, by one thread at a time, and must leave it held when it returns.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable


class Withdrawn(Exception):
    """A queued write's deadline passed before any leader took it: it was not written."""


class Writer:
    """One queued write: its operations, sync flag, deadline and (once done) outcome."""

    __slots__ = ("ops", "sync", "nbytes", "commit", "solo", "deadline", "taken", "done",
                 "error")

    def __init__(self, ops: list, sync: bool, nbytes: int, commit, solo: bool,
                 deadline: float | None = None):
        self.ops = ops
        self.sync = sync
        self.nbytes = nbytes
        self.commit = commit
        self.solo = solo
        self.deadline = deadline
        self.taken = False  # in a leader's group: written with it, whatever its deadline
        self.done = False
        self.error: BaseException | None = None


class GroupCommit:
    """The writers queue. ``mutex`` is the DB mutex (a ``threading.Lock``)."""

    def __init__(self, mutex: threading.Lock, max_group_bytes: int = 1 << 20):
        self._mu = mutex
        self._cv = threading.Condition(mutex)
        self._queue: deque[Writer] = deque()
        # Read-only for callers holding the mutex: empty means no writer is queued or writing.
        self.queue = self._queue
        self.max_group_bytes = max_group_bytes
        self.groups = 0
        self.grouped_writes = 0

    def write(self, ops: list, sync: bool, nbytes: int, commit: Callable[[list[Writer]], None],
              solo: bool = False, deadline: float | None = None,
              prepare: Callable[[Writer, Callable[[], int]], int | None] | None = None) -> None:
        """Queue ``ops`` and return once a leader (maybe this thread) committed them.

        Raises the error ``commit`` raised for the group this write belonged to. A ``solo``
        writer (e.g. a flush request, whose ``commit`` differs) is always a group of its own:
        it runs its ``commit`` in queue order with the writes before and after it.
        ``deadline`` and ``prepare``: see the module docstring; raises :class:`Withdrawn`
        if the deadline passed in the queue, or what ``prepare`` raised (nothing written).
        """
        w = Writer(ops, sync, nbytes, commit, solo, deadline)
        q = self._queue
        with self._mu:
            q.append(w)
            while not w.done and q[0] is not w:
                if deadline is None or w.taken:
                    self._cv.wait()
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    q.remove(w)  # not the head (that one leads), in no group: not written
                    raise Withdrawn()
                self._cv.wait(left)
            if w.done:
                if w.error is not None:
                    raise w.error
                return
            budget = None
            if prepare is not None and not solo:
                try:
                    budget = prepare(w, lambda: self._group_bytes(w))
                except BaseException:
                    q.popleft()  # this leader alone fails; the next writer leads
                    if q:
                        self._cv.notify_all()
                    raise
            # At most the bytes prepare charged (if it made room): writers that queued while
            # it waited (the mutex released) form the next group, which prepares again.
            group = self._build_group(w, budget)
            err = None
            try:
                w.commit(group)
            except BaseException as exc:  # every writer of the group gets the leader's error
                err = exc
            for x in group:
                q.popleft()
                x.error = err
                x.done = True
            self.groups += 1
            self.grouped_writes += len(group)
            if q or len(group) > 1:
                self._cv.notify_all()
        if err is not None:
            raise err

    def pending(self) -> int:
        """Writes queued or in progress. REQUIRES: the mutex held."""
        return len(self._queue)

    def _group_bytes(self, leader: Writer) -> int:
        """Bytes of the group ``leader`` would form now (what ``prepare`` charges)."""
        return sum(x.nbytes for x in self._members(leader))

    def _build_group(self, leader: Writer, budget: int | None = None) -> list[Writer]:
        group = self._members(leader, budget)
        for x in group:
            x.taken = True
        return group

    def _members(self, leader: Writer, budget: int | None = None) -> list[Writer]:
        q = self._queue
        if len(q) == 1 or leader.solo:
            return [leader]
        limit = self.max_group_bytes
        if leader.nbytes <= 128 << 10:
            limit = min(limit, leader.nbytes + (128 << 10))
        if budget is not None:
            limit = min(limit, budget)
        group = [leader]
        size = leader.nbytes
        for x in list(q)[1:]:
            if x.solo or (x.sync and not leader.sync):
                break
            size += x.nbytes
            if size > limit:
                break
            group.append(x)
        return group
