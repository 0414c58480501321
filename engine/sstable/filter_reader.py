"""Probes the partitioned filter, mapping the filter region lazily
(docs/format.md, "Filter partitions").

Nothing is read or mapped until the first probe. The first probe maps the whole filter region
read-only with ``MADV_RANDOM``; from then on a probe reads only its partition's pages, which the
OS pages in on first touch. Per partition the reader keeps a state byte:

* ``UNTOUCHED``: never probed; the first probe verifies the partition's CRC (stored in the
  filter index). A mismatch marks it ``BAD``: every later probe answers "may match" and counts
  a ``filter_error``. An unknown policy (no decoder for the stored name) does the same for every
  partition, without mapping anything.
* ``RESIDENT``: probed since the last release; probes take the fast path.
* ``VERIFIED``: released (``madvise(DONTNEED)``) since; the next probe faults it back in.

A probe that makes a partition resident (first touch, or first touch after a release) drops the
neighbouring pages the kernel's fault-around mapped with it (see engine/sstable/residency.py)
and tells the DB's ``residency`` hook ``on_fault(owner, p, nbytes)``, outside any lock. A
partition that fails its CRC has its pages dropped too: it is never resident.

Thread safety: probes may run from many threads without a lock (counters are plain ints: good
enough for statistics); mapping and CRC verification take an internal lock. ``release`` may be
called from any thread (the DB's filter cap); a probe already past its state check when the
partition is released faults the page back in unaccounted until that partition's next fault
(answers stay right: DONTNEED on a file mapping only drops page-table entries).
REQUIRES: no probe in flight when ``close`` runs.
"""

from __future__ import annotations

import errno
import mmap
import operator
import struct
import threading
import weakref
from bisect import bisect_left

from ..checksum import masked_crc
from ..errors import ClosedError, CorruptionError, StorageIOError
from ..format import FILTER_PAGE_SIZE
from ..vfs import RandomAccessFile
from .block import Block
from .coding import get_varint
from .filter_builder import round_up_pages
from .residency import mapping_address, mapping_resident_bytes

UNTOUCHED, VERIFIED, RESIDENT, BAD = 0, 1, 2, 3
FAULT_AROUND_BYTES = 64 * 1024  # Linux default fault_around_bytes: the window to clean up

_U32 = struct.Struct("<I")


def decode_filter_index(block: Block, region_size: int, num_data_blocks: int):
    """Decode the filter index block into parallel lists
    ``(separators, offsets, sizes, crcs, first_blocks, num_keys)``.

    Checks the placement invariants: partitions start on page boundaries, lie back to back from
    region offset 0, fill the region exactly, and cover increasing runs of data blocks from 0;
    there is at least one (a table without data blocks has no filter index). The separators
    are checked against the index by the table (engine/sstable/reader.py). Raises
    CorruptionError naming the file and the block's offset otherwise.
    """
    data = block.data
    entries = block.whole_entries()
    keys = [e[0] for e in entries]
    offsets, sizes, crcs, firsts, nkeys = [], [], [], [], []
    expect = 0
    try:
        for _, vs, ve in entries:
            off, p = get_varint(data, vs, ve)
            size, p = get_varint(data, p, ve)
            if p + 4 > ve:
                raise ValueError("truncated filter index entry")
            crcs.append(_U32.unpack_from(data, p)[0])
            first, p = get_varint(data, p + 4, ve)
            n, p = get_varint(data, p, ve)
            if p != ve or off != expect or size < 1:
                raise ValueError(f"partition ({off}, {size}) out of place")
            if first >= num_data_blocks or (firsts and first <= firsts[-1]) or (not firsts and first):
                raise ValueError(f"partition's first data block {first} out of order")
            expect = off + round_up_pages(size)
            offsets.append(off)
            sizes.append(size)
            firsts.append(first)
            nkeys.append(n)
        if expect != region_size:
            raise ValueError(f"partitions end at {expect}, region size is {region_size}")
        if not firsts:  # an empty table has no filter index (docs/format.md)
            raise ValueError("a filter index without partitions")
        if not all(map(operator.lt, keys, keys[1:])):
            raise ValueError("filter index keys out of order")
    except ValueError as exc:
        raise CorruptionError(f"filter index: {exc}", path=block.path,
                              offset=block.offset) from None
    return keys, offsets, sizes, crcs, firsts, nkeys



# errnos of a mapping refused for lack of resources, not because of the file
_NO_MAPPING_NOW = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})

