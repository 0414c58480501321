"""Resident bytes of file mappings, measured by the OS (``/proc/self/smaps``).

What we measure, and why: the ``Rss`` of a mapping, i.e. the pages of the file that are mapped
into *this process's* page tables. That is what a table's filter costs this process. We do not
use ``mincore``: it reports whether a page is in the *page cache*, and a table that was just
written (or read by anyone) is in the page cache whether or not a probe ever touched it, so
mincore would say "resident" for a filter nobody has probed.

A mapping is named either by its start address (exact: one table's own mapping, even when the
same file is mapped twice) or by a path (every mapping of that file in this process; a mapping
of a deleted file shows as ``path (deleted)`` and is counted under ``path``).

Caveat (Linux fault-around, measured on this machine's kernel, see bench/results/sstable.md):
a read fault on a file mapping also maps up to ``fault_around_bytes`` (64 KiB = 16 pages) of
neighbouring pages that are already in the page cache, and ``MADV_RANDOM`` does not prevent it
(it only turns off read-ahead). The filter reader therefore drops the neighbours it did not
mean to touch right after a first touch, so Rss matches the partitions that probes touched.

One call reads smaps once, so a DB-wide report costs one pass however many tables are open
(about 1-3 ms for a few hundred mappings). Linux only: without ``/proc/self/smaps`` every
target reports None.
"""

from __future__ import annotations

import os
from typing import Hashable, Iterable

_SMAPS = "/proc/self/smaps"
_DELETED = b" (deleted)"
_HEX = frozenset(b"0123456789abcdef")


def canonical_path(path: str) -> str:
    """The path as smaps spells it (absolute, symlinks resolved)."""
    return os.path.realpath(path)


def mapping_address(buffer) -> int:
    """The start address of a mapping (e.g. a read-only ``mmap``), for :func:`resident_bytes`.

    Holds no reference to ``buffer`` afterwards (so the mmap can still be closed).
    """
    import numpy as np

    view = np.frombuffer(buffer, dtype=np.uint8, count=1)
    try:
        return view.ctypes.data
    finally:
        del view


def resident_bytes(targets: Iterable[Hashable]) -> dict:
    """Map each target to the Rss, in bytes, that it names in this process.

    A target is an ``int`` (a mapping's start address: that mapping's Rss, 0 if no mapping
    starts there) or a ``str`` path (the sum over all mappings of that file, matched after
    :func:`canonical_path`). Cost: one read of smaps.
    """
    targets = list(targets)
    by_addr = {t: t for t in targets if isinstance(t, int)}
    by_path = {os.fsencode(canonical_path(t)): t for t in targets if isinstance(t, str)}
    totals: dict = {t: 0 for t in targets}
    try:
        with open(_SMAPS, "rb") as f:
            text = f.read()
    except OSError:
        return {t: None for t in targets}
    current = ()
    for line in text.split(b"\n"):
        if not line:
            continue
        if line[0] in _HEX:  # a mapping header: "start-end perms offset dev inode   path"
            parts = line.split(None, 5)
            current = ()
            if by_addr:
                addr = by_addr.get(int(parts[0].split(b"-", 1)[0], 16))
                if addr is not None:
                    current = (addr,)
            if by_path and len(parts) == 6:
                path = parts[5]
                if path.endswith(_DELETED):
                    path = path[: -len(_DELETED)]
                key = by_path.get(path)
                if key is not None:
                    current += (key,)
        elif current and line.startswith(b"Rss:"):
            rss = int(line.split()[1]) * 1024
            for key in current:
                totals[key] += rss
            current = ()
    return totals
