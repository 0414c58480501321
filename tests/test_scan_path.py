"""The scan path (session 15): data blocks decoded a list at a time
(engine/sstable/block.py ``restart_entries``), ``Table.blocks`` lists growing from a few
entries to whole blocks, chained through levels (``concat_tables``) and the memtable's chunks,
merged by ``merge_newest``. Scans must read exactly as before: order, newest wins, tombstones
hidden, end exclusive, limit, ClosedError once the DB closes, CorruptionError naming the file
for a damaged block (checksum or, under a valid checksum, a malformed entry)."""

import itertools
import os
import random

import pytest
from hypothesis import given, settings, strategies as st

from engine import DB
from engine.block_cache import BlockCache
from engine.errors import ClosedError, CorruptionError
from engine.format import (BLOCK_TRAILER_SIZE, BLOCK_TYPE_DATA, ENTRY_TAG, KIND_DELETE,
                           KIND_VALUE)
from engine.iterators import concat_tables, merge_newest
from engine.sstable import Table, TableBuilder, TableOptions
from engine.sstable.block import (Block, block_layout, restart_entries, seek_restart)
from engine.sstable.block_builder import BlockBuilder
from engine.sstable.handle import seal
from engine.sstable.reader import SCAN_FIRST_RESTARTS
from engine.vfs import FileSystem


def _tagged(seq, kind, value):
    return ENTRY_TAG.pack(seq << 8 | kind) + value


# -- one block -------------------------------------------------------------------------------
block_entries = st.dictionaries(
    st.binary(max_size=20),
    st.tuples(st.integers(0, 2**56 - 1), st.sampled_from([KIND_VALUE, KIND_DELETE]),
              st.binary(max_size=200)),
    max_size=70).map(lambda d: sorted((k, s, kind, v) for k, (s, kind, v) in d.items()))


@settings(max_examples=200, deadline=None)
@given(block_entries, st.integers(1, 20), st.booleans(), st.binary(max_size=20),
       st.integers(1, 9))
def test_restart_entries_in_any_chunks_read_the_block(entries, interval, hash_index, start,
                                                      step):
    """Chunks of ``step`` restart intervals from the seek's restart point, concatenated, are
    the block's entries >= start, whatever the interval, hash index, key and value sizes
    (values of 120+ bytes take multi-byte varint headers)."""
    b = BlockBuilder(interval, hash_index)
    for k, seq, kind, v in entries:
        b.add(k, _tagged(seq, kind, v))
    data = b.finish()
    limit, num = block_layout(data, "mem", 0)
    assert [e for e in restart_entries(data, limit, num, 0, num)] == entries
    for s in (start, None):
        r = seek_restart(data, limit, num, s)
        got = []
        first = True
        while r < num:
            got += restart_entries(data, limit, num, r, r + step, s if first else None)
            first = False
            r += step
        assert got == [e for e in entries if s is None or e[0] >= s]


def _block(entries, interval=1):
    b = BlockBuilder(interval, False)
    for k, seq, kind, v in entries:
        b.add(k, _tagged(seq, kind, v))
    return b.finish()


@pytest.mark.parametrize("what", ["kind", "short value", "restart inside an entry",
                                  "restart past the entries", "entry past the entries"])
def test_a_malformed_entry_under_a_valid_checksum_is_corruption(what):
    """What a writer never makes (possible only under a valid checksum, so fabricated) is a
    CorruptionError naming the file and block, never IndexError or a wrong entry."""
    entries = [(b"k%02d" % i, i + 1, KIND_VALUE, b"v%d" % i) for i in range(12)]
    data = bytearray(_block(entries))
    limit, num = block_layout(bytes(data))
    restart = lambda i: int.from_bytes(data[limit + 4 * i: limit + 4 * i + 4], "little")
    p = restart(5)  # entry 5: shared 0, key 3 bytes, value 8 + 2 bytes
    if what == "kind":
        data[p + 3 + 3] = 7  # the low byte of the tag is the kind
    elif what == "short value":
        data[p + 2] = 5  # value length 5 < the 8-byte tag (the entry now ends early)
    elif what == "restart inside an entry":  # restart 4 ends the first chunk of 4
        data[limit + 16: limit + 20] = (restart(4) + 1).to_bytes(4, "little")
    elif what == "restart past the entries":
        data[limit + 16: limit + 20] = (limit + 3).to_bytes(4, "little")
    else:
        data[p + 2] = 0x7F  # the value runs past the entries
    data = bytes(data)
    with pytest.raises(CorruptionError) as e:
        r = 0
        while r < num:
            restart_entries(data, limit, num, r, r + 4, None, "f.sst", 4096)
            r += 4
    assert e.value.path == "f.sst" and e.value.offset == 4096


