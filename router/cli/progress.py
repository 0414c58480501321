"""Progress on stderr for long commands (``load``, ``bench``, ``compact``): one line rewritten in
place on a terminal, a plain line now and then otherwise (logs, pipes), nothing with
``--quiet``. Callers end the line (:meth:`StatusLine.end_line`) before printing anything else,
so an error or a result never lands after a half-written progress line.

Thread safety: one thread shows a given line at a time.
"""

from __future__ import annotations

import sys
import time


class StatusLine:
    """``show(msg)`` at most every ``tty_every`` seconds on a terminal, every ``plain_every``
    seconds otherwise; ``final=True`` always shows and ends the line."""

    def __init__(self, quiet: bool = False, *, tty_every: float = 1.0, plain_every: float = 5.0):
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self.every = tty_every if self.tty else plain_every
        self.last = time.monotonic()
        self.open_line = False  # a terminal line was written without its newline
        self.shown: str | None = None  # the last message written

    def show(self, msg: str, final: bool = False) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        if not final and now - self.last < self.every:
            return
        if final and not self.tty and msg == self.shown:
            return  # the same line, just written: not twice
        self.last = now
        self.shown = msg
        if self.tty:
            print(f"\r{msg}\033[K", end="\n" if final else "", file=sys.stderr, flush=True)
            self.open_line = not final
        else:
            print(msg, file=sys.stderr, flush=True)

    def end_line(self) -> None:
        """Finish a rewritten terminal line, so that what follows starts a line of its own."""
        if self.open_line:
            print(file=sys.stderr, flush=True)
            self.open_line = False
