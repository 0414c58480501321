"""When each live table was born, for ``tombstone_compaction_delay`` (picker.py, "Idle time").

A birth time is a ``time.monotonic()`` value, kept in memory only (the manifest is unchanged):

- a table a flush or compaction writes is born when its edit is installed; a trivial move
  keeps the number, and so the time;
- the outputs of a "tombstones" compaction keep their youngest input's time instead: they hold
  the same quiet data with tombstones moved down or dropped, so the next step down the levels
  is eligible at once and an idle DB gives its space back about one delay after it went quiet,
  not one delay per level. They store that time too: their ``creation_time`` property is the
  youngest input's birth on the wall clock (:meth:`Births.tombstone_outputs_born`,
  :func:`wall_time`; the DB passes it in TableOptions), not when they were written;
- a table found at open is as old as its stored ``creation_time`` property says (seconds since
  the Unix epoch, written by every table format, docs/format.md "Properties block"), so a restart
  does not start the delay again, for a tombstone compaction's outputs either:
  :func:`born_at_open` turns it into the monotonic clock. A table whose time is unknown (0) or
  in the future (the wall clock went back) counts as born at open. The property has a 1 s
  resolution and follows the wall clock: a table can look up to a second older than it is,
  or, after the clock jumped forward, old enough at once (the behaviour without a delay,
  once).

Why not a new manifest field: the only use is a delay of about a minute (the option's
default), for which what the tables already store is precise enough, and a format change
would make older code refuse the DB.

:class:`Births` is a dict (file number -> time) with the bookkeeping as methods. REQUIRES:
mutated with DB._mu held; the picker only looks numbers up (``get``), which is safe against a
concurrent insert or delete.
"""

from __future__ import annotations


def born_at_open(creation_time: int, wall_now: float, mono_now: float) -> float:
    """The monotonic birth time of a table found at open whose ``creation_time`` property is
    ``creation_time`` (0: unknown), with the wall clock at ``wall_now`` and the monotonic one
    at ``mono_now``.

    >>> born_at_open(1_000, 1_060.5, 500.0)
    439.5
    >>> born_at_open(0, 1_060.5, 500.0), born_at_open(2_000, 1_060.5, 500.0)
    (500.0, 500.0)
    """
    if creation_time <= 0 or creation_time > wall_now:
        return mono_now
    return mono_now - (wall_now - creation_time)


def wall_time(born: float, wall_now: float, mono_now: float) -> int:
    """The ``creation_time`` property (whole seconds since the Unix epoch) of a table born at
    the monotonic time ``born``: :func:`born_at_open`'s inverse, rounded down (so the table
    can look up to a second older at the next open, never younger).

    >>> wall_time(439.5, 1_060.5, 500.0)
    1000
    """
    return max(0, int(wall_now - (mono_now - born)))


class Births(dict):
    """File number -> monotonic birth time of every live table (module docstring)."""

    def at_open(self, version, creation_time_of, wall_now: float, mono_now: float) -> None:
        """Every table of ``version``; ``creation_time_of(number)`` reads its property."""
        for _, f in version.all_files():
            self[f.number] = born_at_open(creation_time_of(f.number), wall_now, mono_now)

    def flushed(self, metas, now: float) -> None:
        """Tables a flush wrote, installed at ``now``."""
        for m in metas:
            self[m.number] = now

    def compacted(self, task, outputs, now: float) -> None:
        """``task`` (picker.CompactionTask) installed at ``now`` with ``outputs`` (FileMeta):
        its inputs are gone (unless moved), its outputs born now, or at the youngest
        input's time for a "tombstones" task."""
        if task.trivial_move:
            return
        born = now
        if task.reason == "tombstones":
            born = self.tombstone_outputs_born(task, now)
        for f in task.all_inputs:
            self.pop(f.number, None)
        for f in outputs:
            self[f.number] = born

    def tombstone_outputs_born(self, task, now: float) -> float:
        """The birth time of the outputs of the "tombstones" ``task``: its youngest input's
        (an input without one counts as born ``now``)."""
        return max((self.get(f.number, now) for f in task.all_inputs), default=now)
