"""Blocks, varints and block trailers (engine/sstable/{coding,block_builder,block,handle}.py)."""

import random
import signal

import pytest
from hypothesis import given, settings, strategies as st

from engine.errors import CorruptionError
from engine.format import (BLOCK_HASH_FLAG, BLOCK_HASH_MAX_ENTRIES, BLOCK_HASH_SEED,
                           BLOCK_TYPE_DATA, BLOCK_TYPE_INDEX)
from engine.sstable.block import Block, find_whole
from engine.sstable.block_builder import BlockBuilder
from engine.sstable.coding import encode_varint, get_varint
from engine.sstable.handle import BlockHandle, decode_handle, seal, unseal


# -- varints ---------------------------------------------------------------------------------
@pytest.mark.parametrize("v", [0, 1, 127, 128, 300, 2**32 - 1, 2**56, 2**64 - 1])
def test_varint_round_trip(v):
    enc = encode_varint(v)
    assert get_varint(enc, 0, len(enc)) == (v, len(enc))
    assert get_varint(b"xx" + enc + b"yy", 2, len(enc) + 4) == (v, len(enc) + 2)


def test_varint_truncated_or_overlong_is_an_error():
    enc = encode_varint(2**40)
    with pytest.raises(ValueError):
        get_varint(enc, 0, len(enc) - 1)
    with pytest.raises(ValueError):
        get_varint(b"\xff" * 11, 0, 11)
    with pytest.raises(ValueError):
        get_varint(b"", 0, 0)


# -- blocks ----------------------------------------------------------------------------------
def _u32(b):
    return int.from_bytes(b, "little")


def build(entries, interval, hash_index=False):
    b = BlockBuilder(interval, hash_index)
    for k, v in entries:
        b.add(k, v)
    est = b.current_size_estimate()
    data = b.finish()
    assert len(data) == est
    return Block(data, path="mem", offset=0)


sorted_entries = st.dictionaries(st.binary(max_size=24), st.binary(max_size=300), max_size=80).map(
    lambda d: sorted(d.items()))


@settings(max_examples=150, deadline=None)
@given(sorted_entries, st.integers(1, 20), st.binary(max_size=24))
def test_block_round_trip_and_lookups(entries, interval, probe):
    block = build(entries, interval)
    data = block.data
    assert [(k, data[s:e]) for k, s, e in block.entries()] == entries
    for k, v in entries:
        s, e = block.get(k)
        assert data[s:e] == v
    present = dict(entries)
    r = block.get(probe)
    assert (r is None) == (probe not in present)
    expected = [(k, v) for k, v in entries if k >= probe]
    assert [(k, data[s:e]) for k, s, e in block.entries(probe)] == expected


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.binary(max_size=140), st.binary(max_size=160), max_size=60).map(
    lambda d: sorted(d.items())), st.integers(1, 6), st.binary(max_size=140))
def test_get_whole_agrees_with_get_on_any_block(entries, interval, probe):
    """The interval-1 fast path answers like get on every block: with one-byte headers, with
    keys or values of 128+ bytes (multi-byte varints), and on blocks that were not written
    with interval 1 at all (entries between restart points)."""
    block = build(entries, interval)
    for k, _ in entries:
        assert block.get_whole(k) == block.get(k)
    assert block.get_whole(probe) == block.get(probe)
    for k, _ in entries:  # neighbours of present keys: absent unless present
        for near in (k + b"\x00", k[:-1]):
            assert block.get_whole(near) == block.get(near)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.binary(max_size=140), st.binary(max_size=160), max_size=300).map(
    lambda d: sorted(d.items())), st.binary(max_size=140))
def test_hash_index_answers_like_binary_search(entries, probe):
    """A block written with a hash index (interval 1) answers every present key, its
    neighbours and a random probe exactly as the binary search of a block without one; entries
    and scans are unchanged; more than BLOCK_HASH_MAX_ENTRIES entries get no index."""
    hashed = build(entries, 1, hash_index=True)
    plain = build(entries, 1)
    flagged = bool(_u32(hashed.data[-4:]) & BLOCK_HASH_FLAG)
    assert flagged == (0 < len(entries) <= BLOCK_HASH_MAX_ENTRIES)
    if flagged:
        assert len(hashed.data) == len(plain.data) + 2 * len(entries) + 2
    assert list(hashed.entries()) == list(plain.entries())
    assert hashed.entries_end == plain.entries_end

    def value(block, k):
        r = block.get_whole(k)
        return None if r is None else block.data[r[0]:r[1]]

    for k, v in entries:
        assert value(hashed, k) == v
        assert hashed.get(k) == plain.get(k)  # the binary search still works on it
        for near in (k + b"\x00", k[:-1]):
            assert value(hashed, near) == value(plain, near)
    assert value(hashed, probe) == value(plain, probe)


