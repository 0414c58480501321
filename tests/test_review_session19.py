"""Review of session 19 (branch lead since e72fc35): the partition-restricted index search of
``Table.get``, the rewritten ``find_hashed``, the pairwise distinctness test of the blocked
Bloom probe, and ``stats()["snapshots"]``.

Checked and holding (plain tests below, or by exploration recorded here):

- Restricted index search. For 1,500 random tables (restart interval 1/2/16, no filter,
  blocked-bloom and bloom filters, ``blocks_per_partition`` None/1/2/7, partition_bytes
  1/4096/8192, block sizes down to one key per block, hash index on/off, lz4/none, keys from
  two-letter to full-byte alphabets, so shortened separators, keys equal to a separator,
  between blocks, one byte longer or shorter), pread and mapped, ``verify_every_read`` on and
  off: every get agrees with a dict, ``bisect_left(index, k, first_blocks[p], block_ends[p])``
  equals the full ``bisect_left(index, k)`` for every key in range, and every table a writer
  produced opens (the new open check rejects none). Every version of the builder in the
  history (2025f45 onwards) cuts partitions with the index separator of the block that ends
  them and the last one with the largest key, so no older table (format 1/2/3) is rejected.
  An unknown filter policy still reads right (tests/test_corruption_sstable.py). A sample of
  that sweep is the first test here.
- ``find_hashed``: over 4,000 good and damaged hash-indexed blocks placed inside larger
  buffers with random bytes around them, the new code gives exactly the old code's outcome
  (value range, None or CorruptionError) and never another exception; the bytes around the
  block never change the outcome; good blocks answer as ``find_whole``. The edge cases
  (end - 6 < start, end < 6 through struct's negative offsets, slot count 0, restart count 0
  with the flag, end past the buffer, a closed mapping) all end in CorruptionError, as before:
  the tail read may now land before ``start`` but the result is always rejected (the slots and
  restarts would end below ``start``). The flag test ``data[n-1] & 0x80`` differs from the old
  ``> BLOCK_HASH_FLAG`` only for a restart count of exactly 0x80000000, corruption either way.
- The blocked Bloom probe agrees with ``probe_reference`` for every k from 1 to 24, in the
  last line too, including keys whose first k candidates repeat (the all-set answer must then
  come from further candidates).
- Snapshot stats: counts return to zero after threads open, close and drop snapshots (some
  freed by the cyclic GC in whatever thread collects) while other threads call stats();
  read-only DBs have snapshot() and stats(); stats() on a closed DB raises ClosedError.

Findings, each a strict xfail until fixed in session 19 and now a plain test: a filter index
over no data blocks made ``Table.get`` raise IndexError (now: corruption at open, "a filter index
without partitions"); ``stats()`` computed ``held_tables`` against the read state it took at its
start, so a flush installed meanwhile counted the new live table as "compacted away still held"
(now: a compaction marks its inputs obsolete in the table set, and only those are counted); the
CLI line dropped the oldest snapshot's age when it rounded to 0 (now ``is not None``); the
blocked Bloom docstring cited a bench section that did not exist yet (written).
"""

from __future__ import annotations

import gc
import os
import random
import re
import struct
import threading
from bisect import bisect_left

import pytest

from engine import DB, reports
from engine.errors import ClosedError, CorruptionError
from engine.filters import blocked_bloom, layout
from engine.format import (BLOCK_HASH_FLAG, BLOCK_TYPE_FILTER_INDEX, BLOCK_TYPE_INDEX,
                           BLOCK_TYPE_METAINDEX, BLOCK_TYPE_PROPERTIES, KIND_VALUE,
                           META_FILTER_INDEX, META_PROPERTIES)
from engine.sstable import Table, TableBuilder, TableOptions
from engine.sstable.block import find_hashed, find_whole
from engine.sstable.block_builder import BlockBuilder
from engine.sstable.footer import Footer
from engine.sstable.handle import BlockHandle, seal
from engine.sstable.properties import TableProperties, encode_properties
from engine.vfs import FileSystem
from router.cli.report_cmds import held_by_reads

from .test_in_place_reads import _block

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NONE_HELD = {"open": 0, "oldest_age_seconds": None, "memtable_holds": 0, "kept_records": 0,
             "held_tables": 0, "held_table_bytes": 0}


