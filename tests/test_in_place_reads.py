"""In-place mapped reads (engine/sstable/reader.py, ``Table.get``; engine/sstable/block.py,
``find_hashed``): with ``verify_every_read=False`` a mapped get verifies a data block's
checksum on its first read and, once it passed, later gets read the entry they need from the
mapping without copying the block. The default (True) checks every read.

What must hold: the same answers as the copying path; a lookup inside a mapping never reads
past its own block (a damaged index entry is a CorruptionError, not a neighbour's bytes); a
block that failed its checksum is never read in place; the default keeps the per-read check;
a mapping closed under a read is ClosedError, not corruption.
"""

import mmap
import os
import random
import struct
from bisect import bisect_left

import pytest

from engine import DB
from engine.errors import ClosedError, CorruptionError
from engine.format import BLOCK_HASH_FLAG, KIND_DELETE, KIND_VALUE
from engine.sstable import Table, TableBuilder, TableOptions
from engine.sstable.block import find_hashed, find_whole
from engine.sstable.block_builder import BlockBuilder
from engine.vfs import FileSystem


def _block(rng, n, max_value=40):
    """A hash-indexed data block of up to ``n`` random keys (1-23 bytes) and values (shared
    with tests/test_partition_lookup.py and tests/test_review_session19.py)."""
    keys = sorted({rng.randbytes(rng.randrange(1, 24)) for _ in range(n)})
    b = BlockBuilder(1, hash_index=True)
    for k in keys:
        b.add(k, struct.pack("<Q", 7 << 8 | KIND_VALUE) + rng.randbytes(rng.randrange(max_value)))
    data = bytes(b.finish())
    assert struct.unpack_from("<I", data, len(data) - 4)[0] > BLOCK_HASH_FLAG
    return keys, data


@pytest.mark.parametrize("seed", range(6))
def test_find_hashed_inside_a_larger_buffer_answers_as_find_whole(seed):
    rng = random.Random(seed)
    keys, data = _block(rng, rng.randrange(1, 120))
    # Neighbours that hold every key of the block too: a lookup that strayed out of its block
    # would find them there.
    _, before = _block(random.Random(seed + 100), 50)
    pad = before + data[: rng.randrange(len(data))]
    buf = pad + data + data
    start, end = len(pad), len(pad) + len(data)
    absent = [k + b"\x00" for k in keys] + [rng.randbytes(9) for _ in range(50)]
    for k in keys + absent:
        want = find_whole(data, k)
        got = find_hashed(buf, start, end, k)
        if want is None:
            assert got is None
        else:
            assert got == (want[0] + start, want[1] + start)
            assert buf[got[0]:got[1]] == data[want[0]:want[1]]


def _hash_layout(data):
    """``(slots_start, slot_count, restart_count, restarts_start)`` of a hash-indexed block
    (docs/format.md "Data block hash index")."""
    n = len(data) - 4
    num = struct.unpack_from("<I", data, n)[0] - BLOCK_HASH_FLAG
    nb = struct.unpack_from("<H", data, n - 2)[0]
    return n - 2 - nb, nb, num, n - 2 - nb - 4 * num


def test_a_damaged_index_entry_never_reads_the_next_block():
    rng = random.Random(7)
    keys, data = _block(rng, 40)
    limit = _hash_layout(data)[3]
    # Point the first entry's restart offset at the block's end, where a copy of the block
    # follows with the same key at its start: only the bounds check stops a wrong answer.
    bad = bytearray(data)
    struct.pack_into("<I", bad, limit, len(data))
    buf = bytes(bad) + data
    with pytest.raises(CorruptionError) as ei:
        find_hashed(buf, 0, len(data), keys[0], "t.sst", 4096)
    assert (ei.value.path, ei.value.offset) == ("t.sst", 4096)
    for k in keys[1:]:  # the others: their own entry, or the error if their probe passes by
        try:
            got = find_hashed(buf, 0, len(data), k, "t.sst", 4096)
        except CorruptionError:
            continue
        want = find_whole(data, k)
        assert got == want and got[1] <= limit


def _table(path, n=3000, seed=3, deletes=True):
    rng = random.Random(seed)
    keys = sorted({rng.randbytes(16) for _ in range(n)})
    entries = [(k, i + 1, KIND_DELETE if deletes and i % 9 == 4 else KIND_VALUE,
                b"" if deletes and i % 9 == 4 else rng.randbytes(rng.randrange(120)))
               for i, k in enumerate(keys)]
    w = FileSystem().open_writable(path)
    b = TableBuilder(w, TableOptions())
    for e in entries:
        b.add(*e)
    b.finish()
    w.sync()
    w.close()
    return entries


def test_second_reads_of_a_block_are_in_place_and_answer_the_same(tmp_path):
    path = str(tmp_path / "t.sst")
    entries = _table(path)
    t = Table.open(FileSystem(), path, mmap_reads=True, verify_every_read=False)
    try:
        for rnd in range(2):
            for k, seq, kind, v in entries:
                assert t.get(k) == (seq, kind, v)
                assert t.get(k + b"\x01") is None
            if rnd == 0:  # every block was verified by the first round, and is read in place
                assert all(t._in_place)
        assert t._filter.true_positives == 2 * len(entries)
    finally:
        t.close()


def _flip(path, offset, mask=0x41):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ mask]))
        f.flush()
        os.fsync(f.fileno())


