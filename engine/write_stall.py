"""Write stalls of :class:`engine.DB` (mixin): making room for a write, and giving up.

A write needs room: a memtable with space (else the memtable is switched, unless too many
frozen ones wait for their flush) and L0 under its stop trigger; past ``l0_slowdown_trigger``
it is held to ``delayed_write_rate`` (engine/write_controller.py). The group-commit leader
makes room before it forms its group (``_prepare_commit``; engine/group_commit.py,
"Deadlines"), waiting here with the DB mutex released. A write with a ``timeout`` gives up
instead of waiting past its deadline: ``Withdrawn`` here, WriteStalledError to the caller
(``_stalled`` names what holds writes), nothing of it logged.

REQUIRES the attributes DB._init sets; each method says whether it runs with ``self._mu`` held
(see engine/db.py for the lock order).
"""

from __future__ import annotations

import threading
import time

from .background import RETRY_WAIT_S
from .compaction.picker import compaction_debt
from .errors import InvalidArgumentError, StorageIOError, WriteStalledError
from .group_commit import Withdrawn


class WriteStalls:
    """Room for writes, slowdowns, stops and write timeouts (mixin of DB)."""

    def _deadline(self, timeout) -> float | None:
        """The monotonic deadline of a write's ``timeout``; None (no bound) for one at or past
        threading.TIMEOUT_MAX (infinity included), which no wait could take."""
        if (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                or not timeout >= 0):
            raise InvalidArgumentError(f"write timeout must be None or seconds >= 0, got "
                                       f"{timeout!r}")
        if timeout >= threading.TIMEOUT_MAX:
            return None
        return time.monotonic() + timeout

    def _prepare_commit(self, leader, group_bytes) -> int | None:
        """Group-commit leader, before it forms its group: make room, waiting for the leader
        alone (engine/group_commit.py), charging the group it would form now (``group_bytes()``)
        to the write controller; returns those bytes, or None if room was there. REQUIRES:
        self._mu held (released while waiting)."""
        if (self._mem.approximate_bytes >= self._memtable_bytes or self._log_broken
                or self._bg_error is not None or self._closing
                or len(self._version.levels[0]) >= self._l0_slowdown):
            nbytes = group_bytes()
            self._make_room_for_write(force=False, nbytes=nbytes, deadline=leader.deadline)
            return nbytes
        return None

    def _stalled(self, timeout) -> WriteStalledError:
        """The error of a write that gave up at its ``timeout``, naming what holds writes."""
        opts = self.options
        with self._mu:
            self.counters.write_timeouts += 1
            l0 = len(self._version.levels[0])
            frozen = len(self._frozen)
            rate = self.write_controller.rate if self.write_controller.delayed else None
        if l0 >= opts.l0_stop_trigger and not opts.disable_auto_compactions:
            why = f"L0 holds {l0} tables, at l0_stop_trigger ({opts.l0_stop_trigger})"
        elif frozen >= opts.max_frozen_memtables:
            why = (f"{frozen} memtables wait for their flush, at max_frozen_memtables "
                   f"({opts.max_frozen_memtables})")
        elif rate is not None:
            why = (f"writes are held to {rate / (1 << 20):.2f} MiB/s while L0 holds {l0} "
                   f"tables (l0_slowdown_trigger {opts.l0_slowdown_trigger})")
        else:  # no stall now: it waited in the queue behind slow writes (a slow fsync)
            return WriteStalledError(f"write not applied: it waited past its timeout of "
                                     f"{timeout:g} s in the write queue, behind writes slower "
                                     f"than that (no write stall now); retry")
        return WriteStalledError(f"write not applied: the DB holds writes ({why}) and it "
                                 f"would wait past its timeout of {timeout:g} s; retry later")

    def _make_room_for_write(self, force: bool, nbytes: int = 0,
                             deadline: float | None = None) -> None:
        """Switch memtables when full (or forced); slow down a write of ``nbytes`` (key +
        value bytes) or wait under pressure. Raises Withdrawn (engine/group_commit.py) if the
        wait would end after ``deadline`` (monotonic seconds; None: no bound): at once for a
        slowdown, when it passes for a stop.

        REQUIRES: self._mu held; may release it while sleeping or waiting.
        """
        opts = self.options
        allow_delay = not force
        stall_l0 = not opts.disable_auto_compactions
        stopped_since = None  # when this writer started waiting at l0_stop_trigger
        while True:
            self._check_writable(deadline)
            l0 = len(self._version.levels[0])
            wc = self.write_controller
            room = not self._log_broken and self._mem.approximate_bytes < opts.memtable_bytes
            if (allow_delay and stall_l0 and l0 >= opts.l0_slowdown_trigger and wc.enabled
                    and (l0 < opts.l0_stop_trigger or room)):
                # Held to the rate; not a write that is about to stop at l0_stop_trigger
                # (the stop holds it back, and a charge would only push back the writers
                # after it: RocksDB's GetDelay is 0 while writes are stopped).
                allow_delay = False
                wc.observe(self._version, self._debt_of, l0, opts.l0_stop_trigger)
                now = time.monotonic()
                pause = wc.delay(nbytes, now, deadline)
                if pause is None:  # would sleep past the deadline (nothing charged)
                    raise Withdrawn()
                if pause > 0:
                    self._slowdown_wait(now + pause)
                    self.counters.slowdown_s += time.monotonic() - now
                    self.counters.slowdowns += 1
                continue  # L0 may have changed meanwhile
            if wc.delayed and (l0 < opts.l0_slowdown_trigger or not stall_l0):
                wc.end()
            if not force and room:
                return
            elif force and not self._log_broken and len(self._mem) == 0:
                return
            elif len(self._frozen) >= opts.max_frozen_memtables or (stall_l0 and l0 >= opts.l0_stop_trigger):
                err = self._compaction_full_disk
                if stall_l0 and l0 >= opts.l0_stop_trigger and err is not None:
                    now = time.monotonic()
                    stopped_since = stopped_since or now
                    if now - stopped_since >= RETRY_WAIT_S:  # no retry brought L0 down
                        raise StorageIOError(
                            f"DB refuses writes while L0 holds {l0} tables (l0_stop_trigger) "
                            f"and compactions fail ({err}); they are retried",
                            path=self.path, errno_=getattr(err, "errno", None)) from err
                wait = 0.5
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                    if wait <= 0:
                        raise Withdrawn()
                t0 = time.perf_counter()
                self._bg_cv.wait(wait)
                self.counters.stop_s += time.perf_counter() - t0
                self.counters.stops += 1
            else:
                self._switch_memtable()
                force = False

    def _slowdown_wait(self, until: float) -> None:
        """Sleep a slowed write until monotonic time ``until``, or less: it ends early when
        L0 falls under l0_slowdown_trigger (a compaction installed), the DB closes or fails.
        The background threads notify ``_bg_cv`` on each of those. REQUIRES: self._mu held
        (released while waiting)."""
        trigger = self.options.l0_slowdown_trigger
        while (not self._closing and self._bg_error is None
               and len(self._version.levels[0]) >= trigger):
            left = until - time.monotonic()
            if left <= 0:
                return
            self._bg_cv.wait(left)

    def _debt_of(self, version) -> int:
        """Compaction debt of ``version`` (the write controller's signal)."""
        return compaction_debt(version, self.options)
