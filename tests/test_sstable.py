"""Table round trips: TableBuilder writes, Table reads back (engine/sstable/)."""

import os
import random

import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

from engine.block_cache import BlockCache
from engine.errors import ClosedError, InvalidArgumentError
from engine.format import FILTER_PAGE_SIZE, KIND_DELETE, KIND_VALUE
from engine.sstable import Table, TableBuilder, TableOptions
from engine.vfs import FileSystem

POLICIES = ["blocked-bloom", "bloom", None]


def write_table(fs, path, entries, **opts):
    """entries: sorted list of (key, seq, kind, value). Returns the builder's properties."""
    w = fs.open_writable(path)
    b = TableBuilder(w, TableOptions(**opts))
    for e in entries:
        b.add(*e)
    assert b.num_entries == len(entries)
    props = b.finish()
    w.sync()
    w.close()
    assert props.num_entries == len(entries)
    return props


def random_entries(rng, n, key_len=16, value_len=100, tombstone_every=7):
    keys = sorted({rng.randbytes(key_len) for _ in range(n)})
    out = []
    for i, k in enumerate(keys):
        if i % tombstone_every == 3:
            out.append((k, 1000 + i, KIND_DELETE, b""))
        else:
            out.append((k, 1000 + i, KIND_VALUE, rng.randbytes(rng.randrange(value_len + 1))))
    return out


def check_table(t, entries, rng, absent_probes=200):
    for k, seq, kind, value in entries:
        assert t.get(k) == (seq, kind, value)
    present = {e[0] for e in entries}
    for _ in range(absent_probes):
        k = rng.randbytes(rng.randrange(1, 20))
        if k not in present:
            assert t.get(k) is None
    assert list(t.iterate()) == entries
    keys = [e[0] for e in entries] or [b"k"]
    for start in [b"", b"\x00", b"\xff" * 20] + [rng.choice(keys) for _ in range(5)] + \
            [rng.choice(keys) + b"\x00" for _ in range(5)]:
        expect = [e for e in entries if e[0] >= start]
        got = list(t.iterate(start))
        assert got == expect


@pytest.fixture
def fs():
    return FileSystem()


@pytest.mark.parametrize("policy", POLICIES)
def test_round_trip_many_entries(tmp_path, fs, policy):
    rng = random.Random(1)
    entries = random_entries(rng, 3000)
    path = str(tmp_path / "t.sst")
    props = write_table(fs, path, entries, filter_policy=policy, block_size=1024)
    assert props.num_data_blocks > 50
    assert props.num_tombstones == sum(1 for e in entries if e[2] == KIND_DELETE)
    assert (props.smallest_key, props.largest_key) == (entries[0][0], entries[-1][0])
    assert (props.smallest_seq, props.largest_seq) == (1000, 1000 + len(entries) - 1)
    assert props.data_bytes <= os.path.getsize(path)
    with Table.open(fs, path, file_number=7, block_cache=BlockCache(1 << 20)) as t:
        assert t.properties == props
        assert (t.smallest, t.largest, t.file_number) == (entries[0][0], entries[-1][0], 7)
        assert t.file_size == os.path.getsize(path)
        check_table(t, entries, rng)


@pytest.mark.parametrize("policy", POLICIES)
def test_absent_keys_below_between_and_above(tmp_path, fs, policy):
    entries = [(b"b%04d" % i, i, KIND_VALUE, b"v%d" % i) for i in range(0, 2000, 2)]
    path = str(tmp_path / "t.sst")
    write_table(fs, path, entries, filter_policy=policy, block_size=256)
    with Table.open(fs, path) as t:
        assert t.get(b"a") is None and t.get(b"") is None and t.get(b"b") is None
        assert t.get(b"b9999") is None and t.get(b"c") is None and t.get(b"\xff") is None
        for i in range(1, 2000, 2):
            assert t.get(b"b%04d" % i) is None
            assert t.get(b"b%04d\x00" % (i - 1)) is None
        assert not t.may_match(b"a") and not t.may_match(b"c")