def test_hash_slots_follow_the_spec():
    """Slot of entry i = first free slot from mmh3(key, BLOCK_HASH_SEED) % B, linear probing,
    B = 2 x entries; slots store i + 1 (docs/format.md, "Data block hash index")."""
    import mmh3
    import struct
    entries = [(b"k%03d" % i, b"v") for i in range(40)]
    data = build(entries, 1, hash_index=True).data
    count = struct.unpack_from("<I", data, len(data) - 4)[0]
    assert count == BLOCK_HASH_FLAG | 40
    nb = struct.unpack_from("<H", data, len(data) - 6)[0]
    assert nb == 80
    slots = data[len(data) - 6 - nb : len(data) - 6]
    mine = bytearray(nb)
    for i, (k, _) in enumerate(entries, 1):
        s = mmh3.hash(k, BLOCK_HASH_SEED, signed=False) % nb
        while mine[s]:
            s = (s + 1) % nb
        mine[s] = i
    assert slots == bytes(mine)
    assert sorted(x for x in slots if x) == list(range(1, 41))


def test_damaged_hash_index_raises_corruption_or_answers_right():
    """Any bit of a hashed block's index structures flipped (restart array, slots, slot count,
    restart count; no checksum here): each lookup answers right or raises CorruptionError
    naming the block, never another exception, never another entry's value."""
    rng = random.Random(12)
    entries = [(b"key%05d" % i, b"v%d" % i) for i in range(0, 300, 7)]
    good = build(entries, 1, hash_index=True).data
    entries_end = len(good) - 4 - 2 - 2 * len(entries) - 4 * len(entries)
    truth = dict(entries)
    outcomes = set()
    for _ in range(1500):
        bad = bytearray(good)
        bad[rng.randrange(entries_end, len(bad))] ^= 1 << rng.randrange(8)
        for k in [k for k, _ in entries] + [b"key00001", b"zz"]:
            try:
                r = find_whole(bytes(bad), k, "f", 9)
            except CorruptionError as exc:
                assert exc.path == "f" and exc.offset == 9
                outcomes.add("corruption")
                continue
            if r is not None:  # found: it must be the key's own value
                assert bytes(bad[r[0]:r[1]]) == truth[k]
            outcomes.add("ok")
    assert outcomes == {"ok", "corruption"}


class _Hung(Exception):
    pass


