"""Data block compression (docs/format.md "Block compression", table format version 3).

Round trips for every setting and read mode, tables that mix compressed and raw blocks, DBs
whose tables were written with compression off and on, tables written before format 3, the
block cache for compressed blocks, table workers, the option and its config; and damaged or
fabricated compressed blocks (a flipped byte, a valid CRC over a bad stream, a wrong or huge
stated length, an unknown codec) through get, scan, verify and compaction: each is a
CorruptionError naming the file (and, in-process, the block's offset), never a wrong answer
and never the codec's own exception.
"""

from __future__ import annotations

import json
import os
import random
import struct

import pytest

from engine import DB
from engine.block_cache import BlockCache
from engine.checksum import masked_crc
from engine.errors import CorruptionError, InvalidArgumentError
from engine.format import (BLOCK_MAX_UNCOMPRESSED, BLOCK_TRAILER_SIZE, BLOCK_TYPE_DATA,
                           BLOCK_TYPE_METAINDEX, BLOCK_TYPE_PROPERTIES, KIND_DELETE, KIND_VALUE,
                           META_FILTER_INDEX, META_PROPERTIES, TABLE_FOOTER_SIZE)
from engine.sstable import Table, TableBuilder, TableOptions
from engine.sstable.block import Block
from engine.sstable.block_builder import BlockBuilder
from engine.sstable.coding import encode_varint, get_varint
from engine.sstable.footer import Footer
from engine.sstable.handle import BlockHandle, decode_handle, seal
from engine.sstable.verify import verify_table
from engine.vfs import FileSystem

SETTINGS = ["none", "lz4", "zstd"]
CODES = {"lz4": 0x41, "zstd": 0x71}  # the data block type byte: 1 | code << 4


def record(rng: random.Random, i: int) -> bytes:
    """A JSON-like record of ~100-300 bytes with repeated field names (compressible)."""
    return json.dumps({"id": i, "user": f"user{rng.randrange(10 ** 5):05d}",
                       "email": f"u{rng.randrange(10 ** 6)}@example.com",
                       "active": rng.random() < 0.5, "score": round(rng.random() * 100, 3),
                       "tags": ["alpha", "beta", "gamma", "delta"][:rng.randrange(5)],
                       "note": "x" * rng.randrange(150)}).encode()


def mixed_entries(rng: random.Random, n: int = 3000) -> list:
    """Sorted entries: the first third random 100-byte values (blocks stay raw), the rest
    records (blocks compress), with some tombstones: one table mixes both kinds of block."""
    out = []
    for i in range(n):
        key = b"key%07d" % i
        if i % 17 == 5:
            out.append((key, i + 1, KIND_DELETE, b""))
        elif i < n // 3:
            out.append((key, i + 1, KIND_VALUE, rng.randbytes(100)))
        else:
            out.append((key, i + 1, KIND_VALUE, record(rng, i)))
    return out


def write_table(path: str, entries: list, **opts):
    fs = FileSystem()
    w = fs.open_writable(path)
    b = TableBuilder(w, TableOptions(**opts))
    for e in entries:
        b.add(*e)
    props = b.finish()
    w.sync()
    w.close()
    return props


def block_types(path: str) -> list[int]:
    """The trailer type byte of every data block of the table at ``path``."""
    data = open(path, "rb").read()
    with Table.open(FileSystem(), path) as t:
        return [data[o + s] for o, s in zip(t._offsets, t._sizes)]


