"""A table's filter mapping stays a kernel mapping (VMA) of its own.

The filter region starts on the page right after the data blocks, so a data mapping the OS
happens to place directly below the filter mapping is contiguous with it in the file and in
memory; Linux then merged the two into one VMA, and a read fault on the last data pages mapped
filter pages no probe touched (fault-around), past the filter cap and unknown to it. CI saw it
as a filter-cap test whose smaps and pagemap figures disagreed about once in 30 runs
(engine/sstable/filter_reader.py ``keep_apart`` says how it is prevented).

The test places the data mapping itself (``MAP_FIXED_NOREPLACE`` right below the filter
mapping) so that the case the OS produces by chance happens every time.
"""

import ctypes
import mmap
import random
import sys

import pytest

from engine.format import FILTER_PAGE_SIZE, KIND_VALUE
from engine.sstable import Table, TableBuilder, TableOptions
from engine.sstable.residency import mapping_resident_bytes, resident_bytes
from engine.vfs import FileSystem

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux VMAs")

PAGE = FILTER_PAGE_SIZE
MAP_FIXED_NOREPLACE = 0x100000  # linux/mman.h (kernel 4.17+)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_FAILED = ctypes.c_void_p(-1).value


def _write_table(path: str) -> list[bytes]:
    rng = random.Random(5)
    keys = sorted({rng.randbytes(16) for _ in range(3000)})
    fs = FileSystem()
    w = fs.open_writable(path)
    b = TableBuilder(w, TableOptions(block_size=1024, blocks_per_partition=1))
    for i, k in enumerate(keys):
        b.add(k, i, KIND_VALUE, rng.randbytes(60))
    b.finish()
    w.sync()
    w.close()
    return keys  # freshly written: every page is in the page cache (fault-around's worst case)


def _vma_flags(address: int) -> list[str]:
    """VmFlags of the smaps entry that starts at ``address`` ([] if none starts there)."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split(None, 1)[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                inside = int(head.split("-")[0], 16) == address
            elif inside and line.startswith("VmFlags:"):
                return line.split()[1:]
    return []


def _map_data_below(t: Table) -> tuple[int, int] | None:
    """Map the table's data pages ``[0, region_offset)`` directly below its filter mapping, as
    the table's own data mapping (read-only, shared, MADV_RANDOM); None if that spot is taken."""
    f = t._filter
    length = f.region_offset
    # Through the table's own descriptor, as its data mapping is made: Linux merges only
    # mappings of the same open file (a second open() of the path would never merge).
    fd = t._file._enter()
    try:
        addr = _libc.mmap(t.residency_key - length, length, mmap.PROT_READ,
                          mmap.MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0)
    finally:
        t._file._leave()
    if addr in (None, _FAILED):
        return None
    if addr != t.residency_key - length:  # a kernel without NOREPLACE took it as a hint
        _libc.munmap(addr, length)
        return None
    _libc.madvise(addr, length, mmap.MADV_RANDOM)
    return addr, length


def test_a_data_mapping_right_below_the_filter_neither_merges_nor_maps_filter_pages(tmp_path):
    path = str(tmp_path / "t.sst")
    keys = _write_table(path)
    fs = FileSystem()
    for _attempt in range(20):  # the spot below a fresh mapping is almost always free
        t = Table.open(fs, path)
        assert t.get(keys[0]) is not None  # a probe: the filter region is mapped, one partition in
        below = _map_data_below(t)
        if below is not None:
            break
        t.close()
    else:
        pytest.fail("could not place a mapping right below the filter mapping in 20 tries")
    addr, length = below
    try:
        start = t.residency_key
        # One VMA of its own, with the flag that keeps it apart ("dd": MADV_DONTDUMP).
        assert resident_bytes([start])[start] is not None, "the filter mapping was merged"
        assert "dd" in _vma_flags(start)
        stats = t.filter_stats()
        assert stats["partitions_resident"] == 1 and stats["resident_bytes"] == PAGE
        # Read every data page through the mapping below: fault-around stays on its side.
        for off in range(0, length, PAGE):
            ctypes.c_char.from_address(addr + off).value
        assert mapping_resident_bytes(addr, length) > 0
        assert t.filter_stats()["resident_bytes"] == PAGE
        assert resident_bytes([start])[start] == PAGE  # smaps agrees with pagemap
    finally:
        _libc.munmap(addr, length)
        t.close()


def test_smaps_by_address_says_unknown_inside_a_larger_mapping():
    """An address inside a mapping that does not start there (a merged VMA) has no Rss of its
    own in smaps: None, not 0 (which would read as "nothing resident")."""
    m = mmap.mmap(-1, 4 * PAGE)
    try:
        m[:] = b"x" * (4 * PAGE)
        base = ctypes.addressof(ctypes.c_char.from_buffer(m))
        got = resident_bytes([base, base + PAGE])
        assert got[base] == 4 * PAGE
        assert got[base + PAGE] is None
    finally:
        m.close()