def test_single_entry_empty_value_tombstone_and_large_values(tmp_path, fs):
    path = str(tmp_path / "one.sst")
    write_table(fs, path, [(b"k", 5, KIND_DELETE, b"")])
    with Table.open(fs, path) as t:
        assert t.get(b"k") == (5, KIND_DELETE, b"")
        assert t.get(b"j") is None and t.get(b"l") is None
        assert list(t.iterate()) == [(b"k", 5, KIND_DELETE, b"")]
    rng = random.Random(2)
    big = rng.randbytes(1 << 20)
    entries = [(b"a", 1, KIND_VALUE, b""), (b"b", 2, KIND_VALUE, big),
               (b"c", 3, KIND_VALUE, b"x" * 5000), (b"d", 2**56 - 1, KIND_VALUE, b"")]
    path = str(tmp_path / "big.sst")
    props = write_table(fs, path, entries)
    assert props.num_data_blocks >= 3
    with Table.open(fs, path) as t:
        for e in entries:
            assert t.get(e[0]) == e[1:]
        assert list(t.iterate(b"b")) == entries[1:]


def test_empty_table(tmp_path, fs):
    path = str(tmp_path / "empty.sst")
    props = write_table(fs, path, [])
    assert props.num_data_blocks == 0 and props.num_filter_partitions == 0
    with Table.open(fs, path) as t:
        assert t.get(b"") is None and t.get(b"x") is None
        assert list(t.iterate()) == [] and not t.may_match(b"x")
        assert t.filter_stats()["partitions"] == 0


def test_empty_key_is_a_key(tmp_path, fs):
    path = str(tmp_path / "t.sst")
    entries = [(b"", 1, KIND_VALUE, b"empty"), (b"\x00", 2, KIND_VALUE, b"zero")]
    write_table(fs, path, entries)
    with Table.open(fs, path) as t:
        assert t.get(b"") == (1, KIND_VALUE, b"empty")
        assert t.get(b"\x00") == (2, KIND_VALUE, b"zero")
        assert list(t.iterate()) == entries


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.binary(max_size=12), st.tuples(st.integers(0, 2**56 - 1),
                                                         st.sampled_from([0, 1]),
                                                         st.binary(max_size=64)),
                       max_size=150),
       st.integers(64, 600), st.integers(1, 8), st.sampled_from(POLICIES))
def test_hypothesis_round_trip(tmp_path, fs, d, block_size, restart_interval, policy):
    entries = [(k, s, kind, v if kind else b"") for k, (s, kind, v) in sorted(d.items())]
    path = str(tmp_path / "h.sst")
    write_table(fs, path, entries, block_size=block_size, restart_interval=restart_interval,
                filter_policy=policy, blocks_per_partition=2)
    with Table.open(fs, path) as t:
        check_table(t, entries, random.Random(len(entries)), absent_probes=30)


@pytest.mark.parametrize("cache", [False, True])
def test_interval_one_tables_with_short_and_long_keys_and_values(tmp_path, fs, cache):
    """Restart interval 1 (Block.get_whole): one-byte headers and 128+ byte keys or values
    (multi-byte varints) in the same blocks, present and absent keys, cached or not."""
    rng = random.Random(17)
    keys = sorted({rng.randbytes(rng.choice([4, 16, 127, 128, 200])) for _ in range(600)})
    entries = [(k, i + 1, KIND_VALUE, rng.randbytes(rng.choice([0, 50, 119, 120, 300])))
               for i, k in enumerate(keys)]
    path = str(tmp_path / "one.sst")
    props = write_table(fs, path, entries, restart_interval=1)
    assert props.restart_interval == 1
    by_key = {e[0]: e[1:] for e in entries}
    bc = BlockCache(1 << 20) if cache else None
    with Table.open(fs, path, block_cache=bc) as t:
        for _ in range(2):  # second round from the cache when there is one
            check_table(t, entries, random.Random(3))
            for k, *_ in entries[::5]:
                for near in (k + b"\x00", k[:-1]):
                    assert t.get(near) == by_key.get(near)
        if cache:
            assert bc.hits > 0


