"""Resident bytes of file mappings, measured by the OS (``/proc/self/smaps``).

What we measure, and why: the ``Rss`` of each mapping of a table file in this process, i.e.
pages of the file that are mapped into *our* page tables. That is the memory a filter costs
this process. We do not use ``mincore``: it reports whether a page is in the *page cache*, and a
table that was just written (or read by anyone) is in the page cache whether or not a probe
ever touched it, so mincore would say "resident" for a filter nobody has probed.

Caveat (Linux fault-around, measured on this machine's kernel, see bench/results/sstable.md):
a read fault on a file mapping also maps up to ``fault_around_bytes`` (64 KiB = 16 pages) of
neighbouring pages that are already in the page cache, and ``MADV_RANDOM`` does not prevent it
(it only turns off read-ahead). The filter reader therefore drops the neighbours it did not
mean to touch right after a first touch (``PartitionedFilter._fault_in``), so Rss matches the
partitions that probes touched.

One call reads smaps once, so a DB-wide report costs one pass however many tables are open.
A mapping of a deleted file shows as ``path (deleted)``; it is counted under ``path``.
Linux only: elsewhere (no ``/proc/self/smaps``) every path reports None.
"""

from __future__ import annotations

import os
from typing import Iterable

_SMAPS = "/proc/self/smaps"
_DELETED = b" (deleted)"
_HEX = frozenset(b"0123456789abcdef")


def canonical_path(path: str) -> str:
    """The path as smaps spells it (absolute, symlinks resolved)."""
    return os.path.realpath(path)


def resident_bytes(paths: Iterable[str]) -> dict[str, int | None]:
    """Map each path in ``paths`` to the Rss, in bytes, of all its mappings in this process.

    Paths are matched after :func:`canonical_path`; a path with no mapping reports 0.
    Cost: one read of smaps (about 1 ms per few hundred mappings).
    """
    wanted = {os.fsencode(canonical_path(p)): p for p in paths}
    totals: dict[str, int | None] = {p: 0 for p in wanted.values()}
    try:
        with open(_SMAPS, "rb") as f:
            text = f.read()
    except OSError:
        return {p: None for p in totals}
    current = None
    for line in text.split(b"\n"):
        if not line:
            continue
        if line[0] in _HEX:  # a mapping header: "start-end perms offset dev inode   path"
            parts = line.split(None, 5)
            path = parts[5] if len(parts) == 6 else b""
            if path.endswith(_DELETED):
                path = path[: -len(_DELETED)]
            current = wanted.get(path)
        elif current is not None and line.startswith(b"Rss:"):
            totals[current] += int(line.split()[1]) * 1024
            current = None
    return totals


def resident_bytes_of(path: str) -> int | None:
    """Rss of ``path``'s mappings in this process (one smaps pass)."""
    return resident_bytes([path])[path]
