"""VersionEdit encoding and Version invariants, apply and queries (against brute force)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import CorruptionError, InvalidArgumentError
from engine.format import NUM_LEVELS
from engine.version import Version
from engine.version_edit import FileMeta, VersionEdit

u64 = st.integers(0, (1 << 64) - 1)
metas = st.builds(
    FileMeta,
    number=u64, size=u64, smallest=st.binary(max_size=20), largest=st.binary(max_size=20),
    num_entries=u64, num_deletions=u64, smallest_seq=u64, largest_seq=u64,
    filter_bits_per_key=st.floats(allow_nan=False), filter_bytes=u64,
)
levels = st.integers(0, NUM_LEVELS - 1)
edits = st.builds(
    VersionEdit,
    comparator=st.none() | st.text(max_size=10),
    log_number=st.none() | u64,
    next_file_number=st.none() | u64,
    last_sequence=st.none() | u64,
    compact_pointers=st.lists(st.tuples(levels, st.binary(max_size=10)), max_size=3),
    deleted_files=st.lists(st.tuples(levels, u64), max_size=5),
    new_files=st.lists(st.tuples(levels, metas), max_size=5),
)


@given(edits)
def test_edit_round_trip(edit):
    assert VersionEdit.decode(edit.encode()) == edit


@settings(max_examples=50)
@given(edits)
def test_edit_truncation_is_detected_or_a_field_boundary(edit):
    data = edit.encode()
    for cut in range(len(data)):
        try:
            part = VersionEdit.decode(data[:cut])
        except CorruptionError:
            continue
        assert part.encode() == data[:cut]  # cut fell between two whole fields


def test_edit_unknown_tag_and_bad_level_are_corruption():
    with pytest.raises(CorruptionError, match="unknown version edit tag 99") as ei:
        VersionEdit.decode(VersionEdit(log_number=1).encode() + bytes([99, 0]), path="M", offset=5)
    assert ei.value.path == "M" and ei.value.offset == 5
    with pytest.raises(CorruptionError, match="level 7"):
        VersionEdit.decode(bytes([6, 7, 1]))  # deleted_file at level 7
    with pytest.raises(CorruptionError, match="varint"):
        VersionEdit.decode(bytes([2]) + b"\xff" * 11)


def fm(number, lo, hi, size=10):
    return FileMeta(number, size, lo, hi)


def test_apply_orders_levels_and_moves_files():
    e = VersionEdit()
    e.add_file(0, fm(3, b"a", b"z"))
    e.add_file(0, fm(9, b"c", b"d"))
    e.add_file(0, fm(5, b"b", b"y"))
    e.add_file(1, fm(4, b"m", b"p"))
    e.add_file(1, fm(2, b"a", b"c"))
    v = Version.empty().apply(e)
    assert [f.number for f in v.levels[0]] == [9, 5, 3]
    assert [f.number for f in v.levels[1]] == [2, 4]
    assert v.level_bytes(1) == 20 and v.total_files() == 5 and v.live_numbers() == {2, 3, 4, 5, 9}
    move = VersionEdit(deleted_files=[(1, 4)], new_files=[(2, fm(4, b"m", b"p"))])
    v2 = v.apply(move)
    assert v2.num_files(1) == 1 and v2.levels[2][0].number == 4
    assert v.num_files(1) == 2  # the old version is unchanged
    assert Version.empty().apply(v2.snapshot_edit()) == v2


@pytest.mark.parametrize(
    "edit,match",
    [
        (VersionEdit(deleted_files=[(1, 4)]), "not in level 1"),
        (VersionEdit(deleted_files=[(2, 2)]), "not in level 2"),
        (VersionEdit(new_files=[(3, fm(2, b"x", b"y"))]), "already live"),
        (VersionEdit(new_files=[(1, fm(7, b"b", b"e"))]), "overlap"),
        (VersionEdit(new_files=[(1, fm(7, b"c", b"c"))]), "overlap"),  # shares a boundary key
        (VersionEdit(new_files=[(2, fm(7, b"z", b"a"))]), "smallest key > largest"),
        (VersionEdit(new_files=[(7, fm(7, b"a", b"a"))]), "level 7"),
    ],
)
def test_apply_rejects_bad_edits(edit, match):
    v = Version.empty().apply(VersionEdit(new_files=[(1, fm(2, b"a", b"c"))]))
    with pytest.raises(CorruptionError, match=match):
        v.apply(edit)


def test_check_catches_directly_built_bad_versions():
    empty = [()] * NUM_LEVELS
    bad_l0 = list(empty)
    bad_l0[0] = (fm(1, b"a", b"b"), fm(2, b"a", b"b"))
    bad_l1 = list(empty)
    bad_l1[1] = (fm(1, b"m", b"n"), fm(2, b"a", b"b"))
    dup = list(empty)
    dup[1], dup[2] = (fm(1, b"a", b"b"),), (fm(1, b"a", b"b"),)
    for levels in (bad_l0, bad_l1, dup, empty[:3]):
        with pytest.raises(CorruptionError):
            Version(tuple(levels)).check()
    Version(tuple(empty)).check()


def test_find_file_rejects_level_zero_and_bad_levels():
    v = Version.empty()
    with pytest.raises(InvalidArgumentError):
        v.find_file(0, b"a")
    with pytest.raises(InvalidArgumentError):
        v.files_overlapping(NUM_LEVELS, None, None)


key = st.binary(min_size=0, max_size=3)


@st.composite
def versions(draw):
    """A valid version: L0 with arbitrary ranges, L1..L3 cut from sorted distinct keys."""
    number = iter(range(1, 10_000))
    edit = VersionEdit()
    for _ in range(draw(st.integers(0, 4))):
        a, b = sorted([draw(key), draw(key)])
        edit.add_file(0, fm(next(number), a, b))
    for level in (1, 2, 3):
        ks = sorted(set(draw(st.lists(key, max_size=12))))
        i = 0
        while i < len(ks):
            width = draw(st.integers(1, 3))
            chunk = ks[i : i + width]
            if draw(st.booleans()):  # leave gaps between files sometimes
                edit.add_file(level, fm(next(number), chunk[0], chunk[-1]))
            i += width
    return Version.empty().apply(edit)


@settings(max_examples=200)
@given(versions(), st.none() | key, st.none() | key, key)
def test_queries_match_brute_force(v, lo, hi, probe):
    v.check()
    for level in range(NUM_LEVELS):
        want = [f for f in v.levels[level]
                if (lo is None or f.largest >= lo) and (hi is None or f.smallest <= hi)]
        assert v.files_overlapping(level, lo, hi) == want
        if level:
            hits = [f for f in v.levels[level] if f.smallest <= probe <= f.largest]
            assert len(hits) <= 1
            assert v.find_file(level, probe) == (hits[0] if hits else None)
    brute = [f for level in range(NUM_LEVELS) for f in v.levels[level] if f.smallest <= probe <= f.largest]
    assert v.files_for_key(probe) == brute