def _write_table(path, keys, rng, **opts):
    w = FileSystem().open_writable(path)
    b = TableBuilder(w, TableOptions(**opts))
    i = 0
    while i < len(keys):  # runs of entries, as flushes and compactions add them
        j = min(len(keys), i + rng.randrange(1, 50))
        b.add_many([(k, n + 1, KIND_VALUE, b"v" * (n % 7)) for n, k in enumerate(keys[i:j], i)],
                   0, j - i)
        i = j
    b.finish()
    w.sync()
    w.close()


@pytest.mark.parametrize("seed", range(12))
def test_the_partition_restricted_index_search_is_the_full_bisect(tmp_path, seed):
    rng = random.Random(seed)
    alphabet = [b"ab", bytes(range(256)), b"\x00\xff\x01\xfe"][seed % 3]
    n = [1, 2, 5, 50, 500, 3000][seed % 6]
    keys = sorted({bytes(rng.choice(alphabet) for _ in range(rng.randrange(1, 10)))
                   for _ in range(n)})
    opts = dict(block_size=rng.choice([1, 64, 256, 4096]),
                restart_interval=rng.choice([1, 2, 16]),
                filter_policy=["blocked-bloom", "bloom", None][seed % 3 if seed < 9 else 0],
                blocks_per_partition=[None, 1, 2, 7][seed % 4],
                partition_bytes=rng.choice([1, 4096, 8192]),
                data_block_hash_index=bool(seed % 2),
                compression=rng.choice(["none", "lz4"]))
    if opts["filter_policy"] is not None:
        opts["bits_per_key"] = rng.choice([1, 4, 10, 20])
    path = str(tmp_path / "t.sst")
    _write_table(path, keys, rng, **opts)
    present = {k: b"v" * (i % 7) for i, k in enumerate(keys)}
    for mmap_reads in (False, True):
        with Table.open(FileSystem(), path, mmap_reads=mmap_reads,
                        verify_every_read=bool(seed % 3)) as t:
            f = t._filter
            probes = set(keys) | set(t.block_separators()) | set(f.separators if f else ())
            for k in list(probes):
                probes |= {k + b"\x00", k + b"\xff", k[:-1],
                           k[:-1] + bytes([max(k[-1] - 1, 0)]), bytes([min(k[-1] + 1, 255)])}
            probes |= {bytes(rng.choice(alphabet) for _ in range(rng.randrange(1, 12)))
                       for _ in range(200)}
            probes.discard(b"")
            for k in sorted(probes):
                got = t.get(k)
                want = present.get(k)
                assert (None if got is None else got[2]) == want, (k, opts)
                if f is not None and t.smallest <= k <= t.largest:
                    p = bisect_left(f.separators, k)
                    assert p < f.num_partitions
                    assert bisect_left(t._index_keys, k, f.first_blocks[p], f.block_ends[p]) \
                        == bisect_left(t._index_keys, k), (k, opts)


def _outcome(buf, start, end, key):
    try:
        return "ok", find_hashed(buf, start, end, key, "t.sst", 4096)
    except CorruptionError as exc:
        assert (exc.path, exc.offset) == ("t.sst", 4096)
        return ("corrupt",)


def test_find_hashed_reads_only_its_block_and_raises_only_corruption():
    """Damaged blocks inside larger buffers: the outcome does not depend on the bytes around the
    block, and is a value range, None or CorruptionError (never another exception, never a
    loop); good blocks answer as find_whole."""
    for seed in range(600):
        rng = random.Random(seed)
        keys, data = _block(rng, rng.choice([1, 2, 3, 10, 100, 255]), max_value=200)
        bad = bytearray(data)
        for _ in range(rng.choice([0, 1, 2, 5])):
            where = rng.choice(["tail", "any", "slots"])
            if where == "tail":
                i = len(bad) - rng.randrange(1, 7)
            elif where == "slots":
                i = max(0, len(bad) - 6 - rng.randrange(1, 2 * len(keys) + 1))
            else:
                i = rng.randrange(len(bad))
            bad[i] = rng.randrange(256)
        if rng.random() < 0.1:
            bad = bad[:rng.randrange(len(bad))]
        pad, after = rng.randbytes(rng.randrange(12)), rng.randbytes(rng.randrange(12))
        s, e = len(pad), len(pad) + len(bad)
        one = bytes(pad + bad + after)
        other = bytes(rng.randbytes(len(pad)) + bad + rng.randbytes(len(after)))
        for k in keys[:10] + [rng.randbytes(rng.randrange(1, 24)) for _ in range(3)]:
            got = _outcome(one, s, e, k)
            assert got == _outcome(other, s, e, k), (seed, k)
            if bad == data:
                w = find_whole(data, k)
                assert got == ("ok", None if w is None else (w[0] + s, w[1] + s))
    flag = BLOCK_HASH_FLAG
    tails = {"end - 6 < start": (bytes(20) + struct.pack("<HI", 4, flag | 1), 10, 14),
             "end < 6 (negative offset)": (struct.pack("<HI", 4, flag | 1), 0, 5),
             "no slots": (bytes(10) + struct.pack("<HI", 0, flag | 1), 0, 16),
             "flag, no restarts": (bytes(10) + struct.pack("<HI", 4, flag), 0, 16),
             "end past the buffer": (bytes(10), 0, 100)}
    for name, (buf, s, e) in tails.items():
        assert _outcome(buf, s, e, b"k") == ("corrupt",), name