# -- one table -------------------------------------------------------------------------------
def _write(path, entries, **opts):
    fs = FileSystem()
    w = fs.open_writable(path)
    b = TableBuilder(w, TableOptions(**opts))
    for e in entries:
        b.add(*e)
    props = b.finish()
    w.close()
    return props


def _entries(rng, n):
    keys = sorted({rng.randbytes(rng.randrange(1, 14)) for _ in range(n)})
    return [(k, 10 + i, KIND_DELETE if i % 5 == 2 else KIND_VALUE,
             b"" if i % 5 == 2 else rng.randbytes(rng.randrange(150))) for i, k in enumerate(keys)]


@pytest.mark.parametrize("interval", [1, 3])
def test_table_blocks_grow_from_a_few_entries_and_read_like_the_table(tmp_path, interval):
    rng = random.Random(interval)
    entries = _entries(rng, 600)
    path = str(tmp_path / "t.sst")
    props = _write(path, entries, block_size=512, restart_interval=interval)
    assert props.num_data_blocks > 20
    cache = BlockCache(1 << 20)
    with Table.open(FileSystem(), path, block_cache=cache) as t:
        keys = [e[0] for e in entries]
        for start in [None, b"", b"\xff" * 15] + rng.sample(keys, 30) + [
                k + b"\x00" for k in rng.sample(keys, 30)]:
            want = [e for e in entries if start is None or e[0] >= start]
            lists = list(t.blocks(start))
            assert [e for part in lists for e in part] == want
            assert list(t.iterate(start)) == want
            if want:
                # a seek decodes a few entries first (at most one restart interval of them
                # before start), not its whole block
                assert len(lists[0]) <= SCAN_FIRST_RESTARTS * interval
    # fill_cache=False (compaction) reads through the cache but inserts nothing
    cache2 = BlockCache(1 << 20)
    with Table.open(FileSystem(), path, block_cache=cache2) as t:
        assert list(t.iterate(None, fill_cache=False)) == entries
        assert len(cache2) == 0
        assert list(t.iterate()) == entries
        assert len(cache2) == props.num_data_blocks
        assert list(t.iterate(keys[100])) == entries[100:]  # from the cache now


def test_a_level_chains_its_tables_from_the_start_key(tmp_path):
    rng = random.Random(3)
    entries = _entries(rng, 900)
    tables = []
    for j, part in enumerate((entries[:300], entries[300:301], entries[301:])):
        path = str(tmp_path / f"{j}.sst")
        _write(path, part, block_size=400)
        tables.append(Table.open(FileSystem(), path))
    try:
        for start in [None, entries[0][0], entries[299][0], entries[300][0],
                      entries[300][0] + b"\x00", entries[-1][0]]:
            i = 0 if start is None else next(n for n, e in enumerate(entries) if e[0] >= start)
            first = 0 if start is None else next(
                n for n, t in enumerate(tables) if t.largest >= start)
            assert list(concat_tables(tables[first:], start)) == entries[i:]
    finally:
        for t in tables:
            t.close()


def test_merge_newest_passes_one_source_through_and_merges_several():
    a = [(b"a", 5, KIND_VALUE, b"A5"), (b"c", 1, KIND_VALUE, b"C1")]
    b = [(b"a", 3, KIND_VALUE, b"A3"), (b"b", 4, KIND_DELETE, b""), (b"c", 9, KIND_VALUE, b"C9")]
    assert list(merge_newest([iter(()), iter(a), iter(())])) == a
    assert list(merge_newest([])) == []
    assert list(merge_newest([iter(a), iter(b)])) == [a[0], b[1], b[2]]


