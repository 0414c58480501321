"""A thread-safe LRU cache of decoded blocks, bounded in bytes (LevelDB's ``Cache``).

Keys are hashables chosen by the tables (``Table`` packs its id and a block offset into one
int); values are immutable (a ``Block``, or the contents bytes of a block of a restart-interval-1
table); each entry is charged the bytes its caller states (a block's contents length). When an
insert takes the usage past the capacity, least-recently-used entries are dropped until it fits;
an entry larger than the whole capacity is not kept at all.

Thread safety: every method takes one internal lock (held for O(1) dictionary work only).
``hits`` and ``misses`` count :meth:`get` outcomes; they are plain integers updated under the lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Hashable


class BlockCache:
    def __init__(self, capacity_bytes: int):
        if capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        self.capacity = capacity_bytes
        self.usage = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self._map: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable):
        """The cached value for ``key`` (now most recently used), or None."""
        with self._lock:
            entry = self._map.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._map.move_to_end(key)
            self.hits += 1
            return entry[0]

    def insert(self, key: Hashable, value: Any, charge: int) -> None:
        """Cache ``value`` under ``key`` charged ``charge`` bytes, evicting LRU entries."""
        with self._lock:
            old = self._map.pop(key, None)
            if old is not None:
                self.usage -= old[1]
            if charge > self.capacity:
                return
            self._map[key] = (value, charge)
            self.usage += charge
            m = self._map
            while self.usage > self.capacity:
                _, (_, c) = m.popitem(last=False)
                self.usage -= c
                self.evictions += 1

    def erase(self, key: Hashable) -> None:
        with self._lock:
            old = self._map.pop(key, None)
            if old is not None:
                self.usage -= old[1]

    def __len__(self) -> int:
        return len(self._map)

    def stats(self) -> dict:
        with self._lock:
            return {"capacity": self.capacity, "usage": self.usage, "entries": len(self._map),
                    "hits": self.hits, "misses": self.misses, "evictions": self.evictions}