UNCHECKED = 2
"""What ``may_match`` returns (truthy: "may match") when no filter answered: a damaged
partition, an unknown policy, a mapping the OS refused. Counted as a ``filter_error``, not a
positive, so a caller counting true positives must not count this probe (``is True``)."""


def _no_owner() -> None:
    return None


_DONTDUMP = getattr(mmap, "MADV_DONTDUMP", None)


def keep_apart(mm: mmap.mmap) -> None:
    """Keep the filter region's mapping a kernel mapping (VMA) of its own.

    The region starts at the page right after the data blocks (docs/format.md, "SSTable"), so
    when the OS places a table's data mapping directly below its filter mapping, the two are
    contiguous in the file and in memory, and Linux merges them into one VMA. Fault-around then
    works across the join: a read fault on the last data pages maps up to 16 pages around it
    that the page cache holds, filter pages included (measured: 32 KiB of an unprobed filter
    became resident after one data read), so filter memory grows past ``filter_memory_cap``
    without a probe and without the cap knowing. ``MADV_DONTDUMP`` sets a VMA flag the data
    mapping does not have, and VMAs with different flags never merge (it also keeps filter
    pages out of core dumps, where file-backed shared pages are not written by default
    anyway). Advice only: the filter reads right without it (other systems: no effect).
    """
    if _DONTDUMP is None:
        return
    try:
        mm.madvise(_DONTDUMP)
    except OSError:
        pass


