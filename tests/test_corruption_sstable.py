"""Damaged tables: every flipped byte and every cut gives a CorruptionError or a correct
answer, never another exception and never a wrong value. A damaged filter may only turn a
"no" into "may match" (counted as a filter error)."""

import random

import pytest

from engine.errors import CorruptionError
from engine.format import (BLOCK_TRAILER_SIZE, BLOCK_TYPE_PROPERTIES, FILTER_PAGE_SIZE,
                           KIND_DELETE, KIND_VALUE, TABLE_FOOTER_SIZE)
from engine.sstable import Table, TableBuilder, TableOptions
from engine.sstable.block import Block
from engine.sstable.footer import Footer
from engine.sstable.handle import decode_handle, seal
from engine.sstable.properties import decode_properties, encode_properties
from engine.vfs import FileSystem


@pytest.fixture(scope="module", params=[4, 1], ids=["interval4", "interval1"])
def table(tmp_path_factory, request):
    """A small table: several data blocks, one one-page filter partition per block; restart
    interval 4 (prefix-compressed scans) or 1 (Block.get_whole, the fast path)."""
    path = str(tmp_path_factory.mktemp("corrupt") / "t.sst")
    rng = random.Random(21)
    keys = sorted({rng.randbytes(rng.randrange(1, 12)) for _ in range(60)})
    entries = [(k, i + 1, KIND_DELETE if i % 9 == 4 else KIND_VALUE,
                b"" if i % 9 == 4 else rng.randbytes(rng.randrange(40))) for i, k in enumerate(keys)]
    fs = FileSystem()
    w = fs.open_writable(path)
    b = TableBuilder(w, TableOptions(block_size=300, restart_interval=request.param,
                                   blocks_per_partition=1))
    for e in entries:
        b.add(*e)
    props = b.finish()
    w.close()
    raw = open(path, "rb").read()
    assert props.num_data_blocks >= 4 and props.num_filter_partitions == props.num_data_blocks
    absent = [k for k in (rng.randbytes(rng.randrange(1, 12)) for _ in range(60)) if k not in
              set(keys)]
    return path, raw, entries, absent, props


