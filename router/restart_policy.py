"""When to restart a process that died: exponential backoff, then give up. Pure logic.

The supervisor calls :meth:`RestartTracker.on_crash` with the clock each time a process it
did not ask to stop exits, and gets back how long to wait before starting it again, or None
when the process crashed more than ``max_restarts`` times within the last ``window`` seconds
(the supervisor then marks it failed and stops trying). Crashes older than the window are
forgotten, so a process that ran fine for a while starts over at the first delay.

No clock, no I/O: tests drive it with made-up times.

>>> t = RestartTracker(RestartPolicy(delay=0.5, delay_max=4, max_restarts=3, window=60))
>>> [t.on_crash(now) for now in (0, 1, 2)]
[0.5, 1.0, 2.0]
>>> t.on_crash(3) is None
True
>>> t = RestartTracker(RestartPolicy(delay=0.5, delay_max=4, max_restarts=3, window=60))
>>> [t.on_crash(now) for now in (0, 100, 200, 300)]
[0.5, 0.5, 0.5, 0.5]
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class RestartPolicy:
    delay: float  # wait before the first restart
    delay_max: float  # the doubling stops here
    max_restarts: int  # restarts allowed within `window`; one more crash gives up
    window: float  # seconds

    @classmethod
    def from_config(cls, sup) -> "RestartPolicy":
        """From a router.config.SupervisorSpec."""
        return cls(sup.restart_delay, sup.restart_delay_max, sup.max_restarts, sup.restart_window)


class RestartTracker:
    """Crash history of one process. REQUIRES: calls with non-decreasing ``now``."""

    def __init__(self, policy: RestartPolicy):
        self.policy = policy
        self._crashes: deque[float] = deque()
        self.gave_up = False

    def recent_crashes(self, now: float) -> int:
        self._forget(now)
        return len(self._crashes)

    def on_crash(self, now: float) -> float | None:
        """Record a crash at ``now``; return the delay before restarting, or None: give up."""
        self._forget(now)
        self._crashes.append(now)
        n = len(self._crashes)
        if n > self.policy.max_restarts:
            self.gave_up = True
            return None
        return min(self.policy.delay_max, self.policy.delay * (2 ** (n - 1)))

    def reset(self) -> None:
        """Forget every crash (an operator asked for a restart)."""
        self._crashes.clear()
        self.gave_up = False

    def _forget(self, now: float) -> None:
        while self._crashes and self._crashes[0] <= now - self.policy.window:
            self._crashes.popleft()
