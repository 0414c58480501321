"""Unit tests of engine.filters: both policies, their sizes, their trailers, bad data, the
stored-name round trip, and the FPR with a generous bound (fixed seeds: cannot flake)."""

from __future__ import annotations

import math
import mmap
import random
import struct

import mmh3
import pytest

from engine.errors import InvalidArgumentError, SieveError
from engine.filters import (
    DEFAULT_POLICY,
    BlockedBloomFilterPolicy,
    BloomFilterPolicy,
    UnknownFilterPolicy,
    blocked_bloom,
    bloom,
    get_policy,
    layout,
    policy_from_stored_name,
    theoretical_fpr,
)

POLICIES = ["bloom", "blocked-bloom"]
REFERENCE = {"bloom": bloom.probe_reference, "blocked-bloom": blocked_bloom.probe_reference}


def rand_keys(n: int, seed: int, size: int = 16) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(size) for _ in range(n)]


# -- names, parameters, registry ------------------------------------------------------------


def test_short_and_stored_names_pick_the_same_class():
    assert type(get_policy("bloom", 10)) is BloomFilterPolicy
    assert type(get_policy("sievekv.BloomFilter.v1", 10)) is BloomFilterPolicy
    assert type(get_policy("blocked-bloom", 10)) is BlockedBloomFilterPolicy
    assert type(get_policy("sievekv.BlockedBloomFilter.v1", 10)) is BlockedBloomFilterPolicy
    assert get_policy("bloom", 10).name == "sievekv.BloomFilter.v1"
    assert get_policy("blocked-bloom", 10).name == "sievekv.BlockedBloomFilter.v1"
    assert DEFAULT_POLICY == "blocked-bloom"


@pytest.mark.parametrize("name", ["", "Bloom", "bloom.v2", "sievekv.BloomFilter.v2", None, 3])
def test_unknown_name_is_invalid_argument(name):
    with pytest.raises(InvalidArgumentError):
        get_policy(name, 10)
    with pytest.raises(UnknownFilterPolicy):
        policy_from_stored_name(name, {"bits_per_key": 10.0, "num_probes": 6})
    assert issubclass(UnknownFilterPolicy, SieveError)


@pytest.mark.parametrize("bpk", [0, 0.99, 64.01, 1000, -5, float("nan"), float("inf"), "10", None, True])
def test_bits_per_key_out_of_range(bpk):
    for name in POLICIES:
        with pytest.raises(InvalidArgumentError):
            get_policy(name, bpk)


def test_bits_per_key_limits_accepted_and_num_probes_override():
    for name in POLICIES:
        assert get_policy(name, 1).bits_per_key == 1.0
        assert get_policy(name, 64).bits_per_key == 64.0
        assert get_policy(name, 7.5).bits_per_key == 7.5
        assert get_policy(name, 10, num_probes=3).num_probes == 3
        with pytest.raises(InvalidArgumentError):
            get_policy(name, 10, num_probes=0)
        with pytest.raises(InvalidArgumentError):
            get_policy(name, 10, num_probes=31)


def test_num_probes_choice():
    # classic: round(bpk * ln 2), clamped to [1, 30]
    assert [get_policy("bloom", b).num_probes for b in (1, 6, 8, 10, 12, 16, 64)] == [1, 4, 6, 7, 8, 11, 30]
    # blocked: RocksDB's ChooseNumProbes
    got = [get_policy("blocked-bloom", b).num_probes for b in (1, 2, 6, 8, 10, 12, 16, 20, 30, 50, 50.5, 64)]
    assert got == [1, 1, 4, 5, 6, 8, 9, 11, 13, 23, 24, 24]


def test_params_round_trip_through_stored_name():
    for name in POLICIES:
        for bpk in (1, 7.5, 10, 23, 64):
            p = get_policy(name, bpk)
            params = p.params()
            assert params == {"bits_per_key": float(bpk), "num_probes": p.num_probes}
            q = policy_from_stored_name(p.name, params)
            assert q == p and type(q) is type(p)
            keys = rand_keys(300, bpk)
            data = p.build(keys)
            assert all(q.may_match(data, k) for k in keys)
        # missing params take defaults: decoding reads k from the trailer anyway
        assert policy_from_stored_name(get_policy(name, 10).name, None).bits_per_key == 10.0
        assert policy_from_stored_name(get_policy(name, 10).name, {}).bits_per_key == 10.0


