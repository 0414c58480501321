"""The immutable read state: everything a get or a scan consults, captured at one moment.

A :class:`ReadState` lists the active memtable, the frozen memtables (newest first), the L0
tables (newest first) and, per level L1+, the tables sorted by key with their smallest and
largest keys laid out for ``bisect``. The DB builds a new one whenever a memtable is frozen or
a flush or compaction installs a new version, and publishes it by replacing one attribute;
readers read that attribute once and use the object they got, without a lock. The active
memtable inside is mutable (writes land there, see engine/memtable.py); everything else in a
read state never changes.

A read state holds one reference (engine/table_set.py) to every table it lists, released soon
after the object is freed (by the table set's own thread), so a table compacted away stays
open while a get or scan still uses an older read state.

Lookup order (the first source holding the key wins; newer sources hide older ones): active
memtable, frozen memtables newest first, L0 newest first, then in each deeper level the one
table whose key range covers the key (found by bisect; the table probes its filter before it
reads any block).
"""

from __future__ import annotations

import weakref
from bisect import bisect_left
from typing import Iterator

from .iterators import concat_tables
from .memtable import decode_record


class ReadState:
    """Sources of one moment. Build with :meth:`build`; see the module docstring."""

    __slots__ = ("mem", "mem_get", "frozen", "version", "l0", "levels", "numbers", "older",
                 "lookup", "__weakref__")

    @classmethod
    def build(cls, mem, frozen: tuple, version, tables, sentinel: bytes) -> "ReadState":
        """Capture ``mem``, ``frozen`` (newest first) and the tables of ``version``.

        ``tables`` is the DB's :class:`engine.table_set.TableSet`; ``sentinel`` a key greater
        than any valid key (it ends each level's bisect lists, so a lookup needs no bounds
        check).
        """
        rs = cls()
        rs.mem = mem
        rs.mem_get = mem.get_record  # a record (engine/memtable.py), not an entry tuple
        rs.frozen = tuple(frozen)
        rs.version = version
        levels = version.levels
        rs.l0 = tuple(tables.get(f.number) for f in levels[0])
        lv = []
        lookup = []
        for files in levels[1:]:
            if files:
                ts = [tables.get(f.number) for f in files]
                largests = [f.largest for f in files]
                smallests = [f.smallest for f in files]
                lv.append((largests, smallests, [t.get for t in ts], ts))
                lookup.append((largests + [sentinel], smallests + [sentinel],
                               tuple(t.get for t in ts)))
        rs.levels = tuple(lv)
        # For DB.get, bound once: the lookups below the active memtable (frozen memtables,
        # L0 tables; each returns an entry tuple), then per level (largest keys, smallest
        # keys, table gets).
        rs.older = tuple([m.get for m in rs.frozen] + [t.get for t in rs.l0])
        rs.lookup = tuple(lookup)
        numbers = tuple(f.number for files in levels for f in files)
        rs.numbers = numbers
        tables.ref(numbers)
        # Not unref: a finalizer must not take locks (engine/table_set.py says why).
        weakref.finalize(rs, tables.release_later, numbers)
        return rs

    def find(self, key: bytes):
        """The newest entry ``(seq, kind, value)`` for ``key`` in any source, or None.

        (DB.get inlines the same loop for speed; keep them in step.)
        """
        r = self.mem_get(key)
        if r is not None:
            return decode_record(r)
        return self.find_older(key)

    def find_older(self, key: bytes):
        """:meth:`find` below the active memtable: the frozen memtables and the tables, none
        of which ever changes (DB.multi_get reads the active memtable itself, at once)."""
        for get in self.older:
            e = get(key)
            if e is not None:
                return e
        for largests, smallests, gets in self.lookup:
            i = bisect_left(largests, key)
            if smallests[i] <= key:
                e = gets[i](key)
                if e is not None:
                    return e
        return None

    def sources(self, start: bytes | None, end: bytes | None,
                snapshot: int | None = None) -> list[Iterator]:
        """Sorted entry iterators over every source, newest source first, from ``start``.

        Memtables are bounded by ``end`` themselves; table iterators run to their end and the
        caller stops at ``end``. ``snapshot``: one open on the active memtable
        (``mem.snapshot()``): it is read as it was then; nothing else here ever changes.
        """
        out = [self.mem.iterate(start, end, snapshot=snapshot)]
        out.extend(m.iterate(start, end) for m in self.frozen)
        out.extend(_bounded_table(t, start, end) for t in self.l0)
        for largests, smallests, _gets, ts in self.levels:
            i = 0 if start is None else bisect_left(largests, start)
            j = len(ts) if end is None else bisect_left(smallests, end)
            if i < j:
                out.append(concat_tables(ts[i:j], start))
        return out

    def tables_by_level(self):
        """[(level, [table, ...])] for L0 (newest first) and every non-empty deeper level."""
        out = [(0, list(self.l0))] if self.l0 else []
        levels = self.version.levels
        for n in range(1, len(levels)):
            if levels[n]:
                out.append((n, [self._table_of(n, i) for i in range(len(levels[n]))]))
        return out

    def _table_of(self, level: int, index: int):
        k = sum(1 for n in range(1, level) if self.version.levels[n])
        return self.levels[k][3][index]


def _bounded_table(t, start, end):
    if end is not None and t.smallest >= end:
        return iter(())
    if start is not None and t.largest < start:
        return iter(())
    return t.iterate(start)