def test_hash_probe_ends_even_when_no_slot_is_empty():
    """engine/sstable/block.py find_whole: the probe loop ends only at an empty slot. A damaged
    index with no empty slot (one bit flipped in a 1-entry block: slots [0, 1] -> [1, 1]) makes
    every lookup of an absent key probe forever instead of raising CorruptionError. B > R
    (what the reader checks) does not imply that some slot is empty once slots may repeat.
    (Found in review; before the fix this test failed with _Hung after 2 s.)"""
    b = BlockBuilder(1, hash_index=True)
    b.add(b"k", b"v")
    data = bytearray(b.finish())
    n = len(data)
    slots = data[n - 8 : n - 6]  # B = 2 slots before the u16 B and the u32 count
    assert sorted(slots) == [0, 1]
    data[n - 8 + slots.index(0)] = 1  # the empty slot now names entry 0 too
    data = bytes(data)

    def on_alarm(*_):
        raise _Hung("find_whole still probing after 2 s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 2.0)
    try:
        with pytest.raises(CorruptionError):
            find_whole(data, b"absent", "f", 0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_hash_lookup_rejects_an_indexed_entry_that_shares_a_prefix():
    """An entry the hash index names must be a restart point (shared = 0); with one-byte
    headers a damaged shared byte was not checked, so find_whole answered where Block.get
    reports corruption."""
    b = BlockBuilder(1, hash_index=True)
    for k in (b"aa", b"ab", b"ac"):
        b.add(k, b"v")
    data = bytearray(b.finish())
    second = 3 + 2 + 1  # entry 0: 3 header bytes, key "aa", value "v"
    assert data[second] == 0
    data[second] = 1
    with pytest.raises(CorruptionError):
        find_whole(bytes(data), b"ab", "f", 0)
    with pytest.raises(CorruptionError):
        Block(bytes(data), path="f", offset=0).get(b"ab")


def test_get_whole_on_damaged_blocks_raises_corruption_not_index_error():
    """Flipped bytes anywhere in an interval-1 block (no checksum here): get_whole either
    answers or raises CorruptionError; restart offsets pointing outside the block included."""
    rng = random.Random(11)
    entries = [(b"key%05d" % i, b"v" * (i % 9)) for i in range(0, 400, 7)]
    good = build(entries, 1).data
    outcomes = set()
    for _ in range(600):
        bad = bytearray(good)
        for _ in range(rng.randrange(1, 3)):
            bad[rng.randrange(len(bad) - 4)] = rng.randrange(256)
        try:
            block = Block(bytes(bad), path="f", offset=3)
            for k, _ in entries:
                block.get_whole(k)
                block.get_whole(k + b"!")
            outcomes.add("ok")
        except CorruptionError as exc:
            assert exc.path == "f" and exc.offset == 3
            outcomes.add("corruption")
    assert outcomes == {"ok", "corruption"}


def test_restart_offsets_past_the_entries_are_corruption():
    data = bytearray(build([(b"a", b"1"), (b"b", b"2"), (b"c", b"3")], 1).data)
    restarts_at = len(data) - 4 - 4 * 3
    data[restarts_at + 4: restarts_at + 8] = (10_000).to_bytes(4, "little")  # middle restart
    block = Block(bytes(data), path="f", offset=0)
    for k in (b"a", b"b", b"c", b"bb"):
        with pytest.raises(CorruptionError):
            block.get_whole(k)
        with pytest.raises(CorruptionError):
            block.get(k)


def test_prefix_compression_shrinks_shared_prefixes():
    keys = [b"user:%010d" % i for i in range(100)]
    compressed = build([(k, b"") for k in keys], 16)
    whole = build([(k, b"") for k in keys], 1)
    assert len(compressed) < len(whole) * 0.6


def test_builder_reset_and_empty_block():
    b = BlockBuilder(4)
    assert b.empty
    b.add(b"a", b"1")
    b.finish()
    b.reset()
    assert b.empty and b.num_entries == 0
    empty = Block(b.finish())
    assert empty.get(b"a") is None and list(empty.entries()) == []


@pytest.mark.parametrize("data", [b"", b"\x01\x00", b"\x00\x00\x00\x00", b"\xff\xff\xff\x7f",
                                  b"abcd\x05\x00\x00\x00\x01\x00\x00\x00"])
def test_malformed_restart_arrays_raise_corruption(data):
    with pytest.raises(CorruptionError):
        Block(data, path="f", offset=7)
    with pytest.raises(CorruptionError):  # the point-read path that builds no Block
        find_whole(data, b"a", "f", 7)


def test_find_whole_sees_entries_hidden_before_the_first_restart_point():
    """A restart array whose first offset is not 0 (entries before it) is corruption, also
    when the key sorts before every restart key (the search never reads that offset)."""
    good = bytearray(build([(b"b", b"1"), (b"c", b"2")], 1).data)
    restarts_at = len(good) - 4 - 4 * 2
    good[restarts_at: restarts_at + 4] = (2).to_bytes(4, "little")  # rs[0] = 2, rs[1] valid
    with pytest.raises(CorruptionError):
        find_whole(bytes(good), b"a", "f", 0)


def test_malformed_entries_raise_corruption_not_index_error():
    rng = random.Random(5)
    good = build([(b"k%03d" % i, b"v" * i) for i in range(40)], 4).data
    restarts_at = len(good) - 4 - 4 * int.from_bytes(good[-4:], "little")
    outcomes = set()
    for _ in range(300):
        bad = bytearray(good)
        bad[rng.randrange(restarts_at)] = rng.randrange(256)
        try:
            block = Block(bytes(bad), path="f", offset=0)
            for k, _, _ in block.entries():
                block.get(k)
            outcomes.add("ok")
        except CorruptionError as exc:
            assert exc.path == "f"
            outcomes.add("corruption")
    assert "corruption" in outcomes


# -- handles and trailers --------------------------------------------------------------------
def test_handle_round_trip():
    h = BlockHandle(2**40 + 3, 4096)
    enc = h.encode()
    assert decode_handle(enc) == (h, len(enc))
    with pytest.raises(ValueError):
        decode_handle(enc[:-1])


def test_seal_unseal_checks_length_type_and_checksum():
    contents = b"some block contents"
    raw = seal(contents, BLOCK_TYPE_DATA)
    h = BlockHandle(100, len(contents))
    assert unseal(raw, h, BLOCK_TYPE_DATA, "t.sst") == contents
    with pytest.raises(CorruptionError, match="type"):
        unseal(raw, h, BLOCK_TYPE_INDEX, "t.sst")
    with pytest.raises(CorruptionError, match="truncated") as info:
        unseal(raw[:-1], h, BLOCK_TYPE_DATA, "t.sst")
    assert info.value.path == "t.sst" and info.value.offset == 100
    for i in range(len(raw)):
        bad = bytearray(raw)
        bad[i] ^= 0x40
        with pytest.raises(CorruptionError):
            unseal(bytes(bad), h, BLOCK_TYPE_DATA, "t.sst")
