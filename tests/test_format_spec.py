"""docs/format.md as a spec: an independent reader written from the document alone.

The decoder below (everything above "The engine writes, the spec reads") uses only the standard
library, mmh3, google_crc32c, and lz4 and zstandard (the codecs "Block compression" names): it
imports nothing from engine/. Each function names the
section of docs/format.md it implements. The tests have the real engine write a DB in tmp_path
(puts, deletes, batches, flushes, compactions, reopen), then decode every file with this reader
and check that every entry, CRC, filter bit, property and byte is explained by the document.

Where the document is wrong or silent, the test that shows it is marked
``xfail(strict=True)`` with the sentence at fault: fixing docs/format.md (or the code) turns it
into a pass, and strict makes that visible.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import random
import re
import struct
import time

import google_crc32c
import lz4.block
import mmh3
import zstandard
import pytest

PAGE = 4096


class SpecError(Exception):
    """Bytes the document does not allow."""


def need(cond, what: str) -> None:
    if not cond:
        raise SpecError(what)


def round_up(n: int, to: int = PAGE) -> int:
    return -(-n // to) * to


# --- "Checksums" ---------------------------------------------------------------------------
def masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(bytes(data))
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# --- "Varints" (SSTable) and "Version edit" (LEB128, at most 10 bytes) ----------------------
def varint(buf: bytes, pos: int, end: int, max_bytes: int) -> tuple[int, int]:
    value = 0
    for i in range(max_bytes):
        need(pos < end, "truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << (7 * i)
        if not b & 0x80:
            return value, pos
    raise SpecError("varint too long")


class Cover:
    """Marks which bytes of a file some structure of the document explains (each at most once)."""

    def __init__(self, size: int):
        self.size, self.spans = size, []

    def mark(self, start: int, end: int, what: str) -> None:
        need(0 <= start <= end <= self.size, f"{what} [{start}, {end}) outside the file")
        self.spans.append((start, end, what))

    def check_all(self) -> int:
        pos = 0
        for start, end, what in sorted(self.spans):
            need(start == pos, f"bytes [{pos}, {start}) unexplained or {what} overlaps")
            pos = end
        need(pos == self.size, f"bytes [{pos}, {self.size}) unexplained")
        return pos


# --- "Blocks", "Data block hash index" -------------------------------------------------------
HASH_FLAG, HASH_SEED = 0x80000000, 0x53484958


def hash_start(key: bytes, slots: int) -> int:
    return mmh3.hash(key, HASH_SEED, signed=False) % slots


def build_hash_slots(keys: list[bytes]) -> bytes:
    """The slots a writer places for ``keys`` (entry i = restart point i), B = 2R."""
    b = 2 * len(keys)
    slots = bytearray(b)
    for i, key in enumerate(keys):
        s = hash_start(key, b)
        while slots[s]:
            s = (s + 1) % b
        slots[s] = i + 1
    return bytes(slots)


def hash_lookup(slots: bytes, keys: list[bytes], key: bytes) -> int | None:
    s = hash_start(key, len(slots))
    for _ in range(len(slots)):
        if slots[s] == 0:
            return None
        if keys[slots[s] - 1] == key:
            return slots[s] - 1
        s = (s + 1) % len(slots)
    raise SpecError("hash index without an empty slot")


class Block:
    """One block's contents ("Blocks"): ``entries`` (key, value), ``offsets`` of the entries,
    ``restarts``, and ``slots`` (the hash index, or None). Checks every invariant of the section
    and, for a hash index, that its slots are exactly the ones the placement rule gives."""

    def __init__(self, contents: bytes, interval: int = 1):
        c, n = contents, len(contents)
        need(n >= 8, "block shorter than an empty block")
        last = struct.unpack_from("<I", c, n - 4)[0]
        r, end, self.slots = last & ~HASH_FLAG, n - 4, None
        if last & HASH_FLAG:
            num_slots = struct.unpack_from("<H", c, end - 2)[0]
            need(num_slots > r, "hash index needs B > R")
            self.slots, end = c[end - 2 - num_slots:end - 2], end - 2 - num_slots
        limit = end - 4 * r
        need(r >= 1 and limit >= 0, "restart array outside the block")
        self.restarts = list(struct.unpack_from(f"<{r}I", c, limit))
        self.entries, self.offsets, pos, prev = [], [], 0, b""
        offsets = self.offsets
        while pos < limit:  # entries: shared | non_shared | value_len | key_suffix | value
            offsets.append(pos)
            shared, pos = varint(c, pos, limit, 5)
            non_shared, pos = varint(c, pos, limit, 5)
            vlen, pos = varint(c, pos, limit, 5)
            need(shared <= len(prev) and pos + non_shared + vlen <= limit, "entry past the restarts")
            key = prev[:shared] + c[pos:pos + non_shared]
            self.entries.append((key, c[pos + non_shared:pos + non_shared + vlen]))
            pos, prev = pos + non_shared + vlen, key
            if offsets[-1] in self.restarts:
                need(shared == 0, "restart point with shared > 0")
        # An empty block is the restart array [0], R = 1; else restarts are every interval-th entry.
        need(self.restarts == (offsets[::interval] or [0]), f"restarts are not every {interval}th entry")
        self.keys = [k for k, _ in self.entries]
        need(all(a < b for a, b in zip(self.keys, self.keys[1:])), "keys not strictly increasing")
        if self.slots is not None:
            need(interval == 1 and len(self.slots) == 2 * r, "hash index needs interval 1, B = 2R")
            need(self.slots == build_hash_slots(self.keys), "hash slots not placed as the doc says")
            for i, key in enumerate(self.keys):
                need(hash_lookup(self.slots, self.keys, key) == i, "hash lookup misses a key")


def decode_handle(value: bytes) -> tuple[int, int]:
    offset, pos = varint(value, 0, len(value), 10)
    size, pos = varint(value, pos, len(value), 10)
    need(pos == len(value), "trailing bytes after a handle")
    return offset, size


# --- "Properties block" --------------------------------------------------------------------
PROPERTIES = {
    **dict.fromkeys(["num_entries", "num_tombstones", "smallest_seq", "largest_seq",
                     "raw_key_bytes", "raw_value_bytes", "data_bytes", "index_bytes",
                     "num_data_blocks", "filter_bytes", "filter_index_bytes",
                     "num_filter_partitions", "block_size", "restart_interval",
                     "partition_bytes", "format_version", "creation_time",
                     "compressed_data_blocks", "uncompressed_data_bytes"], "int"),
    "compression": "str",
    "smallest_key": "bytes", "largest_key": "bytes", "filter_policy": "str",
    "filter_params": "json", "bits_per_key": "float", "effective_bits_per_key": "float",
}
# "Properties block": names a table written before format 3 may lack, and what a reader takes.
OPTIONAL_PROPERTIES = {"compression": "none", "compressed_data_blocks": 0,
                       "uncompressed_data_bytes": None}  # None: data_bytes


def decode_property(enc: str, raw: bytes):
    if enc == "int":
        value, pos = varint(raw, 0, len(raw), 10)
        need(pos == len(raw), "trailing bytes after an int property")
        return value
    if enc == "float":
        need(len(raw) == 8, "float property not 8 bytes")
        return struct.unpack("<d", raw)[0]
    if enc == "json":
        value = json.loads(raw.decode("utf-8"))
        need(isinstance(value, dict), "json property not an object")
        return value
    return raw.decode("utf-8") if enc == "str" else raw


# --- "Filter encodings" --------------------------------------------------------------------
CLASSIC, BLOCKED = "sievekv.BloomFilter.v1", "sievekv.BlockedBloomFilter.v1"


def digest(key: bytes, seed: int) -> bytes:
    return mmh3.mmh3_x64_128_digest(key, seed)


def classic_bits(key: bytes, m: int, k: int) -> list[int]:
    h1, h2 = struct.unpack("<QQ", digest(key, 0))
    a, step, bits = h1 % m, h2 % m, []
    for _ in range(k):
        bits.append(a)
        a = (a + step) % m
    return bits


def blocked_bits(key: bytes, lines: int, k: int) -> list[int]:
    d = digest(key, 0)
    line = (struct.unpack_from("<I", d)[0] * lines) >> 32
    modulo = 480 if line == lines - 1 else 512
    words, seed, probes = list(struct.unpack_from("<6H", d, 4)), 1, []
    for i in range(10_000):
        if len(probes) == k:
            return [512 * line + p for p in probes]
        if i == len(words):
            words += struct.unpack("<8H", digest(key, seed))
            seed += 1
        if words[i] % modulo not in probes:
            probes.append(words[i] % modulo)
    raise SpecError("no k distinct probes")


def choose_num_probes(bpk: float) -> int:
    """Blocked rule 4 (RocksDB's FastLocalBloomImpl::ChooseNumProbes)."""
    mb = math.floor(bpk * 1000 + 0.500001)
    for limit, k in ((2080, 1), (3580, 2), (5100, 3), (6640, 4), (8300, 5), (10070, 6),
                     (11720, 7), (14001, 8), (16050, 9), (18300, 10), (22001, 11), (25501, 12)):
        if mb <= limit:
            return k
    return (mb - 1) // 2000 - 1 if mb <= 50000 else 24


def filter_k(policy: str, bpk: float) -> int:
    if policy == BLOCKED:
        return choose_num_probes(bpk)
    return min(30, max(1, math.floor(bpk * math.log(2) + 0.5)))  # classic


def estimate_size(policy: str, n: int, bpk: float) -> int:
    bits_bytes = math.ceil(math.ceil(n * bpk) / 8)
    if policy == CLASSIC:
        return max(8, bits_bytes) + 4
    return 64 * max(1, math.ceil((bits_bytes + 4) / 64))


def build_filter(policy: str, keys: list[bytes], size_bytes: int, k: int) -> bytes:
    """The filter a writer builds, as the document describes it (bits, then the trailer)."""
    if policy == CLASSIC:
        n = max(8, size_bytes - 4)
        bits, check, marker = bytearray(n), n % 65536, 0xB1
        positions = (lambda key: classic_bits(key, 8 * n, k))
    else:
        lines = max(1, size_bytes // 64)
        bits, check, marker = bytearray(64 * lines - 4), lines % 65536, 0xB2
        positions = (lambda key: blocked_bits(key, lines, k))
    for key in keys:
        for j in positions(key):
            bits[j // 8] |= 1 << (j % 8)
    return bytes(bits) + struct.pack("<BHB", k, check, marker)


def may_match(policy: str, filt: bytes, key: bytes) -> bool:
    """Reading rules (filter bytes): malformed answers True; k from the trailer."""
    if len(filt) < 4:
        return True
    k, check, marker = struct.unpack_from("<BHB", filt, len(filt) - 4)
    if not 1 <= k <= 30:
        return True
    if policy == CLASSIC and marker == 0xB1 and len(filt) >= 12 and check == (len(filt) - 4) % 65536:
        bits = classic_bits(key, 8 * (len(filt) - 4), k)
    elif (policy == BLOCKED and marker == 0xB2 and len(filt) >= 64 and len(filt) % 64 == 0
          and check == (len(filt) // 64) % 65536):
        bits = blocked_bits(key, len(filt) // 64, k)
    else:
        return True
    return all(filt[j // 8] >> (j % 8) & 1 for j in bits)


# --- "Block compression" -------------------------------------------------------------------
LZ4, ZSTD = 4, 7  # compression codes: the high 4 bits of a data block's type byte
MAX_RAW = 16 * 2 ** 20  # BLOCK_MAX_UNCOMPRESSED


def encode_varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def decompress(stored: bytes, code: int) -> bytes:
    """stored bytes := raw_len varint32 | stream; the stream decodes to exactly raw_len bytes."""
    raw_len, pos = varint(stored, 0, len(stored), 5)
    need(1 <= raw_len <= MAX_RAW, "raw_len out of range")
    stream = stored[pos:]
    need(code in (LZ4, ZSTD), f"unknown compression code {code}")
    try:
        if code == LZ4:
            out = lz4.block.decompress(stream, uncompressed_size=raw_len)
        else:
            stated = zstandard.frame_content_size(stream)
            need(stated in (-1, raw_len), "zstd frame states another content size")
            out = zstandard.ZstdDecompressor().decompress(stream, max_output_size=raw_len,
                                                           allow_extra_data=False)
    except (lz4.block.LZ4BlockError, zstandard.ZstdError) as exc:
        raise SpecError(f"stream does not decode: {exc}") from None
    need(len(out) == raw_len, "stream does not decode to raw_len bytes")
    return out


def writer_compress(contents: bytes, code: int) -> bytes:
    """What the writer rule stores for ``contents`` under ``code`` before the 1/8 test."""
    if code == LZ4:
        stream = lz4.block.compress(contents, store_size=False)
    else:
        stream = zstandard.ZstdCompressor(level=3, write_content_size=False, write_checksum=False,
                                          write_dict_id=False).compress(contents)
    return encode_varint(len(contents)) + stream


# --- "SSTable" -----------------------------------------------------------------------------
FOOTER = struct.Struct("<QIQIQIIQ")
TABLE_MAGIC = 0x5349455645545331
BLOCK_DATA, BLOCK_INDEX, BLOCK_FILTER_INDEX, BLOCK_PROPERTIES, BLOCK_METAINDEX = 1, 2, 3, 4, 5


class Table:
    """Everything in one .sst file. ``entries``: (key, seq, kind, user_value) in file order."""

    def __init__(self, data: bytes):
        self.size, self.cover, self.data = len(data), Cover(len(data)), data
        need(self.size >= FOOTER.size, "shorter than a footer")
        footer = data[-FOOTER.size:]
        (mi_off, mi_size, ix_off, ix_size, self.meta_start, self.version, crc,
         magic) = FOOTER.unpack(footer)
        need(magic == TABLE_MAGIC, "bad magic")
        need(crc == masked_crc(footer[:36]), "footer CRC")
        need(self.version in (1, 2, 3), "unknown format version")
        self.cover.mark(self.size - 48, self.size, "footer")
        meta = Block(self.block((mi_off, mi_size), BLOCK_METAINDEX))
        self.handles = handles = {name: decode_handle(v) for name, v in meta.entries}
        need(set(handles) <= {b"sievekv.filter_index", b"sievekv.properties"}, "unknown meta block")
        raw = Block(self.block(handles[b"sievekv.properties"], BLOCK_PROPERTIES)).entries
        self.extra_properties = sorted(n.decode() for n, _ in raw if n.decode() not in PROPERTIES)
        props = {n.decode(): v for n, v in raw}
        self.props = {n: decode_property(e, props[n]) for n, e in PROPERTIES.items()
                      if n in props or n not in OPTIONAL_PROPERTIES}
        for n, default in OPTIONAL_PROPERTIES.items():
            self.props.setdefault(n, self.props["data_bytes"] if default is None else default)
        p = self.props
        index = Block(self.block((ix_off, ix_size), BLOCK_INDEX))
        self.index = [(key, decode_handle(v)) for key, v in index.entries]
        # Invariant 4: the meta tail is, in grammar order, the filter index, index, properties,
        # metaindex, with no gap from meta_start to the footer.
        tail = [handles.get(b"sievekv.filter_index"), (ix_off, ix_size),
                handles[b"sievekv.properties"], (mi_off, mi_size)]
        pos = self.meta_start
        for h in filter(None, tail):
            need(h[0] == pos, "meta blocks out of grammar order or with gaps")
            pos = h[0] + h[1] + 5
        need(pos == self.size - 48, "meta tail does not end at the footer")
        # Data blocks (invariant 1): contiguous from 0 to data_bytes.
        self.blocks, self.entries, pos = [], [], 0
        # Per data block: compression code, contents length, (stored bytes, contents).
        self.codes, self.raw_sizes, self.stored = [], [], []
        for key, (off, size) in self.index:
            need(off == pos, "gap between data blocks")
            block = Block(self.data_block((off, size)), p["restart_interval"])
            self.blocks.append(block)
            for k, v in block.entries:
                need(len(v) >= 8, "data value shorter than its tag")
                tag = struct.unpack_from("<Q", v)[0]
                need(tag & 0xFF in (0, 1) and (tag & 0xFF or len(v) == 8), "bad kind / tombstone value")
                self.entries.append((k, tag >> 8, tag & 0xFF, v[8:]))
            pos = off + size + 5
        self.data_bytes = pos
        # Filter region (invariants 3 and 8) and filter index.
        self.partitions = []  # (separator, offset, size, crc, first_block, num_keys, bytes)
        if b"sievekv.filter_index" in handles:
            fi = Block(self.block(handles[b"sievekv.filter_index"], BLOCK_FILTER_INDEX))
            self.region = round_up(self.data_bytes)
            self.zeros(self.data_bytes, self.region, "pad")
            pos = 0
            for sep, v in fi.entries:
                off, q = varint(v, 0, len(v), 10)
                size, q = varint(v, q, len(v), 10)
                crc = struct.unpack_from("<I", v, q)[0]
                first_block, q = varint(v, q + 4, len(v), 10)
                num_keys, q = varint(v, q, len(v), 10)
                need(q == len(v), "trailing bytes in a filter index value")
                need(off == pos and off % PAGE == 0 and size >= 1, "partition placement")
                start = self.region + off
                filt = data[start:start + size]
                need(masked_crc(filt) == crc, "partition CRC")
                self.cover.mark(start, start + size, "partition")
                self.zeros(start + size, start + round_up(size), "partition padding")
                self.partitions.append((sep, off, size, crc, first_block, num_keys, filt))
                pos = off + round_up(size)
            need(self.region + pos == self.meta_start, "filter region does not end at meta_start")
            # Invariant 7: partitions cover the data blocks in runs from block 0, and each
            # partition's separator is the index key of its last data block.
            firsts = [x[4] for x in self.partitions]
            ends = firsts[1:] + [len(self.index)]
            need(bool(self.partitions) == bool(self.index) and firsts[:1] in ([], [0])
                 and all(a < b for a, b in zip(firsts, ends)), "partitions do not cover the blocks")
            need([x[0] for x in self.partitions] == [self.index[e - 1][0] for e in ends],
                 "a partition's separator is not its last block's index key")
        else:
            need(self.meta_start == self.data_bytes, "meta_start != data_bytes without a filter")

    def block(self, handle: tuple[int, int], btype: int) -> bytes:
        """Block trailer: type u8 and masked CRC32C of contents + type byte."""
        off, size = handle
        need(off + size + 5 <= self.size - 48, "block past the footer")
        contents, t = self.data[off:off + size], self.data[off + size]
        need(struct.unpack_from("<I", self.data, off + size + 1)[0] == masked_crc(contents + bytes([t])),
             "block CRC")
        need(t == btype, f"block type {t}, expected {btype}")
        self.cover.mark(off, off + size + 5, f"block type {btype}")
        return contents

    def data_block(self, handle: tuple[int, int]) -> bytes:
        """A data block ("Block compression"): type byte 1 | c << 4, c in {0, 4, 7}; the CRC
        covers the stored bytes, which for c != 0 decode to the block contents."""
        off, size = handle
        need(off + size + 5 <= self.size - 48, "block past the footer")
        stored, t = self.data[off:off + size], self.data[off + size]
        need(struct.unpack_from("<I", self.data, off + size + 1)[0] == masked_crc(stored + bytes([t])),
             "block CRC")
        need(t & 0x0F == BLOCK_DATA and t >> 4 in (0, LZ4, ZSTD), f"data block type {t}")
        self.cover.mark(off, off + size + 5, f"data block type {t}")
        contents = stored if t == BLOCK_DATA else decompress(stored, t >> 4)
        self.codes.append(t >> 4)
        self.raw_sizes.append(len(contents))
        self.stored.append((stored, contents))
        return contents

    def zeros(self, start: int, end: int, what: str) -> None:
        need(self.data[start:end] == bytes(end - start), f"{what} not zero")
        self.cover.mark(start, end, what)

    def partition_of(self, key: bytes) -> int | None:
        p = bisect.bisect_left([s[0] for s in self.partitions], key)
        return p if p < len(self.partitions) else None


# --- "Write-ahead log": records and batches; "Manifest file" uses the same framing -----------
RECORD = struct.Struct("<IIB")


def read_records(data: bytes) -> list[tuple[int, bytes]]:
    """(offset, payload) of every FULL record; a file of whole records only (no torn tail
    here). A CLOSED record (type 2, empty) may end the file and is not returned."""
    out, pos = [], 0
    while pos < len(data):
        need(pos + 9 <= len(data), f"short header at {pos}")
        crc, length, rtype = RECORD.unpack_from(data, pos)
        payload = data[pos + 9:pos + 9 + length]
        need(len(payload) == length and rtype in (1, 2), f"bad record at {pos}")
        prefix = struct.pack("<QIB", pos, length, rtype)  # the offset is checksummed, not stored
        need(crc == masked_crc(prefix + payload), f"record CRC at {pos}")
        if rtype == 2:
            need(length == 0 and pos + 9 == len(data), f"CLOSED record at {pos} is not last")
            break
        out.append((pos, payload))
        pos += 9 + length
    return out


def decode_batch(p: bytes) -> list[tuple[int, int, bytes, bytes]]:
    """(seq, kind, key, value) of every op."""
    need(len(p) >= 12, "short batch header")
    first_seq, count = struct.unpack_from("<QI", p)
    ops, pos = [], 12
    for i in range(count):
        need(pos + 9 <= len(p), "short op")
        kind, klen, vlen = struct.unpack_from("<BII", p, pos)
        key, value = p[pos + 9:pos + 9 + klen], p[pos + 9 + klen:pos + 9 + klen + vlen]
        pos += 9 + klen + vlen
        need(pos <= len(p) and kind in (0, 1) and (kind or not vlen), "bad op")
        ops.append((first_seq + i, kind, key, value))
    need(pos == len(p) and first_seq + count - 1 < 2 ** 56, "trailing bytes or sequence overflow")
    return ops


def decode_edit(p: bytes) -> dict:
    """Version edit: {scalar name: value, 'compact_pointer'/'deleted_file'/'new_file': [...]}."""
    edit, pos = {"compact_pointer": [], "deleted_file": [], "new_file": []}, 0

    def uint():
        nonlocal pos
        v, pos = varint(p, pos, len(p), 10)
        need(v < 2 ** 64, "varint above 64 bits")
        return v

    def string():
        nonlocal pos
        n = uint()
        need(pos + n <= len(p), "string past the edit")
        pos += n
        return p[pos - n:pos]

    def f64():
        nonlocal pos
        need(pos + 8 <= len(p), "f64 past the edit")
        pos += 8
        return struct.unpack_from("<d", p, pos - 8)[0]

    while pos < len(p):
        tag = uint()
        if tag == 1:
            edit["comparator"] = string().decode()
        elif tag in (2, 3, 4):
            edit[{2: "log_number", 3: "next_file_number", 4: "last_sequence"}[tag]] = uint()
        elif tag == 5:
            edit["compact_pointer"].append((uint(), string()))
        elif tag == 6:
            edit["deleted_file"].append((uint(), uint()))
        elif tag == 7:
            names = ("level", "number", "size", "smallest", "largest", "num_entries",
                     "num_deletions", "smallest_seq", "largest_seq", "filter_bits_per_key",
                     "filter_bytes")
            readers = (uint, uint, uint, string, string, uint, uint, uint, uint, f64, uint)
            edit["new_file"].append(dict(zip(names, (r() for r in readers))))
        else:
            raise SpecError(f"unknown edit tag {tag}")
    return edit


def replay(edits: list[dict]) -> tuple[dict, list[dict]]:
    """State after the edits: scalars, and levels[L] = {number: new_file fields}."""
    state, levels = {}, [dict() for _ in range(7)]
    for e in edits:
        state.update({k: v for k, v in e.items() if not isinstance(v, list)})
        for level, number in e["deleted_file"]:
            need(number in levels[level], "edit deletes a file not in its level")
            del levels[level][number]
        for f in e["new_file"]:
            need(0 <= f["level"] < 7 and all(f["number"] not in lv for lv in levels), "bad new file")
            levels[f["level"]][f["number"]] = f
    return state, levels


# --- "File names" --------------------------------------------------------------------------
NAME = re.compile(r"^(?:(\d{6,})\.(sst|log|tmp)|MANIFEST-(\d{6,})|CURRENT|LOCK)$")


class DirImage:
    """Every file of a closed DB directory, decoded."""

    def __init__(self, path: str):
        names = sorted(os.listdir(path))
        self.foreign = [n for n in names if not NAME.match(n)]
        read = lambda n: open(os.path.join(path, n), "rb").read()
        current = read("CURRENT")
        need(re.fullmatch(rb"MANIFEST-\d{6,}\n", current), "CURRENT is not one manifest line")
        self.manifest_name = current[:-1].decode()
        self.manifests = [n for n in names if n.startswith("MANIFEST-")]
        records = read_records(read(self.manifest_name))
        self.edits = [decode_edit(p) for _, p in records]
        self.state, self.levels = replay(self.edits)
        self.tables = {int(n[:-4]): Table(read(n)) for n in names if n.endswith(".sst")}
        self.raw_logs = {int(n[:-4]): read(n) for n in names if n.endswith(".log")}
        self.logs = {n: [decode_batch(p) for _, p in read_records(raw)]
                     for n, raw in self.raw_logs.items()}
        self.numbers = [int(m.group(1) or m.group(3)) for m in map(NAME.match, names)
                        if m and (m.group(1) or m.group(3))]


# ============================================================================================
# The engine writes, the spec reads.
# ============================================================================================
from engine.db import DB  # noqa: E402  (the tests drive the engine; the decoder above does not)
from engine.options import Options  # noqa: E402

DEFAULT_COMPRESSION = {n: d for n, d, _ in Options.describe()}["compression"]


def find_separator(a: bytes, b: bytes) -> bytes:
    """LevelDB's FindShortestSeparator (bytewise)."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    if n < min(len(a), len(b)) and a[n] < 0xFF and a[n] + 1 < b[n]:
        return a[:n] + bytes([a[n] + 1])
    return a


class Model:
    """What was written: ops by sequence number (in write order) and the size of each write."""

    def __init__(self):
        self.ops, self.seq, self.writes = {}, 0, []

    def apply(self, db, pairs, batch: bool):
        self.writes += [len(pairs)] if batch else [1] * len(pairs)
        if batch:
            db.write(pairs)
        for key, value in pairs:
            if not batch:
                db.put(key, value) if value is not None else db.delete(key)
            self.seq += 1
            self.ops[self.seq] = (key, 0 if value is None else 1, value or b"")


def random_value(rnd, n: int) -> bytes:
    return bytes(rnd.randrange(256) for _ in range(n))


def record_value(rnd, n: int, key: bytes) -> bytes:
    """A JSON-like record (repeated field names: compressible) cut to ``n`` bytes, or random
    bytes for keys below k00001500 (so a table mixes compressed and raw blocks)."""
    if key < b"k00001500":
        return random_value(rnd, n)
    rec = json.dumps({"id": rnd.randrange(10 ** 6), "name": f"user{rnd.randrange(500)}",
                      "email": f"u{rnd.randrange(10 ** 4)}@example.com", "active": rnd.random() < 0.5,
                      "tags": ["alpha", "beta", "gamma"][:rnd.randrange(4)]}).encode()
    return (rec * (n // len(rec) + 1))[:n]


def workload(db, model: Model, rnd, n: int, value_len, value=None) -> None:
    keys = [b"k%08d" % rnd.randrange(n * 2) for _ in range(n)] + [b"a", b"a\xff", b"a\xff\x00"]
    for i, key in enumerate(keys):
        if i % 7 == 3:
            model.apply(db, [(key, None)], batch=False)
        elif i % 11 == 5:
            model.apply(db, [(key, value(rnd, value_len(), key) if value
                              else random_value(rnd, value_len())),
                             (keys[i - 1], None), (key + b"!", b"")], batch=True)
        else:
            v = value(rnd, value_len(), key) if value else os.urandom(value_len())
            model.apply(db, [(key, v)], batch=False)


SCENARIOS = {
    "defaults": dict(opts={}, n=3000, value_len=lambda r: 100),
    "classic-interval16": dict(opts=dict(filter_policy="bloom", restart_interval=16, block_size=1024,
                                         bits_per_key=7.5, partition_bytes=8192),
                               n=3000, value_len=lambda r: r.randrange(0, 200)),
    "no-filter": dict(opts=dict(filter_policy=None), n=1500, value_len=lambda r: 50),
    "tiny-values-big-blocks": dict(opts=dict(block_size=16384, bits_per_key=14),
                                   n=4000, value_len=lambda r: 1),
    "large-values": dict(opts=dict(bits_per_key=3, block_size=256), n=300,
                         value_len=lambda r: r.choice([10, 5000])),
    "workers": dict(opts=dict(table_workers=2), n=2000, value_len=lambda r: 40),
    # "Block compression": tables that mix compressed and raw blocks, each codec; and the same
    # values with compression off (format 2).
    "lz4-records": dict(opts=dict(compression="lz4"), n=3000, value=record_value,
                        value_len=lambda r: r.randrange(100, 300)),
    "zstd-records-interval16": dict(opts=dict(compression="zstd", restart_interval=16,
                                              block_size=2048),
                                    n=2000, value=record_value,
                                    value_len=lambda r: r.randrange(0, 300)),
    "records-uncompressed": dict(opts=dict(compression="none"), n=1500, value=record_value,
                                 value_len=lambda r: 150),
    "no-hash-index": dict(opts=dict(data_block_hash_index=False, bits_per_key=24), n=2000,
                          value_len=lambda r: 30),
}


def run_scenario(tmp_path, name: str):
    """Write, flush (twice), decode; compact, decode; write more and close (a live log);
    reopen and close (carry-over). Returns the decoded images and the model."""
    sc = SCENARIOS[name]
    rnd, model, images = random.Random(name), Model(), []
    path = str(tmp_path / "db")
    opts = dict(dict(table_workers=0, disable_auto_compactions=True), **sc["opts"])
    vl = lambda: sc["value_len"](rnd)
    db = DB.open(path, **opts)
    try:
        workload(db, model, rnd, sc["n"], vl, sc.get("value"))
        db.flush()
        workload(db, model, rnd, sc["n"] // 2, vl, sc.get("value"))
        db.flush()
        images.append(("flushed", DirImage(path)))
        db.compact()
        images.append(("compacted", DirImage(path)))
        workload(db, model, rnd, 50, vl, sc.get("value"))
    finally:
        db.close()
    images.append(("closed", DirImage(path)))
    DB.open(path, **opts).close()
    images.append(("reopened", DirImage(path)))
    return images, model


@pytest.fixture(scope="module", params=sorted(SCENARIOS))
def scenario(request, tmp_path_factory):
    return request.param, *run_scenario(tmp_path_factory.mktemp(request.param), request.param)


def check_filters(t: Table) -> None:
    """Every partition rebuilds bit for bit from its blocks' keys; every key may match."""
    policy, bpk = t.props["filter_policy"], t.props["bits_per_key"]
    seps, first = [s for s, _ in t.index], 0
    for sep, off, size, crc, first_block, num_keys, filt in t.partitions:
        last = seps.index(sep)  # the separator is the index key of the partition's last block
        keys = [k for b in t.blocks[first:last + 1] for k in b.keys]
        assert (first_block, num_keys) == (first, len(keys))
        assert size == max(t.props["partition_bytes"], round_up(estimate_size(policy, num_keys, bpk)))
        assert filt == build_filter(policy, keys, size, filter_k(policy, bpk))
        first = last + 1
    assert first == (len(t.blocks) if t.partitions else 0)
    for key, *_ in t.entries if t.partitions else ():  # probed as the doc says: bisect separators
        assert may_match(policy, t.partitions[t.partition_of(key)][6], key), key


def all_tables(images):
    for stage, img in images:
        for number, t in img.tables.items():
            yield stage, img, number, t


def test_every_table_byte_and_crc_is_explained(scenario):
    _, images, _ = scenario
    for stage, _, number, t in all_tables(images):
        assert t.cover.check_all() == t.size, (stage, number)


def test_table_entries_agree_with_what_was_written(scenario):
    _, images, model = scenario
    for stage, img, number, t in all_tables(images):
        keys = [e[0] for e in t.entries]
        assert keys == sorted(set(keys)), "keys strictly increase across the table"
        for key, seq, kind, value in t.entries:
            assert model.ops[seq] == (key, kind, value), (stage, number, key, seq)
    # After compact() everything is one bottom run with tombstones dropped: exactly the live dict
    # as of the compaction (the ops written before it).
    _, img = images[1]
    merged = sorted(e for t in img.tables.values() for e in t.entries)
    assert all(kind == 1 for _, _, kind, _ in merged)
    compacted_upto = img.state["last_sequence"]
    want = {}
    for seq in range(1, compacted_upto + 1):
        key, kind, value = model.ops[seq]
        want[key] = value if kind else None
    assert {k: v for k, _, _, v in merged} == {k: v for k, v in want.items() if v is not None}


def test_index_separators_and_block_cutting(scenario):
    _, images, _ = scenario
    for stage, _, number, t in all_tables(images):
        p = t.props
        for i, ((sep, _), block) in enumerate(zip(t.index, t.blocks)):
            assert block.entries, "a block holds at least one entry"
            assert block.keys[-1] <= sep
            if i + 1 < len(t.blocks):
                assert sep < t.blocks[i + 1].keys[0]
                assert sep == find_separator(block.keys[-1], t.blocks[i + 1].keys[0])
                # "The writer cuts a block once its contents reach block_size": not before.
                assert t.raw_sizes[i] >= p["block_size"]  # contents as built
                n = len(block.entries) - 1  # the same block one entry earlier
                r = len([o for o in block.restarts if o < block.offsets[-1]])
                hashed = block.slots is not None or (len(block.entries) == 256 and t.version == 2)
                earlier = block.offsets[-1] + 4 * r + 4 + (2 * n + 2 if hashed and n else 0)
                assert earlier < p["block_size"], (stage, number, i)
        assert t.index[-1][0] == p["largest_key"]


def test_hash_index_presence_and_format_version(scenario):
    name, images, _ = scenario
    hashed = SCENARIOS[name]["opts"].get("data_block_hash_index", True)
    for stage, _, number, t in all_tables(images):
        for block in t.blocks:
            expect = hashed and t.props["restart_interval"] == 1 and 1 <= len(block.entries) <= 255
            assert (block.slots is not None) == expect, (stage, number, len(block.entries))
        any_index = any(b.slots is not None for b in t.blocks)
        compressed = any(t.codes)
        assert t.version == (3 if compressed else 2 if any_index else 1) == t.props["format_version"]


def test_properties_agree_with_the_data(scenario):
    name, images, _ = scenario
    opts = SCENARIOS[name]["opts"]
    for stage, _, number, t in all_tables(images):
        p, e = t.props, t.entries
        assert t.extra_properties == [], "every property is in the document's table"
        assert p["num_entries"] == len(e) and p["num_tombstones"] == sum(x[2] == 0 for x in e)
        assert (p["smallest_key"], p["largest_key"]) == (e[0][0], e[-1][0])
        assert (p["smallest_seq"], p["largest_seq"]) == (min(x[1] for x in e), max(x[1] for x in e))
        assert p["raw_key_bytes"] == sum(len(x[0]) for x in e)
        assert p["raw_value_bytes"] == sum(len(x[3]) for x in e)
        assert p["data_bytes"] == t.data_bytes and p["num_data_blocks"] == len(t.blocks)
        assert p["index_bytes"] == FOOTER.unpack(t.data[-48:])[3]
        assert p["filter_index_bytes"] == t.handles.get(b"sievekv.filter_index", (0, 0))[1]
        assert p["block_size"] == opts.get("block_size", 4096)
        assert p["restart_interval"] == opts.get("restart_interval", 1)
        assert p["partition_bytes"] == round_up(opts.get("partition_bytes", 4096)) or not t.partitions
        assert abs(p["creation_time"] - time.time()) < 3600
        assert p["num_filter_partitions"] == len(t.partitions)
        assert p["filter_bytes"] == (t.meta_start - t.region if t.partitions else 0)
        policy = {None: "", "bloom": CLASSIC}.get(opts.get("filter_policy", "blocked-bloom"), BLOCKED)
        assert p["filter_policy"] == policy
        if policy:
            assert p["bits_per_key"] == opts.get("bits_per_key", 10.0)
            assert p["filter_params"] == {"bits_per_key": p["bits_per_key"],
                                          "num_probes": filter_k(policy, p["bits_per_key"])}
            sizes = sum(x[2] for x in t.partitions)
            assert p["effective_bits_per_key"] == pytest.approx(8 * sizes / p["num_entries"])


CODES = {"none": 0, "lz4": LZ4, "zstd": ZSTD}


def test_block_compression_writer_rule_and_properties(scenario):
    """"Block compression": a block is stored compressed with the table's codec exactly when
    that saves at least 1/8 (stored < raw_len - raw_len // 8), as the stream the document
    names; the properties count the compressed blocks and the bytes as built."""
    name, images, _ = scenario
    setting = SCENARIOS[name]["opts"].get("compression", DEFAULT_COMPRESSION)
    code = CODES[setting]
    seen = set()
    for stage, _, number, t in all_tables(images):
        p = t.props
        assert p["compression"] == setting
        assert p["compressed_data_blocks"] == sum(c != 0 for c in t.codes)
        assert p["uncompressed_data_bytes"] == sum(n + 5 for n in t.raw_sizes)
        for c, (stored, contents) in zip(t.codes, t.stored):
            seen.add(c)
            if c:
                assert c == code and stored == writer_compress(contents, code)
                assert len(stored) < len(contents) - len(contents) // 8
            elif code and len(contents) <= MAX_RAW:
                would = writer_compress(contents, code)
                assert len(would) >= len(contents) - len(contents) // 8, (stage, number)
    if "records" in name and code:
        assert seen == {0, code}, "these scenarios mix compressed and raw blocks"
    if not code:
        assert seen == {0}


def test_filters_rebuild_bit_for_bit_and_match_every_key(scenario):
    _, images, _ = scenario
    for stage, _, number, t in all_tables(images):
        if not t.props["filter_policy"]:
            assert not t.partitions
        check_filters(t)


def test_partition_grouping_rule(scenario):
    """Filter partitions, Placement 2: grow a partition while its keys plus one more block's
    worth (running average keys per block) fit partition_bytes at the configured bits per key."""
    _, images, _ = scenario
    for stage, _, number, t in all_tables(images):
        p = t.props
        if not t.partitions:
            continue
        starts, keys, total = [0], 0, 0
        for i, b in enumerate(t.blocks):
            keys, total = keys + len(b.entries), total + len(b.entries)
            more = total / (i + 1)
            size = estimate_size(p["filter_policy"], math.ceil(keys + more), p["bits_per_key"])
            full = size > p["partition_bytes"]
            if full and i + 1 < len(t.blocks):
                starts.append(i + 1)
                keys = 0
        assert starts == [x[4] for x in t.partitions], (stage, number)


def test_manifest_names_exactly_the_tables_and_agrees_with_them(scenario):
    _, images, model = scenario
    for stage, img in images:
        assert img.foreign == [], f"files the document does not name: {img.foreign}"
        assert img.manifests == [img.manifest_name]
        first = img.edits[0]
        assert first["comparator"] == "sievekv.bytewise"
        for e in img.edits:
            assert {"log_number", "next_file_number", "last_sequence"} <= set(e)
        # The first record is a snapshot: alone, it gives the state the previous manifest had.
        if stage == "reopened":
            _, alone = replay(img.edits[:1])
            assert alone == images[2][1].levels
        live = {n: (lv, f) for lv, files in enumerate(img.levels) for n, f in files.items()}
        assert set(live) == set(img.tables), stage
        for n, (level, f) in live.items():
            t = img.tables[n]
            p = t.props
            assert (f["size"], f["smallest"], f["largest"]) == \
                (t.size, p["smallest_key"], p["largest_key"])
            assert (f["num_entries"], f["num_deletions"]) == (p["num_entries"], p["num_tombstones"])
            assert (f["smallest_seq"], f["largest_seq"]) == (p["smallest_seq"], p["largest_seq"])
            assert f["filter_bytes"] == p["filter_bytes"]
            assert f["filter_bits_per_key"] == (p["bits_per_key"] if p["filter_policy"] else 0.0)
        for files in img.levels[1:]:
            ranges = sorted((f["smallest"], f["largest"]) for f in files.values())
            assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:]))
        assert all(n < img.state["next_file_number"] for n in img.numbers)
        assert all(n >= img.state["log_number"] for n in img.logs)
        assert img.state["last_sequence"] <= model.seq


def test_tables_and_logs_together_hold_every_acknowledged_write(scenario):
    """Replaying the decoded files (newest sequence wins, tombstones hide) gives what was
    written: nothing is lost and nothing is invented."""
    _, images, model = scenario
    for stage, img in images:
        ops = [op for n in sorted(img.logs) for batch in img.logs[n] for op in batch]
        seqs = [s for s, *_ in ops]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) if seqs else True
        for seq, kind, key, value in ops:
            assert model.ops[seq] == (key, kind, value)
        newest = {}
        entries = [e for t in img.tables.values() for e in t.entries]
        entries += [(k, s, kd, v) for s, kd, k, v in ops]
        for key, seq, kind, value in sorted(entries, key=lambda e: e[1]):
            newest[key] = value if kind else None
        upto = seqs[-1] if seqs else img.state["last_sequence"]
        want = {}
        for seq in range(1, upto + 1):
            key, kind, value = model.ops[seq]
            want[key] = value if kind else None
        got = {k: v for k, v in newest.items() if v is not None}
        assert got == {k: v for k, v in want.items() if v is not None}, stage
        if stage in ("closed", "reopened"):
            assert upto == model.seq, "a closed DB's files hold every write"
    closed, reopened = images[2][1], images[3][1]
    (old,), (new,) = closed.logs, reopened.logs
    assert new > old and reopened.raw_logs[new] == closed.raw_logs[old], "carried over byte for byte"
    # One record per write call (a batch is atomic because it is one record).
    records = [len(batch) for n in sorted(closed.logs) for batch in closed.logs[n]]
    assert records == model.writes[len(model.writes) - len(records):]


# --- Tables built directly (shapes a DB rarely writes) ---------------------------------------
from engine.errors import CorruptionError  # noqa: E402
from engine.sstable import Table as EngineTable, TableBuilder, TableOptions  # noqa: E402
from engine.vfs import FileSystem  # noqa: E402


def build_table(path, entries, **opts) -> bytes:
    fs = FileSystem()
    w = fs.open_writable(str(path))
    b = TableBuilder(w, TableOptions(**opts))
    for e in entries:
        b.add(*e)
    b.finish()
    w.sync()
    w.close()
    return open(path, "rb").read()


def test_empty_table(tmp_path):
    t = Table(build_table(tmp_path / "e.sst", []))
    assert t.cover.check_all() == t.size
    assert t.entries == [] and t.index == [] and t.partitions == []
    p = t.props
    assert (p["smallest_key"], p["largest_key"], p["smallest_seq"], p["largest_seq"]) == (b"", b"", 0, 0)
    assert p["data_bytes"] == 0 == t.meta_start and p["filter_bytes"] == 0
    # "An empty block is the restart array [0] and R = 1 (8 bytes)": the index block.
    assert t.props["index_bytes"] == 8


@pytest.mark.parametrize("policy", ["bloom", "blocked-bloom"])
def test_edge_keys_sequences_and_fixed_partitions(tmp_path, policy):
    keys = [b"", b"\x00", b"\x00\xff"] + [b"p%06d" % i for i in range(3000)] + [b"\xff" * 300]
    entries = [(k, (2 ** 56 - 1) - i if i % 5 else i, i % 3 != 0, b"v" * (i % 7) if i % 3 else b"")
               for i, k in enumerate(keys)]
    entries = [(k, s, int(kind), v) for k, s, kind, v in entries]
    t = Table(build_table(tmp_path / "x.sst", entries, filter_policy=policy, block_size=512,
                          blocks_per_partition=4, bits_per_key=12.5))
    assert t.cover.check_all() == t.size
    assert t.entries == entries
    assert len(t.partitions) == -(-len(t.blocks) // 4)
    assert [x[4] for x in t.partitions] == list(range(0, len(t.blocks), 4))
    check_filters(t)


def test_fixed_partitions_are_still_at_least_partition_bytes(tmp_path):
    """Placement 3 holds with blocks_per_partition too (engine/sstable/options.py's docstring
    says such partitions "take as many pages as their keys need": they take at least
    partition_bytes)."""
    entries = [(b"k%05d" % i, i + 1, 1, b"v") for i in range(400)]
    t = Table(build_table(tmp_path / "f.sst", entries, partition_bytes=8192, blocks_per_partition=1,
                          block_size=256))
    assert len(t.partitions) > 1 and {x[2] for x in t.partitions} == {8192}
    check_filters(t)


def test_filter_properties_without_a_filter(tmp_path):
    # "Properties block": without a filter the filter properties are empty or 0.
    t = Table(build_table(tmp_path / "n.sst", [(b"a", 1, 1, b"x")], filter_policy=None))
    assert t.props["partition_bytes"] == 0 and t.props["filter_policy"] == ""
    assert t.props["filter_params"] == {} and t.props["bits_per_key"] == 0.0
    assert t.props["filter_bytes"] == t.props["num_filter_partitions"] == 0


# --- What "Reading" says a reader checks at open ----------------------------------------------
def refooter(data: bytearray, **changes) -> bytearray:
    names = ("mi_off", "mi_size", "ix_off", "ix_size", "meta_start", "version", "crc", "magic")
    f = dict(zip(names, FOOTER.unpack(data[-48:])), **changes)
    f["crc"] = masked_crc(FOOTER.pack(*[f[n] for n in names])[:36])
    data[-48:] = FOOTER.pack(*[f[n] for n in names])
    return data


def bump_property(t: Table, data: bytearray, name: bytes) -> bytearray:
    """Add 1 to a one-byte-group int property in place and redo the block's CRC."""
    off, size = t.handles[b"sievekv.properties"]
    at = data.index(name, off, off + size) + len(name)
    assert data[at] & 0x7F < 0x7F
    data[at] += 1
    data[off + size + 1:off + size + 5] = struct.pack("<I", masked_crc(data[off:off + size + 1]))
    return data


def opens(path, data: bytes) -> bool:
    """True if the engine's reader opens ``data`` and reads every entry; False on CorruptionError."""
    with open(path, "wb") as f:
        f.write(data)
    try:
        with EngineTable.open(FileSystem(), str(path)) as t:
            list(t.iterate())
        return True
    except CorruptionError:
        return False


@pytest.fixture
def sample(tmp_path):
    entries = [(b"k%05d" % i, i + 1, 1, b"v" * 30) for i in range(300)]
    data = build_table(tmp_path / "s.sst", entries)
    t = Table(data)
    assert t.data_bytes % PAGE and t.partitions, "the sample needs a pad and a filter"
    return tmp_path / "t.sst", t, bytes(data)


def test_reader_rejects_another_format_version(sample):
    path, t, data = sample
    assert opens(path, data)
    assert not opens(path, refooter(bytearray(data), version=4)), "Versions: other versions"
    assert opens(path, refooter(bytearray(data), version=3)), \
        "Versions: readers read 3 and accept (here: no) compressed blocks in any version"
    assert t.version == 2 and opens(path, refooter(bytearray(data), version=1)), \
        "Versions: readers accept the hash index flag in any data block"


def reseal(data: bytearray, off: int, size: int, stored: bytes, t: int) -> bytearray:
    """Put ``stored`` (same length) and type ``t`` at the block (off, size), with a valid CRC."""
    assert len(stored) == size
    data[off:off + size] = stored
    data[off + size] = t
    data[off + size + 1:off + size + 5] = struct.pack("<I", masked_crc(bytes(stored) + bytes([t])))
    return data


@pytest.mark.parametrize("damage", ["unknown-code", "raw-len-over-max", "raw-len-plus-1",
                                    "raw-len-minus-1", "bad-stream", "compressed-index"])
@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_block_compression_reading_rule(tmp_path, codec, damage):
    """"Block compression", reading rule: with a valid CRC, an unknown code, a raw_len above
    the maximum, a stream that decodes to another length or not at all, and a code on a block
    that is not a data block, are each corruption."""
    entries = [(b"k%05d" % i, i + 1, 1, b'{"name": "v", "n": %d}' % i) for i in range(300)]
    data = bytearray(build_table(tmp_path / "c.sst", entries, compression=codec))
    t = Table(bytes(data))
    path = tmp_path / "t.sst"
    assert t.version == 3 and all(t.codes) and opens(path, bytes(data))
    (off, size), typ = t.index[0][1], data[t.index[0][1][0] + t.index[0][1][1]]
    stored = bytes(data[off:off + size])
    raw_len, pos = varint(stored, 0, size, 5)
    assert pos == 2  # 2-byte varint: the fabricated ones below keep the block's length
    if damage == "unknown-code":
        bad = reseal(data, off, size, stored, 0x51)
    elif damage == "raw-len-over-max":
        bad = reseal(data, off, size, encode_varint(MAX_RAW + 1) + stored[4:], typ)
    elif damage in ("raw-len-plus-1", "raw-len-minus-1"):
        n = raw_len + (1 if damage == "raw-len-plus-1" else -1)
        bad = reseal(data, off, size, encode_varint(n) + stored[2:], typ)
    elif damage == "bad-stream":
        bad = reseal(data, off, size, stored[:2] + bytes(b ^ 0x5A for b in stored[2:]), typ)
    else:  # the index block's type byte with a compression code
        ioff, isize = FOOTER.unpack(data[-48:])[2:4]
        bad = reseal(data, ioff, isize, bytes(data[ioff:ioff + isize]), 0x42)
    with pytest.raises(SpecError):
        Table(bytes(bad))
    assert not opens(path, bytes(bad))


@pytest.mark.parametrize("name", [
    b"num_data_blocks", b"data_bytes", b"filter_bytes", b"num_filter_partitions",
])
def test_reader_checks_invariant_7_at_open(sample, name):
    path, t, data = sample
    assert not opens(path, bump_property(t, bytearray(data), name))


def test_reader_checks_each_partition_separator_against_the_index(sample):
    # Invariant 7: a partition's separator is the index key of its last data block. A get
    # relies on it (it searches the index only over the blocks of the key's partition); a
    # table that breaks it, with every CRC valid, answered "absent" for a present key until
    # session 19 (a separator below the largest key put the largest key in no partition).
    path, t, data = sample
    off, size = t.handles[b"sievekv.filter_index"]
    sep = t.partitions[0][0]
    bad = bytearray(data)
    at = bad.index(sep, off, off + size) + len(sep) - 1
    bad[at] -= 1  # still above the previous separator: the order stays right
    bad[off + size + 1:off + size + 5] = struct.pack("<I", masked_crc(bad[off:off + size + 1]))
    with pytest.raises(SpecError, match="separator"):
        Table(bytes(bad))
    assert not opens(path, bytes(bad))
    assert opens(path, data)


def test_open_does_not_read_the_pad(sample):
    # "Reading": open reads the footer and the meta tail only, so the pad's zeros (invariant 3)
    # are a writer's rule that open does not check; nothing reads those bytes.
    path, t, data = sample
    data_bytes = t.props["data_bytes"]
    assert data_bytes % 4096 and t.props["filter_bytes"]  # there is a pad
    bad = bytearray(data)
    bad[data_bytes] = 0x5A
    assert opens(path, bad)


def test_reader_checks_the_meta_tail_has_no_gap(sample):
    path, t, data = sample
    assert not opens(path, data[:-48] + bytes(16) + data[-48:])


# --- "File names", "Recovery and rotation" ---------------------------------------------------
def test_a_new_db_starts_with_manifest_1_and_next_file_number_2(tmp_path):
    DB.open(str(tmp_path / "db"), table_workers=0).close()
    img = DirImage(str(tmp_path / "db"))
    assert img.manifest_name == "MANIFEST-000001" and img.foreign == []
    assert img.edits[0]["next_file_number"] == 2 and img.edits[0]["comparator"] == "sievekv.bytewise"
    assert img.levels == [{}] * 7 and list(img.logs) == [img.state["log_number"]]


def test_the_current_temp_file_takes_its_manifests_number(tmp_path):
    from engine.faultfs import FaultInjectionFS, InjectedCrash

    for n in range(1, 40):  # stop a fresh open at each mutating operation until a .tmp is left
        path = tmp_path / f"db{n}"
        fs = FaultInjectionFS()
        fs.crash_after(n)
        try:
            DB.open(str(path), fs=fs, table_workers=0).close()
        except InjectedCrash:
            pass
        tmp = [x for x in os.listdir(path) if x.endswith(".tmp")] if path.exists() else []
        if tmp:
            break
    # "File names": the temporary file installing CURRENT takes the number of the manifest it
    # names; every other number is used once across tables, logs and manifests.
    manifests = {int(x[9:]) for x in os.listdir(path) if x.startswith("MANIFEST-")}
    assert tmp and int(tmp[0][:-4]) in manifests, sorted(os.listdir(path))
    numbered = [int(m.group(1) or m.group(3)) for m in map(NAME.match, os.listdir(path))
                if m and (m.group(1) or m.group(3)) and not m.group(0).endswith(".tmp")]
    assert len(numbered) == len(set(numbered)), sorted(os.listdir(path))
