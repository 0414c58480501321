"""Resident bytes of file mappings, measured by the OS.

What we measure, and why: the pages of a mapping that are present in *this process's* page
tables (what smaps calls ``Rss``). That is what a table's filter costs this process. We do not
use ``mincore``: it reports whether a page is in the *page cache*, and a table that was just
written (or read by anyone) is in the page cache whether or not a probe ever touched it, so
mincore would say "resident" for a filter nobody has probed.

Two ways to ask, same answer (tests check they agree):

* :func:`mapping_resident_bytes` reads ``/proc/self/pagemap`` for one mapping's pages (8 bytes
  per page, bit 63 = present): about 10 us for a few hundred pages. ``Table.filter_stats`` uses
  it, so a DB-wide report costs one small read per table.
* :func:`resident_bytes` makes one pass over ``/proc/self/smaps`` for any number of targets,
  by mapping start address or by file path (every mapping of that file in this process; a
  mapping of a deleted file shows as ``path (deleted)`` and is counted under ``path``). A pass
  costs milliseconds (the kernel walks every mapping of the process), so it serves reports and
  cross-checks, not per-table stats.

Caveat (Linux fault-around, measured on this machine's kernel, see bench/results/sstable.md):
a read fault on a file mapping also maps up to ``fault_around_bytes`` (64 KiB = 16 pages) of
neighbouring pages that are already in the page cache, and ``MADV_RANDOM`` does not prevent it
(it only turns off read-ahead). The filter reader therefore drops the neighbours it did not
mean to touch right after a first touch, so Rss matches the partitions that probes touched.

Linux only: without ``/proc`` these functions report None.
"""

from __future__ import annotations

import mmap
import os
import threading
from typing import Hashable, Iterable

import numpy as np

_SMAPS = "/proc/self/smaps"
_PAGEMAP = "/proc/self/pagemap"
_DELETED = b" (deleted)"
_HEX = frozenset(b"0123456789abcdef")
_PAGE = mmap.PAGESIZE

_pagemap_fd: int | None = None
_pagemap_lock = threading.Lock()


def canonical_path(path: str) -> str:
    """The path as smaps spells it (absolute, symlinks resolved)."""
    return os.path.realpath(path)


def mapping_address(buffer) -> int:
    """The start address of a mapping (e.g. a read-only ``mmap``).

    Holds no reference to ``buffer`` afterwards (so the mmap can still be closed).
    """
    view = np.frombuffer(buffer, dtype=np.uint8, count=1)
    try:
        return view.ctypes.data
    finally:
        del view


def _pagemap() -> int | None:
    global _pagemap_fd
    if _pagemap_fd is None:
        with _pagemap_lock:
            if _pagemap_fd is None:
                try:
                    _pagemap_fd = os.open(_PAGEMAP, os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    _pagemap_fd = -1
    return _pagemap_fd if _pagemap_fd >= 0 else None


def mapping_resident_bytes(address: int, length: int) -> int | None:
    """Bytes of ``[address, address + length)`` present in this process's page tables.

    REQUIRES: the range is mapped (a page-aligned mapping of this process). Reads 8 bytes of
    ``/proc/self/pagemap`` per page; None if pagemap cannot be read.
    """
    fd = _pagemap()
    if fd is None:
        return None
    first = address // _PAGE
    pages = -(-(address + length) // _PAGE) - first
    try:
        raw = os.pread(fd, pages * 8, first * 8)
    except OSError:
        return None
    # Each entry is a little-endian u64; bit 63 ("present") is the top bit of its last byte.
    present = np.frombuffer(raw, dtype=np.uint8)[7::8] & 0x80
    return int(np.count_nonzero(present)) * _PAGE


def resident_bytes(targets: Iterable[Hashable]) -> dict:
    """Map each target to the Rss, in bytes, that it names in this process (one smaps pass).

    A target is an ``int`` (a mapping's start address: that mapping's Rss; 0 if no mapping
    covers that address; None if the address lies inside a larger mapping, as when Linux merged
    two contiguous mappings of one file into one VMA: smaps cannot split its Rss, while
    :func:`mapping_resident_bytes` can) or a ``str`` path (the sum over all mappings of that
    file, matched after :func:`canonical_path`).
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
    spans = []  # (start, end) of every mapping, to tell "inside one" from "not mapped"
    for line in text.split(b"\n"):
        if not line:
            continue
        if line[0] in _HEX:  # a mapping header: "start-end perms offset dev inode   path"
            parts = line.split(None, 5)
            current = ()
            if by_addr:
                lo, hi = parts[0].split(b"-", 1)
                start = int(lo, 16)
                spans.append((start, int(hi, 16)))
                addr = by_addr.get(start)
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
    if by_addr:
        starts = {start for start, _ in spans}
        for addr in by_addr:
            if addr not in starts and any(start < addr < end for start, end in spans):
                totals[addr] = None
    return totals