def check_reads(t: Table, entries: list, rng: random.Random) -> None:
    for k, seq, kind, value in entries:
        assert t.get(k) == (seq, kind, value)
    for _ in range(200):
        k = b"key%07d" % rng.randrange(10 ** 7) + b"x"
        assert t.get(k) is None
    assert list(t.iterate()) == entries
    start = entries[len(entries) // 2][0]
    assert list(t.iterate(start)) == [e for e in entries if e[0] >= start]


# ---------------------------------------------------------------------------------------------
# round trips
# ---------------------------------------------------------------------------------------------
MODES = {  # Table.open arguments
    "mapped": dict(mmap_reads=True),
    "mapped-in-place": dict(mmap_reads=True, verify_every_read=False),
    "pread-cache": dict(mmap_reads=False),
    "pread-no-cache": dict(mmap_reads=False, block_cache=None),
}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("setting", SETTINGS)
def test_round_trip_every_setting_and_read_mode(tmp_path, setting, mode):
    rng = random.Random(11)
    entries = mixed_entries(rng)
    path = str(tmp_path / "t.sst")
    props = write_table(path, entries, compression=setting)
    types = block_types(path)
    assert props.compression == setting
    assert props.compressed_data_blocks == sum(t != BLOCK_TYPE_DATA for t in types)
    if setting == "none":
        assert set(types) == {BLOCK_TYPE_DATA} and props.format_version == 2
        assert props.uncompressed_data_bytes == props.data_bytes
    else:
        # one table mixes raw blocks (random values) and compressed ones (records)
        assert set(types) == {BLOCK_TYPE_DATA, CODES[setting]} and props.format_version == 3
        assert props.uncompressed_data_bytes > 1.5 * props.data_bytes
    kw = dict(MODES[mode])
    kw.setdefault("block_cache", BlockCache(1 << 20))
    with Table.open(FileSystem(), path, **kw) as t:
        assert t.properties == props
        check_reads(t, entries, rng)
        check_reads(t, entries, rng)  # again: from the cache / the marks of the first pass
        assert verify_table(t)["data_blocks"] == props.num_data_blocks


@pytest.mark.parametrize("setting", ["lz4", "zstd"])
def test_restart_interval_16_and_no_hash_index(tmp_path, setting):
    """Tables of another restart interval read compressed blocks as Blocks, through the block
    cache in mapped mode too."""
    rng = random.Random(12)
    entries = mixed_entries(rng, 2000)
    path = str(tmp_path / "t.sst")
    props = write_table(path, entries, compression=setting, restart_interval=16,
                        data_block_hash_index=False)
    assert props.compressed_data_blocks and props.format_version == 3
    for mmap_reads in (True, False):
        cache = BlockCache(1 << 20)
        with Table.open(FileSystem(), path, mmap_reads=mmap_reads, block_cache=cache) as t:
            check_reads(t, entries, rng)
            reads = t.data_block_file_reads
            for k, *_ in entries[-200:]:
                t.get(k)
            assert t.data_block_file_reads == reads  # every block came from the cache
            assert cache.hits


def test_a_hot_compressed_block_is_decompressed_once(tmp_path):
    """Mapped gets keep a compressed block's contents in the block cache (mark 2): the second
    get of the block reads nothing from the file. Raw blocks keep the mapped path."""
    rng = random.Random(13)
    entries = mixed_entries(rng, 1500)
    path = str(tmp_path / "t.sst")
    write_table(path, entries, compression="lz4")
    types = block_types(path)
    cache = BlockCache(1 << 20)
    with Table.open(FileSystem(), path, mmap_reads=True, block_cache=cache) as t:
        last = entries[-1]
        i = len(types) - 1
        assert types[i] == CODES["lz4"] and types[0] == BLOCK_TYPE_DATA
        assert t.get(last[0]) == last[1:]
        assert t._in_place[i] == 2 and len(cache) == 1
        reads, hits = t.data_block_file_reads, cache.hits
        for _ in range(5):
            assert t.get(last[0]) == last[1:]
        assert t.data_block_file_reads == reads and cache.hits == hits + 5
        first = entries[0]
        assert t.get(first[0]) == first[1:]  # a raw block: mapped, not cached
        assert t._in_place[0] == 0 and len(cache) == 1
    # Without a block cache a compressed block is decompressed on every get, and read right.
    with Table.open(FileSystem(), path, mmap_reads=True, block_cache=None) as t:
        for _ in range(3):
            assert t.get(last[0]) == last[1:]
        assert t.data_block_file_reads == 3


def test_a_block_over_the_maximum_is_stored_raw(tmp_path):
    """The writer rule: a block above BLOCK_MAX_UNCOMPRESSED is stored as built, however
    well it would compress (a reader refuses a larger stated length)."""
    path = str(tmp_path / "t.sst")
    big = bytes(BLOCK_MAX_UNCOMPRESSED + 1)
    entries = [(b"a", 1, KIND_VALUE, b"small " * 200), (b"b", 2, KIND_VALUE, big),
               (b"c", 3, KIND_VALUE, b"small " * 200)]
    props = write_table(path, entries, compression="lz4", filter_policy=None, block_size=256)
    assert block_types(path) == [CODES["lz4"], BLOCK_TYPE_DATA, CODES["lz4"]]
    with Table.open(FileSystem(), path) as t:
        assert t.get(b"b") == (2, KIND_VALUE, big)
        assert verify_table(t)["data_blocks"] == 3
    assert props.compressed_data_blocks == 2


def test_bad_compression_names_are_refused(tmp_path):
    for bad in ("gzip", "LZ4", None, 4):
        with pytest.raises(InvalidArgumentError, match="compression"):
            TableOptions(compression=bad)
        with pytest.raises(InvalidArgumentError, match="compression"):
            DB.open(str(tmp_path / "db"), compression=bad, table_workers=0)


# ---------------------------------------------------------------------------------------------
# DBs: settings changed between opens, workers, stats, config
# ---------------------------------------------------------------------------------------------
def _fill(db, rng, start, n, model):
    for i in range(start, start + n):
        k = b"key%07d" % i
        v = rng.randbytes(100) if i % 3 == 0 else record(rng, i)
        db.put(k, v)
        model[k] = v


def test_a_db_reads_tables_written_with_compression_off_and_on(tmp_path):
    """One DB, three opens with compression none, lz4 and zstd: each flush keeps the setting
    it was written with (format 2, then 3), everything reads, stats show the ratio per level,
    and a full compaction rewrites every table with the setting of the open that runs it."""
    path = str(tmp_path / "db")
    rng = random.Random(14)
    model: dict = {}
    opts = dict(table_workers=0, disable_auto_compactions=True)
    for n, setting in enumerate(SETTINGS):
        with DB.open(path, compression=setting, **opts) as db:
            _fill(db, rng, n * 2000, 2000, model)
            db.flush()
            assert db.multi_get(list(model)) == list(model.values())
    with DB.open(path, compression="zstd", **opts) as db:
        tables = sorted(db._rs.l0, key=lambda t: t.file_number)
        assert [t.properties.compression for t in tables] == SETTINGS
        assert [t.properties.format_version for t in tables] == [2, 3, 3]
        st = db.stats()
        assert st["compression"]["setting"] == "zstd"
        l0 = st["levels"][0]
        assert l0["uncompressed_data_bytes"] == sum(t.properties.uncompressed_data_bytes
                                                    for t in tables)
        assert l0["data_bytes"] == sum(t.properties.data_bytes for t in tables)
        assert l0["compression_ratio"] == st["compression"]["ratio"] > 1.3
        assert list(db.scan()) == sorted(model.items())
        assert db.verify()["damaged"] == []
        db.compact()
        st = db.stats()
        assert st["levels"][0]["tables"] == 0
        bottom = [lv for lv in st["levels"] if lv["tables"]]
        assert len(bottom) == 1 and bottom[0]["compression_ratio"] > 1.5
        assert bottom[0]["compressed_data_blocks"] > 0
        assert db.multi_get(list(model)) == list(model.values())
        assert db.verify()["damaged"] == []
    with DB.open(path, compression="none", **opts) as db:  # reads what zstd wrote
        assert list(db.scan()) == sorted(model.items())


def test_compression_none_writes_what_format_2_readers_read(tmp_path):
    """compression "none": no compressed block, format version 2 (1 without hash indexes),
    ratio 1.0 in stats."""
    path = str(tmp_path / "db")
    model: dict = {}
    with DB.open(path, compression="none", table_workers=0) as db:
        _fill(db, random.Random(15), 0, 1000, model)
        db.flush()
        (t,) = db._rs.l0
        assert t.properties.format_version == 2 and t.properties.compressed_data_blocks == 0
        assert set(block_types(t.path)) == {BLOCK_TYPE_DATA}
        assert db.stats()["compression"]["ratio"] == 1.0


def test_table_workers_write_compressed_tables(tmp_path):
    path = str(tmp_path / "db")
    model: dict = {}
    with DB.open(path, compression="lz4", table_workers=1, memtable_bytes=256 * 1024) as db:
        _fill(db, random.Random(16), 0, 6000, model)
        db.flush()
        db.compact()
        st = db.stats()
        assert st["table_workers"]["jobs_in_process"] > 0
        assert st["table_workers"]["fallbacks_to_threads"] == 0
        live = [t for t in db._rs.l0] + [t for lv in db._rs.levels for t in lv[3]]
        assert live and all(t.properties.compression == "lz4" for t in live)
        assert all(t.properties.compressed_data_blocks > 0 for t in live)
        assert db.multi_get(list(model)) == list(model.values())
        assert list(db.scan()) == sorted(model.items())


def test_config_compression_reaches_the_shard_command_line():
    from router import config as c, launch

    cfg = c.loads('[engine]\ncompression = "zstd"\n')
    assert cfg.engine["compression"] == "zstd"
    argv = launch.shard_spec(cfg, cfg.shards[0]).argv
    assert 'compression="zstd"' in argv
    assert c.loads("").engine["compression"] == "lz4"  # the default: no override
    assert not any(a.startswith("compression=") for a in launch.shard_spec(
        c.loads(""), c.loads("").shards[0]).argv)
    with pytest.raises(c.ConfigError, match="compression"):
        c.loads('[engine]\ncompression = "gzip"\n')


def test_stats_cli_shows_the_ratio():
    from router.cli.report_cmds import STATS_COLUMNS

    cell = dict(STATS_COLUMNS)["COMPRESSED"]
    assert cell({"compression": {"ratio": 2.914}}) == "2.91x"
    assert cell({"compression": {"ratio": None}}) == "-"
    assert cell({}) == "-"


# ---------------------------------------------------------------------------------------------
# tables written before format 3
# ---------------------------------------------------------------------------------------------
def strip_new_properties(path: str) -> None:
    """Rewrite the table at ``path`` as a writer before format 3 did: its properties block
    without compression, compressed_data_blocks and uncompressed_data_bytes (the metaindex and
    footer that follow it are rewritten to match)."""
    data = open(path, "rb").read()
    footer = Footer.decode(data[-TABLE_FOOTER_SIZE:], len(data), path)
    mi = footer.metaindex
    meta = Block(data[mi.offset:mi.offset + mi.size])
    handles = {name: decode_handle(meta.data, s, e)[0] for name, s, e in meta.whole_entries()}
    ph = handles[META_PROPERTIES]
    props = Block(data[ph.offset:ph.offset + ph.size])
    b = BlockBuilder(1)
    for name, s, e in props.whole_entries():
        if name not in (b"compression", b"compressed_data_blocks", b"uncompressed_data_bytes"):
            b.add(name, props.data[s:e])
    new_props = b.finish()
    out = bytearray(data[:ph.offset]) + seal(new_props, BLOCK_TYPE_PROPERTIES)
    m = BlockBuilder(1)
    if META_FILTER_INDEX in handles:
        m.add(META_FILTER_INDEX, handles[META_FILTER_INDEX].encode())
    m.add(META_PROPERTIES, BlockHandle(ph.offset, len(new_props)).encode())
    meta_contents = m.finish()
    new_mi = BlockHandle(len(out), len(meta_contents))
    out += seal(meta_contents, BLOCK_TYPE_METAINDEX)
    out += Footer(new_mi, footer.index, footer.meta_start, footer.version).encode()
    with open(path, "wb") as f:
        f.write(out)


@pytest.mark.parametrize("hashed", [True, False])
def test_tables_written_before_format_3_still_open(tmp_path, hashed):
    rng = random.Random(17)
    entries = mixed_entries(rng, 1500)
    path = str(tmp_path / "t.sst")
    write_table(path, entries, data_block_hash_index=hashed)
    strip_new_properties(path)
    with Table.open(FileSystem(), path) as t:
        p = t.properties
        assert p.format_version == (2 if hashed else 1)
        assert (p.compression, p.compressed_data_blocks) == ("none", 0)
        assert p.uncompressed_data_bytes == p.data_bytes
        check_reads(t, entries, rng)
        assert verify_table(t)["data_blocks"] == p.num_data_blocks
    raw = open(path, "rb").read()
    assert b"uncompressed_data_bytes" not in raw and b"compression" not in raw


# ---------------------------------------------------------------------------------------------
# damaged and fabricated compressed blocks
# ---------------------------------------------------------------------------------------------
DAMAGE = ["flipped-byte", "bad-stream", "length-minus-1", "length-plus-1", "length-huge",
          "unknown-codec", "truncated-stream"]


def damage_block(path: str, i: int, how: str) -> int:
    """Damage data block ``i`` (compressed) of the table at ``path`` in place, keeping its
    size; every kind but ``flipped-byte`` gets a valid CRC. Returns the block's offset."""
    data = bytearray(open(path, "rb").read())
    with Table.open(FileSystem(), path) as t:
        off, size = t._offsets[i], t._sizes[i]
    stored, btype = bytes(data[off:off + size]), data[off + size]
    assert btype in CODES.values()
    raw_len, pos = get_varint(stored, 0, 5)
    assert pos == 2, "the fabricated lengths below keep a 2-byte varint's place"
    if how == "flipped-byte":
        data[off + size // 2] ^= 0x10
    else:
        if how == "bad-stream":
            stored = stored[:2] + bytes(b ^ 0xA5 for b in stored[2:])
        elif how == "length-minus-1":
            stored = encode_varint(raw_len - 1) + stored[2:]
        elif how == "length-plus-1":
            stored = encode_varint(raw_len + 1) + stored[2:]
        elif how == "length-huge":  # 2**31: must be refused before anything is allocated
            stored = encode_varint(1 << 31) + stored[5:]
        elif how == "truncated-stream":  # the stream's last bytes replaced by zeros
            stored = stored[:-8] + bytes(8)
        elif how == "unknown-codec":
            btype = BLOCK_TYPE_DATA | 5 << 4  # RocksDB's LZ4HC: not a code of ours
        assert len(stored) == size
        data[off:off + size] = stored
        data[off + size] = btype
        crc = masked_crc(stored + bytes((btype,)))
        data[off + size + 1:off + size + BLOCK_TRAILER_SIZE] = struct.pack("<I", crc)
    with open(path, "wb") as f:
        f.write(data)
    return off


def assert_names_the_block(exc: BaseException, path: str, offset: int | None) -> None:
    assert isinstance(exc, CorruptionError), repr(exc)
    assert exc.__cause__ is None and exc.__suppress_context__ or exc.__context__ is None
    assert path in str(exc)
    if offset is not None:
        assert exc.offset == offset and f"offset {offset}" in str(exc)
    assert "LZ4BlockError" not in str(exc) and "ZstdError" not in str(exc)


@pytest.mark.parametrize("how", DAMAGE)
@pytest.mark.parametrize("setting", ["lz4", "zstd"])
def test_damaged_compressed_block_in_a_table(tmp_path, setting, how):
    """get (each read mode), scan and verify of the damaged block: CorruptionError naming the
    file and the block's offset; every other block still reads right."""
    rng = random.Random(18)
    entries = mixed_entries(rng, 1500)
    path = str(tmp_path / "t.sst")
    write_table(path, entries, compression=setting)
    types = block_types(path)
    i = len(types) - 2
    assert types[i] == CODES[setting]
    with Table.open(FileSystem(), path) as t:
        victims = [e for e in entries if bisect_block(t, e[0]) == i]
        others = [e for e in entries if bisect_block(t, e[0]) != i]
    off = damage_block(path, i, how)
    for kw in MODES.values():
        kw = dict(kw)
        kw.setdefault("block_cache", BlockCache(1 << 20))
        with Table.open(FileSystem(), path, **kw) as t:
            for k, *_ in victims[:3] + victims[-2:]:
                with pytest.raises(CorruptionError) as ei:
                    t.get(k)
                assert_names_the_block(ei.value, path, off)
            for k, *rest in others[::7]:
                assert t.get(k) == tuple(rest)
            with pytest.raises(CorruptionError) as ei:
                list(t.iterate())
            assert_names_the_block(ei.value, path, off)
    with Table.open(FileSystem(), path) as t:
        with pytest.raises(CorruptionError) as ei:
            verify_table(t)
        assert_names_the_block(ei.value, path, off)


def bisect_block(t: Table, key: bytes) -> int:
    from bisect import bisect_left

    return bisect_left(t._index_keys, key)


@pytest.mark.parametrize("how", ["flipped-byte", "bad-stream", "length-plus-1", "length-huge"])
@pytest.mark.parametrize("workers", [0, 1])
def test_damaged_compressed_block_in_a_db(tmp_path, how, workers):
    """Through the DB: get and scan raise CorruptionError naming the table, verify lists it
    with the block's offset, and a compaction that reads it fails with CorruptionError naming
    the table (in a table worker too) instead of writing a wrong table."""
    path = str(tmp_path / "db")
    model: dict = {}
    opts = dict(compression="lz4", table_workers=workers, disable_auto_compactions=True)
    with DB.open(path, **opts) as db:
        _fill(db, random.Random(19), 0, 3000, model)
        db.flush()
        (t,) = db._rs.l0
        table_path = t.path
        types = block_types(table_path)
        i = len(types) - 3
        assert types[i] == CODES["lz4"]
        victim = next(k for k in sorted(model) if bisect_block(t, k) == i)
    off = damage_block(table_path, i, how)
    with DB.open(path, **opts) as db:
        with pytest.raises(CorruptionError) as ei:
            db.get(victim)
        assert_names_the_block(ei.value, table_path, off)
        with pytest.raises(CorruptionError) as ei:
            list(db.scan())
        assert_names_the_block(ei.value, table_path, off)
        report = db.verify()
        assert [(d["file"], d["offset"]) for d in report["damaged"]] == [(table_path, off)]
        with pytest.raises(CorruptionError) as ei:
            db.compact()
        assert table_path in str(ei.value) and f"offset {off}" in str(ei.value)
    assert os.path.exists(table_path)  # the damaged input was not replaced
