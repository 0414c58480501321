"""Write batch encoding: round trips, malformed payloads, argument checks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import CorruptionError, InvalidArgumentError
from engine.format import KIND_DELETE, KIND_VALUE, MAX_SEQUENCE
from engine.wal import decode_batch, encode_batch

ops_strategy = st.lists(
    st.tuples(st.sampled_from([KIND_DELETE, KIND_VALUE]), st.binary(max_size=40), st.binary(max_size=200)),
    max_size=20,
)


@given(st.integers(0, MAX_SEQUENCE - 100), ops_strategy)
def test_round_trip(seq, ops):
    payload = encode_batch(seq, ops)
    assert decode_batch(payload) == (seq, ops)


def test_single_op_layout_is_the_general_layout():
    one = encode_batch(9, [(KIND_VALUE, b"k", b"v")])
    two = encode_batch(9, [(KIND_VALUE, b"k", b"v"), (KIND_DELETE, b"d", b"")])
    assert two.startswith(one[:8]) and one[12:] == two[12 : len(one)]
    assert decode_batch(two)[1] == [(KIND_VALUE, b"k", b"v"), (KIND_DELETE, b"d", b"")]


def test_bytes_like_inputs_are_accepted():
    payload = encode_batch(1, [(KIND_VALUE, bytearray(b"k"), memoryview(b"val"))])
    assert decode_batch(memoryview(payload)) == (1, [(KIND_VALUE, b"k", b"val")])


@settings(max_examples=300)
@given(st.binary(max_size=80))
def test_arbitrary_bytes_decode_or_raise_corruption(data):
    try:
        seq, ops = decode_batch(data)
    except CorruptionError:
        return
    assert encode_batch(seq, ops) == data


@given(st.integers(1, 10_000), ops_strategy.filter(bool))
def test_every_truncation_is_detected(cut_seed, ops):
    payload = encode_batch(5, ops)
    cut = cut_seed % len(payload)
    with pytest.raises(CorruptionError):
        decode_batch(payload[:cut])


def test_trailing_bytes_and_bad_kind_are_corruption():
    payload = encode_batch(5, [(KIND_VALUE, b"k", b"v")])
    with pytest.raises(CorruptionError, match="trailing"):
        decode_batch(payload + b"\0")
    bad = bytearray(payload)
    bad[12] = 2  # the kind byte of the first operation
    with pytest.raises(CorruptionError, match="kind") as ei:
        decode_batch(bytes(bad), path="000003.log", offset=77)
    assert ei.value.path == "000003.log" and ei.value.offset == 77


@pytest.mark.parametrize(
    "seq,ops",
    [
        (0, [(2, b"k", b"v")]),
        (0, [(KIND_VALUE, b"k", b"v"), (-1, b"k", b"v")]),
        (-1, [(KIND_VALUE, b"k", b"v")]),
        (MAX_SEQUENCE, [(KIND_VALUE, b"k", b"v"), (KIND_VALUE, b"k", b"v")]),
        (0, [(KIND_VALUE, "text", b"v")]),
        (0, [(KIND_VALUE, b"k", b"v"), (KIND_VALUE, b"k", None)]),
    ],
)
def test_bad_arguments_are_invalid_argument(seq, ops):
    with pytest.raises(InvalidArgumentError):
        encode_batch(seq, ops)


def test_last_sequence_fits():
    assert decode_batch(encode_batch(MAX_SEQUENCE, [(KIND_VALUE, b"k", b"")]))[0] == MAX_SEQUENCE
