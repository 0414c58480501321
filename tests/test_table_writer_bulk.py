"""write_tables' bulk path (TableBuilder.add_many) against the one-entry-at-a-time loop it
replaced: the same tables, byte for byte, cut at the same keys.

The reference below is write_tables' loop as it was before session 15 (each entry through
TableBuilder.add, the size checks and grandparent cuts decided per entry). Random batches with
tombstones, large values, tiny and ordinary target sizes, grandparents, every restart
interval, with and without a hash index, filter or compression, must give identical files.
"""

from __future__ import annotations

import os
import random
from collections import namedtuple

import pytest

from engine.errors import InvalidArgumentError
from engine.format import KIND_DELETE, KIND_VALUE
from engine.sstable import TableBuilder, TableOptions
from engine.table_writer import (SIZE_CHECK_EVERY, SIZE_CHECK_FRACTION, meta_from_properties,
                                 write_tables)
from engine.vfs import default_fs

Grandparent = namedtuple("Grandparent", "smallest largest size")


def _reference_write_tables(fs, dirname, batches, *, new_number, table_options,
                            target_file_size=None, grandparents=None,
                            max_grandparent_overlap=None, drop_tombstones=False):
    """write_tables before session 15: one TableBuilder.add per entry."""
    outputs, state = [], {"builder": None, "wfile": None, "number": 0}
    gp = grandparents or []
    gi = overlapped = 0
    seen_key = False

    def open_next():
        number = new_number()
        wfile = fs.open_writable(os.path.join(dirname, f"{number:06d}.sst"))
        state.update(builder=TableBuilder(wfile, table_options), wfile=wfile, number=number)

    def finish_current():
        b, wfile = state["builder"], state["wfile"]
        state["builder"] = None
        if b.num_entries == 0:
            b.abandon()
            wfile.close()
            return
        props = b.finish()
        wfile.close()
        outputs.append(meta_from_properties(state["number"], b.file_size, props))

    since_check = since_bytes = 0
    check_bytes = (target_file_size // SIZE_CHECK_FRACTION) if target_file_size else 0
    for batch in batches:
        b = state["builder"]
        for key, seq, kind, value in batch:
            if drop_tombstones and kind == KIND_DELETE:
                continue
            if gp:
                while gi < len(gp) and key > gp[gi].largest:
                    if seen_key:
                        overlapped += gp[gi].size
                    gi += 1
                seen_key = True
                if b is not None and max_grandparent_overlap is not None \
                        and overlapped > max_grandparent_overlap:
                    finish_current()
                    overlapped = 0
                    b = None
            if b is None:
                open_next()
                b = state["builder"]
            b.add(key, seq, kind, value)
            if target_file_size is not None:
                since_check += 1
                since_bytes += len(key) + len(value)
                if since_check >= SIZE_CHECK_EVERY or since_bytes >= check_bytes:
                    since_check = since_bytes = 0
                    if b.estimated_file_size() >= target_file_size:
                        finish_current()
                        b = None
    if state["builder"] is not None:
        finish_current()
    return outputs


def _entries(rnd: random.Random, n: int, big_values: bool) -> list:
    sizes = (0, 1, 100, 100, 100, 119, 120, 127, 128, 300) + ((5000,) if big_values else ())
    keys = sorted({rnd.randbytes(rnd.choice((1, 4, 16, 16, 16, 40, 200))) for _ in range(n)})
    out = []
    for k in keys:
        kind = KIND_DELETE if rnd.random() < 0.15 else KIND_VALUE
        size = rnd.choice(sizes)
        value = b"" if kind == KIND_DELETE else rnd.randbytes(size)
        out.append((k, rnd.randrange(1, 1 << 40), kind, value))
    return out


def _batches(rnd: random.Random, entries: list) -> list:
    out, i = [], 0
    while i < len(entries):
        n = rnd.choice((1, 3, 31, 32, 33, 100, 2048))
        out.append(entries[i:i + n])
        i += n
    return out


def _files(dirname: str, metas) -> list:
    out = []
    for m in metas:
        with open(os.path.join(dirname, f"{m.number:06d}.sst"), "rb") as f:
            out.append((m.number, m.smallest, m.largest, m.num_entries, f.read()))
    return out


@pytest.mark.parametrize("seed", range(80))
def test_bulk_path_writes_the_tables_the_entry_loop_wrote(tmp_path, seed):
    rnd = random.Random(seed)
    # Small values let the every-32-entries size check decide (targets of 128-256 KiB: 32
    # entries hold less than 1/32 of the target); big ones, the bytes rule.
    entries = _entries(rnd, rnd.choice((1, 50, 700, 3000)), big_values=rnd.random() < 0.4)
    opts = TableOptions(
        block_size=rnd.choice((64, 1024, 4096)),
        restart_interval=rnd.choice((1, 1, 1, 16)),
        data_block_hash_index=rnd.random() < 0.7,
        compression=rnd.choice(("none", "lz4")),
        filter_policy=rnd.choice(("blocked-bloom", "bloom", None)),
        creation_time=1_700_000_000)
    target = rnd.choice((None, 20, 3000, 64 * 1024, 128 * 1024, 256 * 1024, 4 << 20))
    grandparents, gp_limit = [], None
    if rnd.random() < 0.6:
        cuts = sorted(rnd.sample([e[0] for e in entries], min(len(entries), rnd.randrange(1, 30))))
        grandparents = [Grandparent(c, c, rnd.randrange(1, 50_000)) for c in cuts]
        gp_limit = rnd.choice((0, 10_000, 100_000))
    drop = rnd.random() < 0.5
    batches = _batches(rnd, entries)
    results = []
    for name, fn in (("ref", _reference_write_tables), ("new", write_tables)):
        d = tmp_path / name
        d.mkdir()
        numbers = iter(range(10, 100_000))
        # write_tables also takes iterators as batches (a flush job's entries)
        given = [iter(b) if name == "new" and k % 2 else list(b) for k, b in enumerate(batches)]
        metas = fn(default_fs(), str(d), given,
                   new_number=lambda: next(numbers), table_options=opts,
                   target_file_size=target, grandparents=grandparents,
                   max_grandparent_overlap=gp_limit, drop_tombstones=drop)
        results.append(_files(str(d), metas))
    ref, new = results
    assert [r[:4] for r in new] == [r[:4] for r in ref], f"seed {seed}: tables cut differently"
    assert new == ref, f"seed {seed}: table bytes differ"


def test_add_many_stops_after_the_entry_that_reaches_max_bytes(tmp_path):
    fs = default_fs()
    entries = [(b"k%03d" % i, i + 1, KIND_VALUE, b"v" * 10) for i in range(20)]
    b = TableBuilder(fs.open_writable(str(tmp_path / "a.sst")), TableOptions())
    assert b.add_many(entries, 0, 20, max_bytes=30) == (3, 42)  # 14 bytes each: 14, 28, 42
    assert b.add_many(entries, 3, 5) == (5, 28)
    assert b.num_entries == 5
    b.abandon()


def test_add_many_rejects_what_add_rejects_and_keeps_what_it_added(tmp_path):
    """An entry out of order raises the error add() raises; the entries before it stay added
    (their properties counted), as with a loop of add(); the builder goes on."""
    fs = default_fs()
    entries = [(b"a", 1, KIND_VALUE, b"x"), (b"b", 2, KIND_DELETE, b""), (b"b", 3, KIND_VALUE, b"y")]
    b = TableBuilder(fs.open_writable(str(tmp_path / "a.sst")), TableOptions())
    with pytest.raises(InvalidArgumentError, match="not greater"):
        b.add_many(entries, 0, 3)
    assert b.num_entries == 2
    with pytest.raises(InvalidArgumentError, match="bad entry kind"):
        b.add_many([(b"c", 4, 9, b"z")], 0, 1)
    with pytest.raises(InvalidArgumentError, match="out of range"):
        b.add_many([(b"c", -1, KIND_DELETE, b"")], 0, 1)
    b.add_many([(b"c", 4, KIND_VALUE, b"z")], 0, 1)
    props = b.finish()
    assert (props.num_entries, props.num_tombstones, props.raw_key_bytes, props.raw_value_bytes,
            props.smallest_seq, props.largest_seq) == (3, 1, 3, 2, 1, 4)