class PartitionedFilter:
    """The filter of one table. See the module docstring for states, costs and threading."""

    def __init__(self, file: RandomAccessFile, index: Block, region_offset: int,
                 region_size: int, policy, num_data_blocks: int, owner=None, residency=None):
        (self.separators, self._offsets, self._sizes, self._crcs, self.first_blocks,
         self.num_keys) = decode_filter_index(index, region_size, num_data_blocks)
        self._n = n = len(self.separators)
        # Per partition, one past its last data block: partition p covers the data blocks
        # [first_blocks[p], block_ends[p]) (its separator is block_ends[p] - 1's index key).
        self.block_ends = self.first_blocks[1:] + [num_data_blocks]
        self._file = file
        self.region_offset = region_offset
        self.region_size = region_size
        self.index_bytes = len(index.data)
        self.policy = policy
        self._match = policy.may_match if policy is not None else None
        # Weak: the owner (a Table) holds this filter, and a strong reference back made every
        # closed table cyclic garbage, kept until a full collection (hours apart in a server:
        # bench/results/soak.md, "Session 9"). A probe runs inside an owner's method, so the
        # owner is alive whenever _probe_slow reports a fault.
        self._owner = weakref.ref(owner) if owner is not None else _no_owner
        self._residency = residency
        self.ref = bytearray(n)  # CLOCK reference bits, set on every probe
        self._state = bytearray(n)
        self._views: list = [None] * n
        self._mm: mmap.mmap | None = None
        self._mv: memoryview | None = None
        self.mapping_address: int | None = None  # start of the region's mapping, once mapped
        self._lock = threading.Lock()
        self._closed = False
        self.positives = 0
        self.negatives = 0
        self.true_positives = 0
        self.filter_errors = 0

    @property
    def num_partitions(self) -> int:
        return self._n

    @property
    def mapped_bytes(self) -> int:
        return self.region_size if self._mm is not None else 0

    def resident_bytes(self) -> int | None:
        """Bytes of the region present in this process's page tables (OS-measured, pagemap);
        0 while unmapped."""
        with self._lock:
            if self._mm is None:
                return 0
            return mapping_resident_bytes(self.mapping_address, self.region_size)

    def partition_bytes(self, p: int) -> int:
        """Bytes of the pages partition ``p`` occupies."""
        return round_up_pages(self._sizes[p])

    # -- probing -----------------------------------------------------------------------------
    def may_match(self, key: bytes) -> bool | int:
        """False only if ``key`` is certainly not in the table; True if the filter says it may
        be; :data:`UNCHECKED` (truthy) if no filter could answer. Hot path: no lock, no I/O
        once the partition is resident."""
        p = bisect_left(self.separators, key)
        if p == self._n:
            return False  # above the table's largest key
        return self.may_match_partition(p, key)

    def may_match_partition(self, p: int, key: bytes) -> bool | int:
        """:meth:`may_match` for a ``key`` whose partition ``p`` the caller found:
        ``bisect_left(separators, key)``, below :attr:`num_partitions` (Table.get, which
        then searches the index only over that partition's blocks). Same answers, same counts."""
        self.ref[p] = 1
        if self._state[p] == RESIDENT:
            if self._match(self._views[p], key):
                self.positives += 1
                return True
            self.negatives += 1
            return False
        return self._probe_slow(p, key)

    def _probe_slow(self, p: int, key: bytes) -> bool:
        if self._closed:
            raise ClosedError("table is closed")
        if self._match is None or self._state[p] == BAD:
            self.filter_errors += 1
            return UNCHECKED
        with self._lock:
            if self._closed:
                raise ClosedError("table is closed")
            if self._mm is None:
                try:
                    self._map_locked()
                except StorageIOError as exc:
                    if exc.errno not in _NO_MAPPING_NOW:
                        raise
                    # Out of descriptors or address space: answer "may match" (a read, never
                    # a false "absent"), as a damaged filter does; the next probe tries again.
                    self.filter_errors += 1
                    return UNCHECKED
            st = self._state[p]
            if st == UNTOUCHED:
                # Reading the partition for its CRC is what faults its pages in.
                ok = masked_crc(self._views[p]) == self._crcs[p]
                st = VERIFIED if ok else BAD
                if st == BAD:
                    self._state[p] = BAD
                    self._trim_around(p, keep=False)  # a bad partition never stays resident
            faulted = st == VERIFIED
            if faulted:
                self._touch(p)
                self._state[p] = st = RESIDENT
                self._trim_around(p, keep=True)
        if st == BAD:
            self.filter_errors += 1
            return UNCHECKED
        if faulted and self._residency is not None:
            self._residency.on_fault(self._owner(), p, self.partition_bytes(p))
        if self._match(self._views[p], key):
            self.positives += 1
            return True
        self.negatives += 1
        return False

    def _map_locked(self) -> None:
        mm = self._file.map(self.region_offset, self.region_size)
        mm.madvise(mmap.MADV_RANDOM)
        keep_apart(mm)
        mv = memoryview(mm)
        self._views = [mv[o : o + s] for o, s in zip(self._offsets, self._sizes)]
        self.mapping_address = mapping_address(mm)
        self._mm, self._mv = mm, mv

    def _touch(self, p: int) -> None:
        """Fault in partition ``p``'s pages (read one byte of each)."""
        view = self._views[p]
        for i in range(0, len(view), FILTER_PAGE_SIZE):
            view[i]

    def _trim_around(self, p: int, keep: bool) -> None:
        """Drop the pages that fault-around mapped around partition ``p``: those of every
        non-resident partition within FAULT_AROUND_BYTES of it (and ``p``'s own unless
        ``keep``). REQUIRES: the lock held, the region mapped."""
        off = self._offsets
        state = self._state
        lo = off[p] - FAULT_AROUND_BYTES
        hi = off[p] + round_up_pages(self._sizes[p]) + FAULT_AROUND_BYTES
        runs: list[list[int]] = []
        q = p - 1
        while q >= 0 and off[q] + round_up_pages(self._sizes[q]) > lo:
            q -= 1
        for q in range(q + 1, self._n):
            start = off[q]
            if start >= hi:
                break
            if (q == p and keep) or state[q] == RESIDENT:
                continue
            end = start + round_up_pages(self._sizes[q])
            if runs and runs[-1][1] == start:
                runs[-1][1] = end
            else:
                runs.append([start, end])
        mm = self._mm
        for start, end in runs:
            mm.madvise(mmap.MADV_DONTNEED, start, end - start)

    def release(self, p: int) -> int:
        """Drop partition ``p``'s pages (``madvise(DONTNEED)``); return the bytes released
        (0 if it was not resident). The next probe faults it back in from the file."""
        with self._lock:
            mm = self._mm
            if mm is None or self._state[p] != RESIDENT:
                return 0
            self._state[p] = VERIFIED
            nbytes = round_up_pages(self._sizes[p])
            mm.madvise(mmap.MADV_DONTNEED, self._offsets[p], nbytes)
            return nbytes

    # -- accounting --------------------------------------------------------------------------
    def partitions_touched(self) -> int:
        return self._n - self._state.count(UNTOUCHED)

    def partitions_resident(self) -> int:
        return self._state.count(RESIDENT)

    def close(self) -> None:
        """Unmap the region. Idempotent. REQUIRES: no probe in flight."""
        with self._lock:
            self._closed = True
            self._state = bytearray(self._n)  # sends any late probe to the slow path
            views, self._views = self._views, [None] * self._n
            for v in views:
                if v is not None:
                    v.release()
            if self._mv is not None:
                self._mv.release()
                self._mv = None
            if self._mm is not None:
                self._mm.close()
                self._mm = None
                self.mapping_address = None