@pytest.mark.parametrize("params", [{"bits_per_key": "x"}, {"bits_per_key": 0}, {"num_probes": 99}, [1, 2]])
def test_unusable_stored_params_are_unknown_policy(params):
    for name in POLICIES:
        with pytest.raises(UnknownFilterPolicy):
            policy_from_stored_name(get_policy(name, 10).name, params)


def test_theoretical_fpr_models():
    assert theoretical_fpr("bloom", 10, 7) == pytest.approx((1 - math.exp(-0.7)) ** 7)
    assert theoretical_fpr("bloom", 10, 7) == pytest.approx(0.008194, rel=1e-3)
    # RocksDB quotes ~0.955% as the best a 512-bit-line filter can do at 10 bits/key, k=6
    assert 0.0094 < theoretical_fpr("blocked-bloom", 10, 6) < 0.0097
    assert theoretical_fpr("sievekv.BlockedBloomFilter.v1", 10, 6) == theoretical_fpr("blocked-bloom", 10, 6)
    # the blocked model is worse than classic at the same bits and k, and falls with bits
    for bpk in (6, 8, 10, 12, 16):
        assert theoretical_fpr("blocked-bloom", bpk, 6) > theoretical_fpr("bloom", bpk, 6)
    assert theoretical_fpr("blocked-bloom", 12, 6) < theoretical_fpr("blocked-bloom", 10, 6)
    assert get_policy("bloom", 10).expected_fpr() == theoretical_fpr("bloom", 10, 7)
    with pytest.raises(InvalidArgumentError):
        theoretical_fpr("nope", 10, 6)


# -- sizes and layout -----------------------------------------------------------------------


@pytest.mark.parametrize("name", POLICIES)
def test_estimate_size_is_exact(name):
    for bpk in (1, 6, 9.7, 10, 16, 64):
        p = get_policy(name, bpk)
        for n in (0, 1, 2, 7, 50, 51, 409, 1000, 3277):
            keys = rand_keys(n, n)
            assert len(p.build(keys)) == p.estimate_size(n), (bpk, n)
            assert len(p.build(iter(keys))) == p.estimate_size(n)  # any iterable, consumed once
    with pytest.raises(InvalidArgumentError):
        get_policy(name, 10).estimate_size(-1)


def test_sizes_follow_the_spec():
    b = get_policy("bloom", 10)
    assert b.estimate_size(0) == 12 and b.estimate_size(1000) == 1250 + 4
    bb = get_policy("blocked-bloom", 10)
    assert bb.estimate_size(0) == 64 and bb.estimate_size(1000) == 20 * 64  # 1250 + 4 bytes
    assert bb.estimate_size(48) == 64  # 60 + 4 bytes fit one line
    assert bb.estimate_size(49) == 128


