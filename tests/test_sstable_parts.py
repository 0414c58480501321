"""Footer, properties, index block and options of the SSTable (engine/sstable/)."""

import pytest
from hypothesis import given, strategies as st

from engine.errors import CorruptionError, InvalidArgumentError
from engine.format import TABLE_FOOTER_SIZE
from engine.sstable import TableOptions, TableProperties
from engine.sstable.block import Block
from engine.sstable.block_builder import BlockBuilder
from engine.sstable.footer import Footer
from engine.sstable.handle import BlockHandle
from engine.sstable.index import decode_index, shortest_separator
from engine.sstable.properties import decode_properties, encode_properties


# -- footer ----------------------------------------------------------------------------------
def test_footer_round_trip_and_every_flipped_byte_is_caught():
    f = Footer(BlockHandle(5000, 40), BlockHandle(4000, 900), 3000)
    raw = f.encode()
    assert len(raw) == TABLE_FOOTER_SIZE
    assert Footer.decode(raw, 6000, "t") == f
    for i in range(len(raw)):
        bad = bytearray(raw)
        bad[i] ^= 0x01
        with pytest.raises(CorruptionError) as info:
            Footer.decode(bytes(bad), 6000, "t")
        assert info.value.path == "t" and info.value.offset == 6000 - TABLE_FOOTER_SIZE


def test_footer_rejects_handles_outside_the_tail_and_short_files():
    with pytest.raises(CorruptionError, match="outside"):
        Footer.decode(Footer(BlockHandle(10, 40), BlockHandle(100, 9), 50).encode(), 400, "t")
    with pytest.raises(CorruptionError, match="outside"):
        Footer.decode(Footer(BlockHandle(100, 400), BlockHandle(60, 9), 50).encode(), 400, "t")
    with pytest.raises(CorruptionError, match="too short"):
        Footer.decode(b"x" * 10, 10, "t")


# -- properties ------------------------------------------------------------------------------
def test_properties_round_trip():
    p = TableProperties(num_entries=12, num_tombstones=3, smallest_key=b"\x00a",
                        largest_key=b"\xffz", smallest_seq=1, largest_seq=2**56 - 1,
                        filter_policy="blocked-bloom/1", filter_params={"k": 6, "x": [1, 2]},
                        bits_per_key=10.0, effective_bits_per_key=12.5, filter_bytes=8192,
                        num_filter_partitions=2, format_version=1, creation_time=1700000000)
    assert decode_properties(Block(encode_properties(p))) == p


def test_properties_ignore_unknown_names_and_report_missing_ones():
    raw = encode_properties(TableProperties(num_entries=3))
    block = Block(raw)
    entries = [(k, block.data[s:e]) for k, s, e in block.entries()]
    b = BlockBuilder(1)
    for k, v in sorted(entries + [(b"zz_from_the_future", b"\x01")]):
        b.add(k, v)
    assert decode_properties(Block(b.finish())).num_entries == 3
    b = BlockBuilder(1)
    for k, v in entries:
        if k != b"num_entries":
            b.add(k, v)
    with pytest.raises(CorruptionError, match="missing"):
        decode_properties(Block(b.finish(), path="t", offset=9))
    b = BlockBuilder(1)
    for k, v in entries:
        b.add(k, v + b"\x00" if k == b"num_entries" else v)
    with pytest.raises(CorruptionError, match="trailing"):
        decode_properties(Block(b.finish()))


# -- index -----------------------------------------------------------------------------------
@given(st.binary(max_size=12), st.binary(max_size=12))
def test_shortest_separator_lies_between(a, b):
    if a == b:
        return
    start, limit = min(a, b), max(a, b)
    s = shortest_separator(start, limit)
    assert start <= s < limit
    assert len(s) <= len(start)


def test_shortest_separator_examples():
    assert shortest_separator(b"abcdef", b"abzz") == b"abd"
    assert shortest_separator(b"abc", b"abcd") == b"abc"  # a prefix: nothing shorter
    assert shortest_separator(b"ab\xff", b"ac") == b"ab\xff"
    assert shortest_separator(b"ab1", b"ab2") == b"ab1"  # no room between 1 and 2


def _index(entries):
    b = BlockBuilder(1)
    for k, h in entries:
        b.add(k, h.encode())
    return Block(b.finish(), path="t", offset=77)


def test_decode_index_checks_layout():
    good = [(b"b", BlockHandle(0, 10)), (b"d", BlockHandle(15, 20))]
    assert decode_index(_index(good), 40) == ([b"b", b"d"], [0, 15], [10, 20])
    for bad, end in [(good, 41),  # data ends elsewhere
                     ([(b"b", BlockHandle(0, 10)), (b"d", BlockHandle(16, 19))], 40),  # gap
                     ([(b"b", BlockHandle(5, 5)), (b"d", BlockHandle(15, 20))], 40)]:
        with pytest.raises(CorruptionError) as info:
            decode_index(_index(bad), end)
        assert info.value.offset == 77
    b = BlockBuilder(2)  # a prefix-compressed index entry is not allowed
    b.add(b"ab", BlockHandle(0, 10).encode())
    b.add(b"ac", BlockHandle(15, 20).encode())
    with pytest.raises(CorruptionError):
        decode_index(Block(b.finish()), 40)


# -- options ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [dict(block_size=0), dict(restart_interval=0),
                                dict(bits_per_key=0), dict(bits_per_key=-1.0),
                                dict(partition_bytes=0), dict(blocks_per_partition=0),
                                dict(filter_policy=3)])
def test_bad_options_are_invalid_arguments(kw):
    with pytest.raises(InvalidArgumentError):
        TableOptions(**kw)


def test_partition_bytes_round_up_to_pages():
    assert TableOptions(partition_bytes=1).partition_pages_bytes == 4096
    assert TableOptions(partition_bytes=4097).partition_pages_bytes == 8192
    assert TableOptions(filter_policy=None, bits_per_key=0).filter_policy is None


@pytest.mark.parametrize("value", [0, -1, True, 4096.0, (1 << 20) + 1, 1 << 40])
def test_table_options_bound_partition_bytes_like_the_db_option(value):
    # Was: TableOptions accepted partition_bytes=2**40 (the DB option is capped at 1 MiB), and a
    # builder then tried to build a terabyte-sized partition in memory.
    from engine.sstable.options import MAX_PARTITION_BYTES
    with pytest.raises(InvalidArgumentError, match="partition_bytes must be an int from 1 to"):
        TableOptions(partition_bytes=value)
    assert TableOptions(partition_bytes=MAX_PARTITION_BYTES).partition_pages_bytes == MAX_PARTITION_BYTES
