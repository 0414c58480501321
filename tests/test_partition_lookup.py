"""How a get finds its filter partition and data block (engine/sstable/reader.py ``Table.get``,
engine/sstable/filter_reader.py ``may_match_partition``), and the hash-index lookup
(engine/sstable/block.py ``find_hashed``), as reworked in session 19.

``Table.get`` bisects the partition separators, probes that partition, and on "may match"
searches the index only over the partition's data blocks. That is right only if each
separator is the index key of its partition's last block (docs/format.md invariant 7, checked
at open: tests/test_format_spec.py). What must hold: every present key is found and no absent
one, at and around every partition and block boundary; the filter counters mean what they did
(one probe per get in range, a true positive per key found); a damaged hash index still ends
in CorruptionError, never a loop or a wrong answer.
"""

import random

import pytest

from engine.errors import CorruptionError
from engine.format import KIND_VALUE
from engine.sstable import Table
from engine.sstable.block import Block, find_hashed, find_whole
from engine.sstable.block_builder import BlockBuilder
from engine.sstable.filter_reader import decode_filter_index
from engine.vfs import FileSystem

from .test_in_place_reads import _block, _hash_layout
from .test_sstable import write_table


def _table(path, keys, **opts):
    write_table(FileSystem(), str(path),
                [(k, i + 1, KIND_VALUE, b"v%d" % i) for i, k in enumerate(keys)], **opts)
    return Table.open(FileSystem(), str(path), mmap_reads=True)


@pytest.mark.parametrize("blocks_per_partition", [1, 3, None])
def test_every_key_around_every_partition_and_block_boundary(tmp_path, blocks_per_partition):
    rng = random.Random(blocks_per_partition or 0)
    keys = sorted({rng.randbytes(rng.randrange(1, 12)) for _ in range(12000)})
    present = set(keys)
    rank = {k: i for i, k in enumerate(keys)}
    with _table(tmp_path / "t.sst", keys, block_size=512,
                blocks_per_partition=blocks_per_partition) as t:
        f = t._filter
        assert f.num_partitions > 3
        assert t._nblocks > f.num_partitions or blocks_per_partition == 1
        # Keys at and next to every block's separator and every partition's first and last key.
        probes = set(t.block_separators()) | set(f.separators)
        for k in list(probes):
            probes |= {k + b"\x00", k[:-1], k[:-1] + bytes([max(k[-1] - 1, 0)])}
        probes |= set(keys[::7]) | {rng.randbytes(rng.randrange(1, 12)) for _ in range(3000)}
        probes.discard(b"")
        for k in sorted(probes):
            got = t.get(k)
            if k in present:
                assert got is not None and got[2] == b"v%d" % rank[k], k
            else:
                assert got is None, k
        in_range = [k for k in probes if t.smallest <= k <= t.largest]
        found = sum(k in present for k in probes)
        assert f.positives + f.negatives == len(in_range)  # one probe per get in range
        assert f.true_positives == found
        assert t.data_blocks_read == f.positives  # a block only after "may match"


@pytest.mark.parametrize("num_data_blocks", [0, 3])
def test_an_empty_filter_index_is_corruption(num_data_blocks):
    # Partitions cover the data blocks from block 0, and a table without data blocks has no
    # filter index (docs/format.md): a get takes the key's partition from the separators and
    # would find none (tests/test_review_session19.py).
    empty = Block(bytes(BlockBuilder(1).finish()))
    with pytest.raises(CorruptionError, match="without partitions"):
        decode_filter_index(empty, 0, num_data_blocks)


def test_a_hash_index_with_every_slot_full_is_corruption_not_a_loop():
    rng = random.Random(5)
    keys, data = _block(rng, 30)
    hs, nb, num, _ = _hash_layout(data)
    bad = bytearray(data)
    bad[hs:hs + nb] = bytes([1]) * nb  # every slot names entry 1 (keys[0])
    assert num >= 2
    with pytest.raises(CorruptionError) as ei:
        find_hashed(bytes(bad), 0, len(bad), keys[1], "t.sst", 8192)
    assert (ei.value.path, ei.value.offset) == ("t.sst", 8192)
    # The key the full slots do name is still found, wherever its probe starts.
    assert find_hashed(bytes(bad), 0, len(bad), keys[0]) == find_whole(data, keys[0])


@pytest.mark.parametrize("seed", range(4))
def test_find_hashed_agrees_with_find_whole_inside_a_mapping_sized_buffer(seed):
    rng = random.Random(seed)
    keys, data = _block(rng, rng.randrange(2, 200))
    pad = rng.randbytes(rng.randrange(50))
    buf = pad + data + rng.randbytes(30)
    start, end = len(pad), len(pad) + len(data)
    for k in keys + [rng.randbytes(rng.randrange(1, 24)) for _ in range(200)]:
        want = find_whole(data, k)
        got = find_hashed(buf, start, end, k)
        assert got == (None if want is None else (want[0] + start, want[1] + start))