def test_the_fast_blocked_probe_agrees_with_the_reference_for_every_k():
    """Per k (1..24, what the policy can choose) and per key: a line with every bit set answers
    True; clearing the key's last distinct probe bit answers False, also for keys whose first k
    candidates repeat (the pairwise test at k <= 6, the set above), in the last line too."""
    for k in range(1, 25):
        fast = blocked_bloom._specialised_probe(k)
        rng = random.Random(k)
        for lines in (1, 2, 5):
            full = bytearray(b"\xff" * (64 * lines))
            full[-layout.TRAILER_SIZE:] = layout.TRAILER.pack(
                k, lines % layout.LENGTH_CHECK_MOD, layout.MARKER_BLOCKED)
            for _ in range(300):
                key = rng.randbytes(rng.randrange(1, 16))
                line, positions = blocked_bloom.probe_positions(key, lines, k)
                assert fast(bytes(full), key) is True
                data = bytearray(full)
                q = positions[-1]
                data[line * 64 + (q >> 3)] &= ~(1 << (q & 7))
                assert blocked_bloom.probe_reference(bytes(data), key) is False
                assert fast(bytes(data), key) is False, (k, lines, key)


def test_snapshot_counts_return_to_zero_under_threads_and_the_gc(tmp_path):
    """Threads open, read and close snapshots, or drop them in reference cycles that the cyclic
    GC frees in whatever thread collects, while others scan and call stats(): nothing
    deadlocks (joined below, generous hang guard only), every count stays sane, and all return
    to zero. A read-only DB has the same snapshot() and stats()."""
    path = str(tmp_path / "db")
    with DB.open(path) as db:
        for i in range(300):
            db.put(b"k%03d" % i, b"v")
        errors = []
        stop = threading.Event()

        def snapshots(seed):
            rng = random.Random(seed)
            try:
                for n in range(150):
                    s = db.snapshot()
                    assert s.get(b"k001") == b"v"
                    if rng.random() < 0.3:
                        cycle = [s]
                        cycle.append(cycle)  # freed only by the cyclic GC, in some thread
                    else:
                        s.close()
                    del s
                    if n % 25 == 0:
                        gc.collect()
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                errors.append(exc)

        def writes_and_stats():
            try:
                i = 0
                while not stop.is_set():
                    db.put(b"k%03d" % (i % 300), b"v")
                    it = db.scan(limit=5)
                    next(it)
                    if i % 2:
                        it.close()
                    del it
                    s = db.stats()["snapshots"]
                    assert s["open"] >= 0 and s["memtable_holds"] >= 0
                    assert s["kept_records"] >= 0 and s["held_tables"] >= 0
                    assert (s["oldest_age_seconds"] is None) == (s["open"] == 0)
                    i += 1
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        workers = [threading.Thread(target=snapshots, args=(n,)) for n in range(4)]
        others = [threading.Thread(target=writes_and_stats) for _ in range(2)]
        for t in workers + others:
            t.start()
        for t in workers:
            t.join(120)
        stop.set()
        for t in others:
            t.join(120)
        assert not any(t.is_alive() for t in workers + others), "a thread hung"
        assert not errors, errors
        gc.collect()
        assert db.stats()["snapshots"] == NONE_HELD
    with pytest.raises(ClosedError):
        db.stats()
    with DB.open(path, read_only=True) as ro:
        with ro.snapshot() as snap:
            assert snap.get(b"k001") == b"v"
            s = ro.stats()["snapshots"]
            assert (s["open"], s["memtable_holds"]) == (1, 1)
        assert ro.stats()["snapshots"] == NONE_HELD