# -- the DB ----------------------------------------------------------------------------------
OPTS = dict(memtable_bytes=16384, target_file_size=4096, max_bytes_for_level_base=16384,
            block_size=256, l0_compaction_trigger=3, l0_slowdown_trigger=6, l0_stop_trigger=8,
            slowdown_sleep_s=0.0, block_cache_bytes=8192, table_workers=0)


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_scans_across_blocks_tables_levels_and_memtable_match_a_model(tmp_path, compression):
    """Overwrites and tombstones spread over the memtable, L0 and deeper levels: every scan
    (start, end, limit; islice seeks) reads what a dict says, with several sources merged."""
    rng = random.Random(15)
    model = {}

    def ops(n):
        for i in range(n):
            k = b"k%05d" % rng.randrange(2500)
            if rng.random() < 0.25:
                db.delete(k)
                model.pop(k, None)
            else:
                v = rng.randbytes(rng.randrange(0, 40)) + b"%d" % i
                db.put(k, v)
                model[k] = v

    path = str(tmp_path / "db")
    with DB.open(path, compression=compression, **OPTS) as db:
        ops(6000)  # flushes and compactions fill L1 and L2
        assert db.wait_for_compactions(timeout=120)
    with DB.open(path, compression=compression, disable_auto_compactions=True, **OPTS) as db:
        ops(40)
        db.flush()  # an L0 table
        ops(40)  # and the memtable (40 entries take < 16 KiB)
        rs = db._rs
        assert len(rs.mem) > 0 and rs.l0 and len(rs.levels) >= 2, (
            len(rs.mem), len(rs.l0), len(rs.levels))
        want = sorted(model.items())
        keys = [k for k, _ in want]
        assert list(db.scan()) == want
        for _ in range(300):
            a = b"k%05d" % rng.randrange(2600) + rng.choice([b"", b"\x00"])
            b = b"k%05d" % rng.randrange(2600) if rng.random() < 0.7 else None
            limit = rng.choice([None, 0, 1, 2, 5, 37, 400])
            expect = [(k, v) for k, v in want if k >= a and (b is None or k < b)]
            if limit is not None:
                expect = expect[:limit]
            assert list(db.scan(a, b, limit)) == expect, (a, b, limit)
            n = rng.choice([1, 3, 100])
            i = next((j for j, k in enumerate(keys) if k >= a), len(keys))
            assert list(itertools.islice(db.scan(start=a), n)) == want[i:i + n]


def test_a_scan_raises_closed_error_at_the_next_entry_after_close(tmp_path):
    """Entries already decoded (the rest of a block's list) are not returned after close."""
    db = DB.open(str(tmp_path / "db"), **OPTS)
    for i in range(3000):
        db.put(b"k%05d" % i, b"v" * 20)
    db.flush()
    for i in range(0, 3000, 50):
        db.put(b"k%05d" % i, b"new")  # and a memtable source beside the tables
    it = db.scan()
    assert next(it) == (b"k00000", b"new")
    assert next(it) == (b"k00001", b"v" * 20)
    db.close()
    with pytest.raises(ClosedError):
        next(it)
    with pytest.raises(ClosedError):
        db.scan()


def _data_block_spans(path):
    with Table.open(FileSystem(), path) as t:
        return [(t._offsets[i], t._sizes[i]) for i in range(t._nblocks)]


def _only_table(db_path):
    return [os.path.join(db_path, f) for f in sorted(os.listdir(db_path)) if f.endswith(".sst")]


@pytest.mark.parametrize("damage", ["flipped byte", "malformed under a valid checksum"])
def test_a_scan_over_a_damaged_block_raises_corruption_naming_the_file(tmp_path, damage):
    path = str(tmp_path / "db")
    opts = dict(OPTS, compression="none", block_cache_bytes=0, target_file_size=1 << 20)
    with DB.open(path, **opts) as db:
        for i in range(400):
            db.put(b"k%04d" % i, b"v%04d" % i)
        db.compact()
    (sst,) = _only_table(path)
    spans = _data_block_spans(sst)
    assert len(spans) > 6
    off, size = spans[5]
    raw = bytearray(open(sst, "rb").read())
    contents = bytes(raw[off:off + size])
    if damage == "flipped byte":
        raw[off + 10] ^= 0x40
    else:  # the first entry's kind byte set to 9, and the trailer's checksum made to match
        limit, _ = block_layout(contents)
        kl = contents[1]
        bad = bytearray(contents)
        bad[3 + kl] = 9
        raw[off:off + size + BLOCK_TRAILER_SIZE] = seal(bytes(bad), BLOCK_TYPE_DATA)
    open(sst, "wb").write(bytes(raw))
    with DB.open(path, **opts) as db:
        first_bad = next(Block(contents).entries())[0]  # block 5's first key
        block4 = raw[spans[4][0]:spans[4][0] + spans[4][1]]
        end = next(Block(bytes(block4)).entries())[0]
        assert db.get(b"k0000") == b"v0000"
        assert list(db.scan(None, end)) == [(b"k%04d" % i, b"v%04d" % i)
                                            for i in range(int(end[1:]))]  # stops in block 4
        for start in (None, first_bad, b"k0001"):
            with pytest.raises(CorruptionError) as e:
                list(db.scan(start))
            assert e.value.path == sst and e.value.offset == off
