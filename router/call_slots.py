"""Call slots of one shard (router/shards.py): a counting semaphore that tells a hung shard from
a busy one.

A call takes a slot for as long as it waits on the shard. With a slot free, taking one is a
plain lock (~1 us for take and give back, half of ``threading.BoundedSemaphore`` with a
timeout). With none free the caller waits its turn (first come, first served: a released
slot is handed to the longest waiter) for as long as its deadline allows, *unless the shard is
hung*: every slot taken, and for :attr:`CallSlots.hung_after` seconds no call of this shard
was answered and no slot was taken (a burst on a shard idle for hours is not a hang; nor are
calls that keep ending at short client deadlines: their slots keep changing hands, and each
holds a thread only as long as its own deadline). Then waiting callers give up and new ones are refused at once, so
they return their handler threads instead of piling up behind a shard that does not answer.
A shard that answers slowly but steadily (a write stall, a long queue) keeps its callers
waiting, as without slots. Thread-safe.
"""

from __future__ import annotations

import collections
import threading
import time

_RECHECK = 0.25
"""Longest a waiter sleeps before it looks again whether the shard is hung or time is up."""


class _Waiter:
    __slots__ = ("gate", "granted")

    def __init__(self):
        self.gate = threading.Lock()
        self.gate.acquire()  # released by the release() that hands this waiter a slot
        self.granted = False


class CallSlots:
    """``n`` slots; :meth:`acquire` takes one, :meth:`release` gives it back."""

    __slots__ = ("capacity", "hung_after", "_free", "_waiters", "_lock", "_answered",
                 "_taken")

    def __init__(self, n: int, hung_after: float):
        if n < 1:
            raise ValueError(f"call slots: need at least 1, got {n}")
        self.capacity = n
        self.hung_after = hung_after
        self._free = n
        self._waiters: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._answered = 0.0  # monotonic time of the last answered call
        self._taken = 0.0  # when a slot was last taken (or handed to a waiter)

    def hung(self, now: float | None = None) -> bool:
        """Every slot taken; no call answered and no slot taken for ``hung_after`` seconds."""
        if self._free:
            return False
        if now is None:
            now = time.monotonic()
        return now - max(self._answered, self._taken) >= self.hung_after

    def acquire(self, wait: float) -> bool:
        """Take a slot, waiting up to ``wait`` seconds; False if the time ran out or the shard
        is (or turns) hung. A True must be paired with one :meth:`release`."""
        with self._lock:
            if self._free and not self._waiters:
                self._free -= 1
                self._taken = time.monotonic()
                return True
            now = time.monotonic()
            if wait <= 0 or self.hung(now):
                return False
            me = _Waiter()
            self._waiters.append(me)
            end = now + wait
        while True:
            now = time.monotonic()
            step = min(end - now, _RECHECK)
            if step > 0 and me.gate.acquire(timeout=step):
                return True
            with self._lock:
                if me.granted:
                    return True
                now = time.monotonic()
                if now >= end or self.hung(now):
                    self._waiters.remove(me)
                    return False

    def release(self, answered: bool = True) -> None:
        """Give a slot back; ``answered``: the call got an answer from the shard (an error
        status included), not a deadline."""
        with self._lock:
            now = time.monotonic()
            if answered:
                self._answered = now
            if self._waiters:
                self._taken = now
                me = self._waiters.popleft()
                me.granted = True
                me.gate.release()
                return
            if self._free >= self.capacity:
                raise ValueError("call slots released more often than acquired")
            self._free += 1

    @property
    def in_use(self) -> int:
        """Slots taken now (a racy snapshot, for reports)."""
        return self.capacity - self._free