# -- findings ------------------------------------------------------------------------------

def _table_with_a_filter_index_and_no_blocks(path, smallest, largest):
    """Every CRC valid: no data block, an empty index, an empty filter index (docs/format.md:
    an empty table has none, but open accepts one) and properties naming a filter."""
    out = bytearray()

    def write(contents, block_type):
        h = BlockHandle(len(out), len(contents))
        out.extend(seal(bytes(contents), block_type))
        return h

    fi = write(BlockBuilder(1).finish(), BLOCK_TYPE_FILTER_INDEX)
    index = write(BlockBuilder(1).finish(), BLOCK_TYPE_INDEX)
    props = write(encode_properties(TableProperties(
        filter_policy="sievekv.BlockedBloomFilter.v1", filter_params={},
        smallest_key=smallest, largest_key=largest)), BLOCK_TYPE_PROPERTIES)
    meta = BlockBuilder(1)
    meta.add(META_FILTER_INDEX, fi.encode())
    meta.add(META_PROPERTIES, props.encode())
    mh = write(meta.finish(), BLOCK_TYPE_METAINDEX)
    out.extend(Footer(mh, index, 0, 1).encode())
    with open(path, "wb") as f:
        f.write(out)


@pytest.mark.parametrize("smallest, largest, key", [(b"a", b"z", b"m"), (b"", b"", b"")],
                         ids=["damaged-range", "empty-range"])
def test_a_filter_index_over_no_data_blocks_answers_absent_or_is_corruption(
        tmp_path, smallest, largest, key):
    """Fixed in session 19: Table.get assumed a partition for every key in range; a filter index
    with no partitions now fails the open (decode_filter_index)."""
    path = str(tmp_path / "t.sst")
    _table_with_a_filter_index_and_no_blocks(path, smallest, largest)
    try:
        t = Table.open(FileSystem(), path)
    except CorruptionError:
        return  # a fix that rejects it at open is right too
    with t:
        assert t.may_match(key) is False  # the filter's own answer: no partition, no key
        assert t.get(key) is None


def test_held_tables_never_count_a_live_table(tmp_path):
    """Fixed in session 19: held tables were the referenced tables missing from the read state
    stats() took first, so a flush meanwhile counted its new live table; now only tables a
    compaction marked obsolete (TableSet.mark_obsolete) count."""
    with DB.open(str(tmp_path / "db")) as db:
        for i in range(100):
            db.put(b"k%03d" % i, b"v" * 50)
        db.flush()
        rs = db._rs  # what stats() holds from its first line on
        for i in range(100):
            db.put(b"j%03d" % i, b"v" * 50)
        db.flush()  # lands while that stats() call runs
        live = set(db._rs.numbers)
        s = reports._snapshots(db, rs)  # the rest of that same stats() call
        held = [t.file_number for t in db._tables.held_obsolete()]
        assert not live & set(held), (held, live)
        assert s["held_tables"] == 0 and s["held_table_bytes"] == 0, s


def test_the_cli_line_names_an_open_snapshot_whatever_its_age():
    """Fixed in session 19: the line tested `if age`, and an age rounded to 0.0 dropped it."""
    s = {"snapshots": dict(NONE_HELD, open=1, oldest_age_seconds=0.0, held_tables=1,
                           held_table_bytes=4096)}
    assert "the oldest snapshot open" in held_by_reads(s)


def test_every_bench_section_the_code_cites_exists():
    """Fixed in session 19: blocked_bloom.py cited bench/results/db.md "Session 19" before it
    was written."""
    with open(os.path.join(REPO, "bench", "results", "db.md"), encoding="utf-8") as f:
        headings = [line[3:].strip() for line in f if line.startswith("## ")]
    cited = set()
    for top in ("engine", "shard", "router"):
        for dirpath, _, files in os.walk(os.path.join(REPO, top)):
            for name in files:
                if name.endswith(".py"):
                    with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                        text = re.sub(r"\s+", " ", f.read())
                    cited |= {(name, m) for m in re.findall(
                        r'bench/results/db\.md,? "(Session [^"]+)"', text)}
    assert cited
    missing = sorted((name, c) for name, c in cited
                     if not any(h.startswith(c) for h in headings))
    assert not missing, missing