def test_builder_rejects_bad_input(tmp_path, fs):
    b = TableBuilder(fs.open_writable(str(tmp_path / "t.sst")), TableOptions())
    b.add(b"b", 1, KIND_VALUE, b"")
    for args in [(b"b", 2, KIND_VALUE, b""), (b"a", 2, KIND_VALUE, b""),
                 (b"c", 2, 7, b""), (b"c", -1, KIND_VALUE, b""), (b"c", 2**56, KIND_VALUE, b"")]:
        with pytest.raises(InvalidArgumentError):
            b.add(*args)
    b.add(b"c", 2, KIND_VALUE, b"")
    assert b.num_entries == 2 and b.estimated_file_size() > 0
    b.finish()
    with pytest.raises(InvalidArgumentError):
        b.add(b"d", 3, KIND_VALUE, b"")
    with pytest.raises(InvalidArgumentError):
        b.finish()
    w = fs.open_writable(str(tmp_path / "u.sst"))
    w.append(b"x")
    with pytest.raises(InvalidArgumentError):
        TableBuilder(w, TableOptions())
    with pytest.raises(InvalidArgumentError):
        TableBuilder(fs.open_writable(str(tmp_path / "v.sst")),
                     TableOptions(filter_policy="no-such-filter"))


def test_abandon_leaves_no_usable_builder(tmp_path, fs):
    b = TableBuilder(fs.open_writable(str(tmp_path / "t.sst")), TableOptions())
    b.add(b"a", 1, KIND_VALUE, b"1")
    b.abandon()
    with pytest.raises(InvalidArgumentError):
        b.add(b"b", 1, KIND_VALUE, b"")


def test_estimated_file_size_tracks_the_real_size(tmp_path, fs):
    rng = random.Random(3)
    entries = random_entries(rng, 4000)
    w = fs.open_writable(str(tmp_path / "t.sst"))
    b = TableBuilder(w, TableOptions())
    for e in entries:
        b.add(*e)
    est = b.estimated_file_size()
    b.finish()
    assert 0.8 * w.size <= est <= 1.2 * w.size


def test_block_cache_serves_repeated_reads(tmp_path, fs):
    rng = random.Random(4)
    entries = random_entries(rng, 500)
    path = str(tmp_path / "t.sst")
    write_table(fs, path, entries)
    cache = BlockCache(1 << 20)
    t1 = Table.open(fs, path, file_number=1, block_cache=cache)
    t2 = Table.open(fs, path, block_cache=cache)  # no file number: must not share t1's keys
    k = entries[10]
    assert t1.get(k[0]) == k[1:]
    assert (t1.data_blocks_read, t1.data_block_file_reads) == (1, 1)
    assert t1.get(k[0]) == k[1:]
    assert (t1.data_blocks_read, t1.data_block_file_reads) == (2, 1)
    assert cache.hits == 1
    assert t2.get(k[0]) == k[1:] and t2.data_block_file_reads == 1
    list(t1.iterate())
    assert t1.data_block_file_reads == t1.properties.num_data_blocks
    t1.close()
    t2.close()


def test_calls_after_close_raise_closed_error(tmp_path, fs):
    entries = random_entries(random.Random(5), 300)
    path = str(tmp_path / "t.sst")
    write_table(fs, path, entries)
    t = Table.open(fs, path)
    assert t.get(entries[0][0]) is not None
    t.close()
    t.close()
    with pytest.raises(ClosedError):
        t.get(entries[1][0])
    with pytest.raises(ClosedError):
        list(t.iterate())


