"""Write slowdown: hold writers to an adaptive byte rate while L0 is past its slowdown trigger.

RocksDB's WriteController and SetupDelay (db/write_controller.cc, db/column_family.cc) in
our terms. Until session 16 every write past ``l0_slowdown_trigger`` slept a fixed 1 ms,
which held one writer to ~900 puts/s whatever compaction could take, for as long as one
L0 -> L1 compaction ran (5-45 s under sustained load: bench/results/db.md "Session 15:
sustained ingest"); the windows between ran at full speed. A rate follows what compaction
keeps up with instead.

- A DB is *delayed* while L0 holds at least ``l0_slowdown_trigger`` tables. Writes then
  pass a token bucket of ``rate`` bytes/s (a write's key + value bytes): one that finds
  credit goes on at once; one that does not sleeps until the bytes it lacks are paid for,
  and at least ``interval`` (``slowdown_sleep_s``, RocksDB's 1 ms refill): fewer, longer
  sleeps, each of which costs a system call and a wake-up. Credit never exceeds
  ``BURST_S`` seconds of the rate, so a pause does not buy a burst (nor a free large write:
  it pays what the credit does not cover). Writes that arrive together queue: each one's
  sleep starts where the previous one's ends. The DB ends a sleep early when L0 falls under
  the trigger or the DB closes or fails (engine/write_stall.py ``_slowdown_wait``), and does not
  charge a write that is about to stop at ``l0_stop_trigger``.
- A sleep can be long: bytes / rate, unbounded. At the floor (16 KiB/s) a 1 MiB write
  owes 64 s, which is why the rate is kept as high as the debt allows.
- The rate adapts at each new version (a flush or compaction installed), from the
  compaction debt (:func:`engine.compaction.picker.compaction_debt`: bytes compactions
  would write to bring every level within its target): debt grown -> rate x ``SLOWER``;
  shrunk -> rate / ``SLOWER``, never above ``max_rate`` (``delayed_write_rate``); grown
  with L0 within ``NEAR_STOP`` tables of ``l0_stop_trigger`` -> x ``NEAR_STOP_SLOWER``
  instead. Never below ``MIN_RATE``.
- When a delay ends (a write finds L0 under the trigger again) the rate is raised by
  ``RECOVER`` (at most ``max_rate``) and kept: the next delay starts from what this one
  learned (RocksDB's kDelayRecoverSlowdownRatio), not from ``max_rate``.
- ``interval`` 0 turns slowdowns off: writers only stop, at ``l0_stop_trigger``.

Not thread-safe: the DB calls it under its mutex (engine/write_stall.py ``_make_room_for_write``).
"""

from __future__ import annotations

MIN_RATE = 16 * 1024  # bytes/s: RocksDB's kMinWriteRate
SLOWER = 0.8  # RocksDB's kIncSlowdownRatio
NEAR_STOP_SLOWER = 0.6  # RocksDB's kNearStopSlowdownRatio
NEAR_STOP = 2  # L0 tables from the stop trigger that count as near it
RECOVER = 1.4  # RocksDB's kDelayRecoverSlowdownRatio
BURST_S = 0.1  # most credit a writer may hold, in seconds of the rate


class WriteController:
    """The delay state of one DB. ``max_rate``: bytes/s a delay starts from and never
    exceeds (> 0); ``interval``: shortest sleep, seconds (0: never delay)."""

    def __init__(self, max_rate: float, interval: float):
        self.max_rate = float(max_rate)
        self.interval = float(interval)
        self.rate = self.max_rate
        self.delayed = False
        self._debt: int | None = None  # compaction debt at the last adjustment
        self._seen = None  # the version of the last adjustment
        self._credit = 0.0
        self._next_refill: float | None = None
        self.adjustments = 0  # times the rate was changed (stats)

    @property
    def enabled(self) -> bool:
        return self.interval > 0

    def observe(self, version, debt_of, l0: int, stop_trigger: int) -> None:
        """Note that L0 is past the slowdown trigger under ``version``. Starts a delay, or
        adjusts the rate if ``version`` is new since the last call; ``debt_of(version)``
        gives its compaction debt (called only for a new version)."""
        if version is self._seen:
            return
        debt = debt_of(version)
        if not self.delayed:
            self.delayed = True
            self._credit = 0.0
            self._next_refill = None
        elif self._debt is not None:
            if debt > self._debt:
                near = l0 >= stop_trigger - NEAR_STOP
                self._set_rate(self.rate * (NEAR_STOP_SLOWER if near else SLOWER))
            elif debt < self._debt:
                self._set_rate(self.rate / SLOWER)
        self._seen = version
        self._debt = debt

    def end(self) -> None:
        """Note that L0 is under the slowdown trigger: ends a delay, raising the rate."""
        if self.delayed:
            self.delayed = False
            self._seen = None
            self._debt = None
            self._set_rate(self.rate * RECOVER)

    def delay(self, nbytes: int, now: float, deadline: float | None = None) -> float | None:
        """Seconds a write of ``nbytes`` must sleep at monotonic time ``now`` (0: none), its
        bytes then charged; None, with nothing charged, if that sleep would end after
        ``deadline`` (the write is refused: a refused write must not slow the ones after it).
        REQUIRES: delayed (after :meth:`observe`)."""
        if not self.enabled:
            return 0.0
        saved = self._credit, self._next_refill
        pause = self._charge(nbytes, now)
        if deadline is not None and pause > 0 and now + pause > deadline:
            self._credit, self._next_refill = saved
            return None
        return pause

    def _charge(self, nbytes: int, now: float) -> float:
        if self._credit >= nbytes:
            self._credit -= nbytes
            return 0.0
        rate = self.rate
        if self._next_refill is None:
            self._next_refill = now
        if self._next_refill <= now:
            elapsed = now - self._next_refill + self.interval
            self._credit = min(self._credit + elapsed * rate, rate * BURST_S)
            self._next_refill = now + self.interval
            if self._credit >= nbytes:
                self._credit -= nbytes
                return 0.0
        self._next_refill += (nbytes - self._credit) / rate
        self._credit = 0.0
        return max(self._next_refill - now, self.interval)

    def _set_rate(self, rate: float) -> None:
        rate = min(max(rate, MIN_RATE), self.max_rate)
        if rate != self.rate:
            self.rate = rate
            self.adjustments += 1