def test_a_block_that_failed_its_checksum_is_never_read_in_place(tmp_path):
    path = str(tmp_path / "t.sst")
    entries = _table(path, deletes=False)
    _flip(path, 100)
    t = Table.open(FileSystem(), path, mmap_reads=True, verify_every_read=False)
    try:
        k0 = entries[0][0]
        for _ in range(3):
            with pytest.raises(CorruptionError) as ei:
                t.get(k0)
            assert ei.value.offset == 0
        assert t._in_place[0] == 0
        assert t.get(entries[-1][0]) == entries[-1][1:]  # other blocks read fine
    finally:
        t.close()


def _value_byte_of(path, entries, i):
    """File offset of the first byte of entry ``i``'s value (found by its bytes)."""
    with open(path, "rb") as f:
        raw = f.read()
    k, seq, kind, v = entries[i]
    at = raw.index(k + struct.pack("<Q", seq << 8 | kind) + v)
    return at + len(k) + 8


@pytest.mark.parametrize("verify_every_read", [False, True], ids=["first-read", "every-read"])
def test_damage_after_the_first_read_is_caught_per_read_or_at_reopen(tmp_path,
                                                                     verify_every_read):
    path = str(tmp_path / "t.sst")
    entries = _table(path, deletes=False)
    i = next(j for j, e in enumerate(entries) if len(e[3]) > 8)
    t = Table.open(FileSystem(), path, mmap_reads=True, verify_every_read=verify_every_read)
    try:
        for _ in range(2):  # (the table's first get maps it and reads through _read_contents)
            assert t.get(entries[i][0]) == entries[i][1:]
        assert bool(any(t._in_place)) is not verify_every_read
        _flip(path, _value_byte_of(path, entries, i) + 3)  # inside the value: still well formed
        if verify_every_read:
            with pytest.raises(CorruptionError):
                t.get(entries[i][0])
    finally:
        t.close()
    t = Table.open(FileSystem(), path, mmap_reads=True, verify_every_read=False)
    try:  # a reopened table checks the block again on its first read
        with pytest.raises(CorruptionError):
            t.get(entries[i][0])
    finally:
        t.close()


def test_every_read_checks_the_bytes_against_the_checksum_first_read(tmp_path):
    """Since session 19 a mapped get with verify_every_read compares its copy's CRC with the
    one the block's trailer held at the block's first checked read (``Table._crc_of``),
    instead of reading and unmasking the trailer again: the bytes are still checked on every
    read. Damage to the contents is caught at once; damage to the trailer alone, after that
    first read, changes no answer (the contents are intact) and is caught by a reopened table."""
    path = str(tmp_path / "t.sst")
    entries = _table(path, deletes=False)
    i = next(j for j, e in enumerate(entries) if len(e[3]) > 8)
    t = Table.open(FileSystem(), path, mmap_reads=True, verify_every_read=True)
    try:
        for _ in range(2):
            assert t.get(entries[i][0]) == entries[i][1:]
        block = bisect_left(t._index_keys, entries[i][0])
        assert t._crc_of[block] >= 0 and list(t._crc_of).count(-1) == len(t._crc_of) - 1
        end = t._offsets[block] + t._sizes[block]
        _flip(path, end + 2)  # a byte of the trailer's stored CRC
        assert t.get(entries[i][0]) == entries[i][1:]
        at = _value_byte_of(path, entries, i) + 3
        _flip(path, at)  # and now the contents
        with pytest.raises(CorruptionError):
            t.get(entries[i][0])
        _flip(path, at)  # contents back: right again
        assert t.get(entries[i][0]) == entries[i][1:]
    finally:
        t.close()
    t = Table.open(FileSystem(), path, mmap_reads=True, verify_every_read=True)
    try:  # the damaged trailer: caught at the reopened table's first read of the block
        with pytest.raises(CorruptionError):
            t.get(entries[i][0])
    finally:
        t.close()


def test_a_mapping_closed_under_an_in_place_read_is_closed_error(tmp_path):
    path = str(tmp_path / "t.sst")
    entries = _table(path)
    t = Table.open(FileSystem(), path, mmap_reads=True, verify_every_read=False)
    try:
        k, seq, kind, v = entries[10]
        assert t.get(k) == (seq, kind, v)
        assert t.get(k) == (seq, kind, v)  # (the first get mapped the table; this one verified)
        assert any(t._in_place)
        # close() swaps the mapping out before closing it; a get that loaded it just before
        # sees a closed mapping. Simulate that moment: the table still holds the closed one.
        m = t._data_map
        assert isinstance(m, mmap.mmap)
        m.close()
        with pytest.raises(ClosedError):
            t.get(k)
    finally:
        t._data_map = None
        t.close()


def test_db_option_verify_every_read_reaches_the_tables(tmp_path):
    for every in (False, True):
        # compression off: b"v" * 50 compresses, and compressed blocks are read through the
        # block cache, never in place (tests/test_compression.py)
        with DB.open(str(tmp_path / f"db{every}"), verify_every_read=every, table_workers=0,
                     compression="none") as db:
            for j in range(500):
                db.put(b"k%05d" % j, b"v" * 50)
            db.flush()
            assert db.multi_get([b"k%05d" % j for j in range(500)]) == [b"v" * 50] * 500
            assert db.get(b"k00001") == b"v" * 50
            (t,) = db._rs.l0
            assert bool(any(t._in_place)) is not every