def regions(raw, props):
    """Named byte ranges of the file: each structure of docs/format.md, "SSTable"."""
    size = len(raw)
    footer = Footer.decode(raw[-TABLE_FOOTER_SIZE:], size, None)
    meta = Block(raw[footer.metaindex.offset: footer.metaindex.offset + footer.metaindex.size])
    handles = {name: decode_handle(meta.data, s, e)[0] for name, s, e in meta.entries()}
    region = -(-props.data_bytes // FILTER_PAGE_SIZE) * FILTER_PAGE_SIZE

    def span(h):
        return range(h.offset, h.offset + h.size + BLOCK_TRAILER_SIZE)

    return {
        "data": range(0, props.data_bytes),
        "padding": range(props.data_bytes, region),
        "filter": range(region, footer.meta_start),
        "filter_index": span(handles[b"sievekv.filter_index"]),
        "index": span(footer.index),
        "properties": span(handles[b"sievekv.properties"]),
        "metaindex": span(footer.metaindex),
        "footer": range(size - TABLE_FOOTER_SIZE, size),
    }


def check(path, entries, absent):
    """Open and read everything; each step must be right or raise CorruptionError.

    Returns the table's filter error count (None if open failed)."""
    try:
        t = Table.open(FileSystem(), path)
    except CorruptionError:
        return None
    try:
        for k, seq, kind, value in entries:
            try:
                assert t.get(k) == (seq, kind, value)
            except CorruptionError:
                pass
        for k in absent:
            try:
                assert t.get(k) is None
            except CorruptionError:
                pass
        got = []
        try:
            for e in t.iterate():
                got.append(e)
        except CorruptionError:
            assert got == entries[: len(got)]
        else:
            assert got == entries
        return t.filter_stats()["filter_errors"]
    finally:
        t.close()


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def positions(kind, span, rng):
    """Every byte of the metadata; for the larger regions the first bytes of every page (data:
    the whole first block's worth) and a random sample of the rest (keeps the test fast)."""
    if kind in ("filter", "padding") and len(span) > 400:
        starts = [o for o in span if (o - span.start) % FILTER_PAGE_SIZE < 8]
        return sorted(set(starts + rng.sample(list(span), 100)))
    if kind == "data":
        return sorted(set(span[:200]) | set(rng.sample(list(span), 150)))
    return list(span)


@pytest.mark.parametrize("kind", ["data", "padding", "filter", "filter_index", "index",
                                  "properties", "metaindex", "footer"])
def test_every_flipped_byte_is_an_error_or_a_right_answer(tmp_path, table, kind):
    path, raw, entries, absent, props = table
    span = regions(raw, props)[kind]
    assert len(span) > 0
    rng = random.Random(kind)
    bad_path = str(tmp_path / "bad.sst")
    opened = errors_seen = 0
    for off in positions(kind, span, rng):
        bad = bytearray(raw)
        bad[off] ^= 1 << rng.randrange(8)
        write(bad_path, bytes(bad))
        filter_errors = check(bad_path, entries, absent)
        if filter_errors is not None:
            opened += 1
            errors_seen += filter_errors > 0
    if kind in ("filter_index", "index", "properties", "metaindex", "footer"):
        assert opened == 0  # metadata is checked at open
    if kind == "filter":
        assert errors_seen > 0  # a damaged partition is detected and reported when probed
    if kind == "padding":
        assert opened == len(positions(kind, span, random.Random(kind)))


def test_cut_files_are_errors_or_right_answers(tmp_path, table):
    path, raw, entries, absent, props = table
    bad_path = str(tmp_path / "cut.sst")
    rng = random.Random(4)
    tail_start = regions(raw, props)["filter_index"].start
    cuts = set(range(tail_start, len(raw))) | set(rng.sample(range(tail_start), 100)) | {0, 1}
    for n in sorted(cuts):
        write(bad_path, raw[:n])
        assert check(bad_path, entries, absent) is None  # the footer moved: never opens


def test_unknown_filter_policy_means_may_match(tmp_path, table):
    """A table whose stored policy this build does not know reads correctly, unfiltered."""
    path, raw, entries, absent, props = table
    span = regions(raw, props)["properties"]
    block = Block(raw[span.start: span.stop - BLOCK_TRAILER_SIZE])
    p = decode_properties(block)
    assert p.filter_policy.endswith(".v1")
    p.filter_policy = p.filter_policy[:-1] + "9"  # same length: the layout does not move
    contents = encode_properties(p)
    assert len(contents) == len(block.data)
    bad = raw[: span.start] + seal(contents, BLOCK_TYPE_PROPERTIES) + raw[span.stop:]
    bad_path = str(tmp_path / "future.sst")
    write(bad_path, bad)
    fs = FileSystem()
    with Table.open(fs, bad_path) as t:
        for k, seq, kind, value in entries:
            assert t.get(k) == (seq, kind, value)
        for k in absent:
            assert t.get(k) is None
            assert t.may_match(k) or not (t.smallest <= k <= t.largest)
        s = t.filter_stats()
        assert s["policy_known"] is False and s["negatives"] == 0
        assert s["filter_errors"] >= len(entries)
        assert fs.counters.maps == 0  # nothing to decode, so nothing is mapped


def test_a_damaged_partition_answers_may_match_and_is_counted(tmp_path, table):
    path, raw, entries, absent, props = table
    region = regions(raw, props)["filter"]
    bad = bytearray(raw)
    for off in range(region.start, region.stop, FILTER_PAGE_SIZE):
        bad[off + 5] ^= 0xFF  # damage every partition
    bad_path = str(tmp_path / "bad_filter.sst")
    write(bad_path, bytes(bad))
    with Table.open(FileSystem(), bad_path) as t:
        for k in absent:
            assert t.get(k) is None
        for k, seq, kind, value in entries:
            assert t.get(k) == (seq, kind, value)
        s = t.filter_stats()
        assert s["negatives"] == 0 and s["filter_errors"] == s["probes"] > 0
        assert s["partitions_resident"] == 0  # bad partitions are never trusted...
        assert s["mapped_bytes"] > 0 and s["resident_bytes"] == 0  # ...nor kept in memory
