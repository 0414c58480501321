"""Property tests of engine.filters (hypothesis): no false negatives for any key set, exact
sizes, the vectorised build equal to the scalar spec bit for bit, and bad filter bytes never
raising or answering "absent" unless the documented fast-path exception applies."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmh3

from engine.filters import blocked_bloom, bloom, get_policy, layout

NAMES = st.sampled_from(["bloom", "blocked-bloom"])
BITS_PER_KEY = st.one_of(st.integers(1, 64), st.floats(1.0, 64.0, allow_nan=False))
KEYS = st.lists(st.binary(max_size=40) | st.binary(min_size=200, max_size=300), max_size=300)
SIZES = st.none() | st.integers(0, 9000)

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(name=NAMES, bpk=BITS_PER_KEY, keys=KEYS, size=SIZES, data=st.data())
def test_no_false_negatives_and_exact_sizes(name, bpk, keys, size, data):
    p = get_policy(name, bpk)
    dup = data.draw(st.lists(st.sampled_from(keys), max_size=20)) if keys else []
    keys = keys + dup  # duplicates are fine
    filt = p.build(keys, size_bytes=size)
    expected = p.estimate_size(len(keys)) if size is None else p.fit_size(size)
    assert len(filt) == expected
    for key in keys:
        assert p.may_match(filt, key) is True
        assert p.may_match(memoryview(filt), key) is True


def _spec_positions_blocked(key: bytes, lines: int, k: int) -> tuple[int, list[int]]:
    """docs/format.md, "Blocked Bloom", rules 1-3, written again from the text."""
    d0 = mmh3.mmh3_x64_128_digest(key, 0)
    line = int.from_bytes(d0[0:4], "little") * lines // 2**32
    stream = [int.from_bytes(d0[4 + 2 * i : 6 + 2 * i], "little") for i in range(6)]
    seed, chosen = 1, []
    while len(chosen) < k:
        if not stream:
            d = mmh3.mmh3_x64_128_digest(key, seed)
            stream = [int.from_bytes(d[2 * j : 2 * j + 2], "little") for j in range(8)]
            seed += 1
        w = stream.pop(0)
        p = w % 480 if line == lines - 1 else w % 512
        if p not in chosen:
            chosen.append(p)
    return line, chosen


def _scalar_build(name: str, policy, keys: list[bytes], length: int) -> bytes:
    """An independent, one-key-at-a-time encoder written from docs/format.md."""
    out = bytearray(length)
    k = policy.num_probes
    if name == "bloom":
        m = (length - 4) * 8
        for key in keys:
            h = int.from_bytes(mmh3.mmh3_x64_128_digest(key, 0), "little")
            h1, h2 = h % 2**64, h // 2**64
            for i in range(k):
                j = (h1 + i * h2) % m
                out[j // 8] |= 1 << (j % 8)
        out[-4:] = bytes([k, (length - 4) % 256, (length - 4) // 256 % 256, 0xB1])
    else:
        lines = length // 64
        for key in keys:
            line, positions = _spec_positions_blocked(key, lines, k)
            for q in positions:
                out[line * 64 + q // 8] |= 1 << (q % 8)
        out[-4:] = bytes([k, lines % 256, lines // 256 % 256, 0xB2])
    return bytes(out)


@SETTINGS
@given(name=NAMES, bpk=BITS_PER_KEY, keys=KEYS, size=SIZES)
def test_vectorised_build_equals_scalar_spec(name, bpk, keys, size):
    p = get_policy(name, bpk)
    filt = p.build(keys, size_bytes=size)
    assert filt == _scalar_build(name, p, keys, len(filt))
    if name == "blocked-bloom":
        lines = len(filt) // 64
        for key in keys[:20]:
            assert blocked_bloom.probe_positions(key, lines, p.num_probes) == _spec_positions_blocked(key, lines, p.num_probes)


def _well_formed(name: str, data: bytes) -> bool:
    """docs/format.md, "Filter encodings", reading rule 1, written independently."""
    n = len(data)
    if name == "bloom":
        return n >= 12 and data[-1] == 0xB1 and 1 <= data[-4] <= 30 and int.from_bytes(data[-3:-1], "little") == (n - 4) % 65536
    return (
        n >= 64 and n % 64 == 0 and data[-1] == 0xB2 and 1 <= data[-4] <= 30
        and int.from_bytes(data[-3:-1], "little") == (n // 64) % 65536
    )  # fmt: skip


def _fast_path_accepts(name: str, policy, data: bytes) -> bool:
    """Reading rule 4: the specialised probe trusts marker + its own k (+ blocked length)."""
    n = len(data)
    if name == "bloom":
        return n >= 12 and data[-1] == 0xB1 and data[-4] == policy.num_probes
    return n >= 64 and n % 64 == 0 and data[-1] == 0xB2 and data[-4] == policy.num_probes


def _with_trailer(draw_bytes: bytes, name: str, k: int, good_length: bool) -> bytes:
    body = draw_bytes
    n = len(body) + 4
    check = (n - 4) % 65536 if name == "bloom" else (n // 64) % 65536
    if not good_length:
        check = (check + 1) % 65536
    return body + layout.TRAILER.pack(k, check, 0xB1 if name == "bloom" else 0xB2)


@settings(max_examples=200, deadline=None)
@given(
    name=NAMES,
    bpk=st.integers(1, 64),
    body=st.binary(max_size=300) | st.binary(min_size=60, max_size=60) | st.binary(min_size=124, max_size=124),
    k=st.integers(0, 255),
    shape=st.sampled_from(["raw", "trailer-good-length", "trailer-bad-length"]),
    keys=st.lists(st.binary(max_size=20), min_size=1, max_size=10),
)
def test_arbitrary_bytes_never_raise_and_malformed_means_may_match(name, bpk, body, k, shape, keys):
    p = get_policy(name, bpk)
    data = body if shape == "raw" else _with_trailer(body, name, k, shape == "trailer-good-length")
    ref = bloom.probe_reference if name == "bloom" else blocked_bloom.probe_reference
    for key in keys:
        got = p.may_match(data, key)
        assert got is True or got is False
        assert ref(data, key) in (True, False)
        if not _well_formed(name, data):
            assert ref(data, key) is True
            if not _fast_path_accepts(name, p, data):
                assert got is True
        else:
            assert got == ref(data, key)