def test_filter_partitions_sit_on_whole_pages(tmp_path, fs):
    rng = random.Random(6)
    entries = random_entries(rng, 20000, value_len=20)
    path = str(tmp_path / "t.sst")
    props = write_table(fs, path, entries, bits_per_key=10.0)
    region = -(-props.data_bytes // FILTER_PAGE_SIZE) * FILTER_PAGE_SIZE
    assert props.num_filter_partitions > 3
    assert props.filter_bytes % FILTER_PAGE_SIZE == 0
    assert props.filter_bytes == props.num_filter_partitions * FILTER_PAGE_SIZE  # one page each
    assert 10.0 <= props.effective_bits_per_key < 13.0
    with open(path, "rb") as f:
        f.seek(props.data_bytes)
        assert f.read(region - props.data_bytes) == bytes(region - props.data_bytes)
    with Table.open(fs, path) as t:
        f = t._filter
        assert all(o % FILTER_PAGE_SIZE == 0 for o in f._offsets)
        assert all(0 < s <= FILTER_PAGE_SIZE for s in f._sizes)
        assert f.region_offset == region
        assert sum(f.num_keys) == len(entries)


def test_format_version_1_tables_still_read(tmp_path, fs):
    """A table without hash indexes is written as format version 1 (readable by format-1
    readers) and reads as before; the default writes version 2 with the index in every data
    block; an unknown version is corruption."""
    import struct

    from engine.checksum import masked_crc
    from engine.format import BLOCK_HASH_FLAG, TABLE_FOOTER_SIZE
    from engine.sstable.block import Block

    rng = random.Random(42)
    entries = random_entries(rng, 3000)
    v2 = str(tmp_path / "v2.sst")
    write_table(fs, v2, entries)
    v1 = str(tmp_path / "v1.sst")
    write_table(fs, v1, entries, data_block_hash_index=False)
    raw = bytearray(open(v1, "rb").read())
    foot = len(raw) - TABLE_FOOTER_SIZE
    assert struct.unpack_from("<I", raw, foot + 32)[0] == 1
    raw2 = open(v2, "rb").read()
    assert struct.unpack_from("<I", raw2, len(raw2) - TABLE_FOOTER_SIZE + 32)[0] == 2
    for path, hashed in ((v1, False), (v2, True)):
        for mmap_reads in (False, True):
            with Table.open(fs, path, mmap_reads=mmap_reads) as t:
                check_table(t, entries, rng)
                first = t._read_contents(0, False)
                assert bool(struct.unpack_from("<I", first, len(first) - 4)[0]
                            & BLOCK_HASH_FLAG) == hashed
                assert list(t.iterate()) == [tuple(e) for e in entries]
                assert t.properties.format_version == (2 if hashed else 1)
    struct.pack_into("<I", raw, foot + 32, 4)  # 3 is block compression (test_compression.py)
    struct.pack_into("<I", raw, foot + 36, masked_crc(bytes(raw[foot:foot + 36])))
    open(v1, "wb").write(raw)
    from engine.errors import CorruptionError
    with pytest.raises(CorruptionError, match="unsupported table format version 4"):
        Table.open(fs, v1)


def test_an_open_table_takes_well_under_200_bytes_per_data_block(tmp_path, fs):
    """What an open table keeps per data block (its last key, offset and size) is what a shard
    holds in memory for every block of its data (deploy/README.md, "Memory"): a 16-byte key's
    bytes object and flat offset and size arrays. Traced here with the table's fixed costs
    (filter index, properties): ~108 bytes per block; ~212 before session 13 (two int objects
    and a block cache key per block, and their list slots)."""
    import tracemalloc

    rng = random.Random(13)
    entries = [(k, 1 + i, KIND_VALUE, rng.randbytes(100))
               for i, k in enumerate(sorted({rng.randbytes(16) for _ in range(100_000)}))]
    path = str(tmp_path / "t.sst")
    write_table(fs, path, entries, block_size=4096)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        t = Table.open(fs, path)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    try:
        blocks = t.properties.num_data_blocks
        assert blocks > 3000
        assert grown / blocks < 160, f"{grown / blocks:.0f} bytes per data block"
        assert t.get(entries[54321][0]) == entries[54321][1:]
    finally:
        t.close()
