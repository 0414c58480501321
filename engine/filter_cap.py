"""A cap on resident filter memory: CLOCK eviction of filter partitions.

Tables map their filter partitions lazily (engine/sstable): a partition costs memory only once
a probe touched it. :class:`FilterCap` is the ``residency`` hook every table of a DB shares.
A table calls ``on_fault(table, p, nbytes)`` when a probe touches partition ``p`` that it has
not marked resident; the cap records it and, while the recorded resident bytes exceed the
cap, evicts the coldest partition with ``table.release_partition(p)`` (madvise DONTNEED: the
pages are dropped and fault back in from the file at the next probe).

"Coldest" is CLOCK (second chance): resident partitions sit in a ring in fault order; each
probe sets the table's ``filter_ref[p]`` bit, which is cleared when the partition enters the
ring. The hand looks at the oldest partition: if its bit is set it clears it and moves the
partition to the back (a second chance), otherwise it evicts it. Probes pay nothing but setting one byte; the cost is paid at fault time.

Thread safety: all methods take one internal lock. ``on_fault`` may be called from any reader
thread; ``release_partition`` runs under that lock (tables must not call back into the cap
from ``release_partition``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict


class FilterCap:
    """Resident-filter cap shared by the tables of one DB. See the module docstring."""

    def __init__(self, cap_bytes: int | None):
        self.cap_bytes = cap_bytes
        self._lock = threading.Lock()
        self._ring: OrderedDict = OrderedDict()  # (id(table), p) -> (table, p, nbytes)
        self.resident_bytes = 0
        self.faults = 0
        self.evictions = 0
        self.evicted_bytes = 0
        self.second_chances = 0

    def on_fault(self, table, p: int, nbytes: int) -> None:
        """Record that partition ``p`` of ``table`` (``nbytes`` long) became resident."""
        with self._lock:
            key = (id(table), p)
            old = self._ring.pop(key, None)
            if old is not None:
                self.resident_bytes -= old[2]
            self._ring[key] = (table, p, nbytes)
            # Enters with its reference bit clear (the probe that faulted it set it): only a
            # probe *after* it became resident earns it a second chance.
            table.filter_ref[p] = 0
            self.resident_bytes += nbytes
            self.faults += 1
            cap = self.cap_bytes
            if cap is not None and self.resident_bytes > cap:
                self._evict_locked(cap, key)

    def _evict_locked(self, cap: int, protect) -> None:
        """Evict until under ``cap``. Never the partition ``protect`` that just faulted: the
        probe that faulted it is about to read it (releasing it now would only make that read
        fault it back in, unaccounted)."""
        ring = self._ring
        # Each partition gets at most one second chance per sweep: bounded by 2 * len(ring).
        budget = 2 * len(ring) + 1
        while self.resident_bytes > cap and len(ring) > 1 and budget > 0:
            budget -= 1
            key, entry = next(iter(ring.items()))
            if key == protect:
                ring.move_to_end(key)
                continue
            table, p, nbytes = entry
            ref = table.filter_ref
            if ref[p]:
                ref[p] = 0
                ring.move_to_end(key)
                self.second_chances += 1
                continue
            del ring[key]
            self.resident_bytes -= nbytes
            table.release_partition(p)
            self.evictions += 1
            self.evicted_bytes += nbytes

    def forget_table(self, table) -> None:
        """Drop every partition of ``table`` (call before the table is closed)."""
        tid = id(table)
        with self._lock:
            for key in [k for k in self._ring if k[0] == tid]:
                self.resident_bytes -= self._ring.pop(key)[2]

    def report(self) -> dict:
        """The cap section of filter_report(): cap, tracked resident bytes, evictions."""
        with self._lock:
            return {
                "cap_bytes": self.cap_bytes,
                "tracked_resident_bytes": self.resident_bytes,
                "resident_partitions": len(self._ring),
                "faults": self.faults,
                "evictions": self.evictions,
                "evicted_bytes": self.evicted_bytes,
                "second_chances": self.second_chances,
            }