@pytest.mark.parametrize("name", POLICIES)
def test_size_bytes_fills_exactly(name):
    p = get_policy(name, 10)
    keys = rand_keys(2000, 1)
    for size in (4096, 8192, 4096 * 3, 100, 200, 12, 64, 65, 127):
        data = p.build(keys, size_bytes=size)
        assert len(data) == p.fit_size(size)
        assert p.min_size <= len(data) <= max(size, p.min_size)
        if name == "blocked-bloom":
            assert len(data) % 64 == 0 and len(data) == max(64, size // 64 * 64)
        else:
            assert len(data) == max(12, size)
        assert all(p.may_match(data, k) for k in keys)
    assert len(p.build(keys, size_bytes=4096)) == 4096
    # under the minimum: the minimum filter (still correct)
    small = p.build(keys, size_bytes=1)
    assert len(small) == p.min_size and all(p.may_match(small, k) for k in keys[:200])
    for bad in (-1, 1.5, "4096", True):
        with pytest.raises(InvalidArgumentError):
            p.build(keys, size_bytes=bad)


def test_trailers_are_as_documented():
    data = get_policy("bloom", 10).build(rand_keys(100, 2))
    assert data[-4:] == bytes([7, 125 % 256, 125 // 256, 0xB1]) == layout.TRAILER.pack(7, 125, layout.MARKER_BLOOM)
    data = get_policy("blocked-bloom", 10).build(rand_keys(100, 2), size_bytes=4096)
    assert data[-4:] == bytes([6, 64, 0, 0xB2])  # 64 lines


def test_blocked_never_sets_trailer_bits_and_uses_one_line_per_key():
    p = get_policy("blocked-bloom", 10)
    # one line: every key lands in the last line; saturate it
    data = p.build(rand_keys(5000, 3), size_bytes=64)
    assert data[:60] == b"\xff" * 60 and data[60:] == bytes([6, 1, 0, 0xB2])
    # each key's bits sit in the one line probe_positions names
    for key in rand_keys(50, 4):
        one = p.build([key], size_bytes=64 * 8)
        line, positions = blocked_bloom.probe_positions(key, 8, 6)
        touched = {i // 64 for i in range(len(one) - 4) if one[i]}
        assert touched == {line}
        assert sum(bin(b).count("1") for b in one[:-4]) == len(set(positions))


def test_classic_bits_follow_double_hashing():
    p = get_policy("bloom", 10)
    key = b"some key"
    data = p.build([key], size_bytes=100)  # m = 96 * 8 bits
    m = 96 * 8
    h = int.from_bytes(mmh3.mmh3_x64_128_digest(key), "little")
    h1, h2 = h & (2**64 - 1), h >> 64
    expected = {(h1 + i * h2) % m for i in range(7)}
    got = {j for j in range(m) if data[j >> 3] >> (j & 7) & 1}
    assert got == expected


# -- no false negatives, vectorised build == scalar spec ------------------------------------


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("bpk", [1, 4, 10, 13, 20, 64])
def test_build_matches_scalar_reference_bit_for_bit(name, bpk):
    p = get_policy(name, bpk)
    keys = rand_keys(700, bpk) + [b"", b"x" * 1000, b"dup", b"dup"]
    for size in (None, 4096, 64, 12):
        data = p.build(keys, size_bytes=size)
        expect = bytearray(len(data))
        if name == "bloom":
            m = (len(data) - 4) * 8
            for key in keys:
                for j in bloom.probe_positions(key, m, p.num_probes):
                    expect[j >> 3] |= 1 << (j & 7)
        else:
            lines = len(data) // 64
            for key in keys:
                line, positions = blocked_bloom.probe_positions(key, lines, p.num_probes)
                for q in positions:
                    expect[line * 64 + (q >> 3)] |= 1 << (q & 7)
        expect[-4:] = data[-4:]
        assert bytes(expect) == data
        assert all(p.may_match(data, k) for k in keys)


@pytest.mark.parametrize("name", POLICIES)
def test_specialised_probe_equals_reference(name):
    """The generated, unrolled probe answers exactly what the reference decoder answers,
    in every line (the last one included) and for k that need extra digests."""
    ref = REFERENCE[name]
    absent = rand_keys(3000, 99)
    for bpk in (3, 10, 20, 40, 64):
        p = get_policy(name, bpk)
        for n, size in ((400, None), (60, None), (3000, 4096), (30, 64)):
            data = p.build(rand_keys(n, n + bpk), size_bytes=size)
            got = [p.may_match(data, k) for k in absent]
            assert got == [ref(data, k) for k in absent]
            assert not all(got)  # the filters do reject keys


@pytest.mark.parametrize("name", POLICIES)
def test_filter_read_by_a_policy_with_other_bits_per_key(name):
    """k comes from the trailer: a reader configured differently still answers right."""
    keys = rand_keys(1000, 5)
    writer = get_policy(name, 16)
    data = writer.build(keys)
    absent = rand_keys(2000, 6)
    for reader_bpk in (4, 10, 16, 40):
        reader = get_policy(name, reader_bpk)
        assert all(reader.may_match(data, k) for k in keys)
        assert [reader.may_match(data, k) for k in absent] == [writer.may_match(data, k) for k in absent]


def test_empty_filter_rejects_everything():
    for name in POLICIES:
        p = get_policy(name, 10)
        data = p.build([])
        assert not any(p.may_match(data, k) for k in rand_keys(100, 7) + [b""])


def test_keys_must_be_bytes_like():
    for name in POLICIES:
        p = get_policy(name, 10)
        with pytest.raises(InvalidArgumentError):
            p.build(["text"])
        data = p.build([b"a", bytearray(b"b"), memoryview(b"c")])
        assert all(p.may_match(data, k) for k in (b"a", b"b", b"c", bytearray(b"a"), memoryview(b"b")))
        with pytest.raises(TypeError):
            p.may_match(data, "text")


# -- buffers: bytes, memoryview, mmap slices at an offset -----------------------------------


@pytest.mark.parametrize("name", POLICIES)
def test_may_match_on_memoryview_and_mmap_slice(name, tmp_path):
    p = get_policy(name, 10)
    keys = rand_keys(3000, 8)
    absent = rand_keys(3000, 9)
    data = p.build(keys, size_bytes=8192)
    expected = [p.may_match(data, k) for k in absent]
    path = tmp_path / "filter.bin"
    path.write_bytes(b"\x5a" * 4096 + data + b"\xff" * 100)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)
        part = view[4096 : 4096 + len(data)]
        for buf in (part, memoryview(data), bytearray(data), memoryview(bytearray(data))[0:]):
            assert all(p.may_match(buf, k) for k in keys)
            assert [p.may_match(buf, k) for k in absent] == expected
        del part, view


# -- malformed filters answer "may match" ---------------------------------------------------


@pytest.mark.parametrize("name", POLICIES)
def test_garbage_short_and_truncated_filters_may_match(name):
    p = get_policy(name, 10)
    keys = rand_keys(2000, 10)
    probes = keys[:300] + rand_keys(300, 11)
    data = p.build(keys, size_bytes=4096)
    rng = random.Random(12)
    bad = [b"", b"\x00", b"\xb2", b"\xb1", bytes(3), bytes(4), bytes(11), bytes(63), bytes(64), bytes(4096)]
    bad += [data[:cut] for cut in range(0, len(data), 61)]  # truncated anywhere ...
    bad += [data[:cut] for cut in range(64, len(data), 64)]  # ... and at line boundaries
    bad += [data[:-4] + bytes([p.num_probes, 0, 0, 0x00]), data[:-1] + b"\x00"]  # wrong marker
    bad += [data[:-4] + bytes([0, 6, 0, data[-1]]), data[:-4] + bytes([31, 6, 0, data[-1]])]  # bad k
    bad += [data + b"\x00", data + bytes(64)]  # trailing bytes
    bad += [rng.randbytes(len(data)) for _ in range(5)]  # random bytes, right length
    bad += [memoryview(data).cast("I"), memoryview(bytes(64)).cast("b")]  # not byte-format
    for junk in bad:
        if isinstance(junk, bytes) and junk[-1:] == bytes([data[-1]]) and len(junk) == len(data):
            continue  # a random page that happens to carry our marker is not "garbage"
        for k in probes:
            assert p.may_match(junk, k) is True, (len(junk), k)


@pytest.mark.parametrize("name", POLICIES)
def test_truncated_filter_never_answers_absent_for_built_keys(name):
    """Whatever prefix of a filter a reader is handed, a key that was built in never gets a
    False (a prefix that still looks well formed would be a format bug)."""
    p = get_policy(name, 10)
    keys = rand_keys(500, 13)
    data = p.build(keys)
    for cut in range(len(data)):
        prefix = memoryview(data)[:cut]
        assert all(p.may_match(prefix, k) for k in keys[::25])


def test_non_buffer_filter_data_may_match():
    for name in POLICIES:
        p = get_policy(name, 10)
        for junk in (None, 0, 3.5, "x" * 64, [1] * 64, object()):
            assert p.may_match(junk, b"key") is True


# -- false-positive rate (generous bound, deterministic) ------------------------------------


@pytest.mark.parametrize("name", POLICIES)
def test_fpr_sanity_at_10_bits_per_key(name):
    p = get_policy(name, 10)
    keys = rand_keys(10_000, 14)
    data = p.build(keys)
    absent = rand_keys(20_000, 15)
    fp = sum(p.may_match(data, k) for k in absent) / len(absent)
    assert 0.002 < fp < 0.03
    assert fp < 3 * p.expected_fpr()


def test_fpr_falls_with_bits_per_key():
    keys = rand_keys(5000, 16)
    absent = rand_keys(10_000, 17)
    for name in POLICIES:
        rates = []
        for bpk in (4, 8, 12):
            p = get_policy(name, bpk)
            data = p.build(keys)
            rates.append(sum(p.may_match(data, k) for k in absent))
        assert rates[0] > rates[1] > rates[2]


@pytest.mark.parametrize("name", POLICIES)
def test_length_check_guards_the_reference_decoder(name):
    """A filter whose trailer's length check disagrees with its length is malformed: the
    reference decoder (and so any reader whose k differs from the trailer's) says may match."""
    p = get_policy(name, 10)
    keys = rand_keys(3000, 20)
    data = bytearray(p.build(keys, size_bytes=4096))
    absent = rand_keys(500, 21)
    assert not all(REFERENCE[name](data, k) for k in absent)
    data[-3] ^= 1
    assert all(REFERENCE[name](data, k) for k in absent)
    other = get_policy(name, 10, num_probes=p.num_probes + 1)
    assert all(other.may_match(data, k) for k in absent)


def test_blocked_distinct_check_sees_a_repeat_at_every_pair_of_candidates():
    """The fast probe's distinctness test (pairwise comparisons at k=6 since session 19, a set
    before) must catch a repeat between any two of the first six candidates: for one key per
    pair (i, j), clearing the bit of the key's sixth distinct position must turn the answer
    to "absent", as the reference says."""
    p = get_policy("blocked-bloom", 10)
    lines = 8

    def first_six(key):
        return [w & 511 for w in struct.unpack("<6H", mmh3.mmh3_x64_128_digest(key)[4:])]

    by_pair = {}
    for k in rand_keys(60000, 31):
        c = first_six(k)
        if blocked_bloom.probe_positions(k, lines, 6)[0] == lines - 1:
            continue
        pairs = [(i, j) for i in range(6) for j in range(i + 1, 6) if c[i] == c[j]]
        if len(pairs) == 1:
            by_pair.setdefault(pairs[0], k)
    assert len(by_pair) == 15
    for pair, key in sorted(by_pair.items()):
        line, positions = blocked_bloom.probe_positions(key, lines, 6)
        data = bytearray(p.build([key], size_bytes=64 * lines))
        assert p.may_match(data, key) is True, pair
        q = positions[-1]
        data[line * 64 + (q >> 3)] &= ~(1 << (q & 7))
        assert p.may_match(data, key) is False, pair
        assert blocked_bloom.probe_reference(data, key) is False


def test_blocked_repeated_candidates_take_the_next_distinct_bit():
    """A key whose first k candidate words repeat a bit uses the next candidates; the fast
    probe (which tests the first k) must then defer to the reference, both ways."""
    p = get_policy("blocked-bloom", 10)
    lines = 8

    def first_six(key):  # the first six candidates, for a key outside the last line
        return [w & 511 for w in struct.unpack("<6H", mmh3.mmh3_x64_128_digest(key)[4:])]

    key = next(
        k for k in rand_keys(5000, 30)
        if len(set(first_six(k))) < 6 and blocked_bloom.probe_positions(k, lines, 6)[0] != lines - 1
    )  # fmt: skip
    line, positions = blocked_bloom.probe_positions(key, lines, 6)
    assert len(set(positions)) == 6 and set(first_six(key)) < set(positions)
    data = bytearray(p.build([key], size_bytes=64 * lines))
    assert p.may_match(data, key)
    # clear the bit of its sixth distinct position: the first six candidates all still test
    # set bits, so only the distinctness check can say "absent"
    q = positions[-1]
    data[line * 64 + (q >> 3)] &= ~(1 << (q & 7))
    assert p.may_match(data, key) is False
    assert blocked_bloom.probe_reference(data, key) is False
