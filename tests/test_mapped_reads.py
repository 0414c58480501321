"""Mapped data-block reads (``mmap_reads``, engine/sstable/reader.py): the same answers as
``pread``, no mapping before the first get, no system call or block-cache traffic per get,
damage caught by the checksum (tests/test_in_place_reads.py: when it is checked), and a clean
ClosedError when close races a get."""

import os
import random
import resource
import threading

import pytest

from engine import DB
from engine.block_cache import BlockCache
from engine.errors import ClosedError, CorruptionError, StorageIOError
from engine.format import KIND_VALUE
from engine.sstable import Table, TableBuilder, TableOptions
from engine.vfs import FileSystem


def _build(path, n=2000, seed=3):
    rng = random.Random(seed)
    keys = sorted({rng.randbytes(16) for _ in range(n)})
    entries = [(k, i + 1, KIND_VALUE, rng.randbytes(rng.randrange(120))) for i, k in
               enumerate(keys)]
    fs = FileSystem()
    w = fs.open_writable(path)
    b = TableBuilder(w, TableOptions())
    for e in entries:
        b.add(*e)
    props = b.finish()
    w.sync()
    w.close()
    return entries, props


def test_mapped_gets_match_pread_gets_and_bypass_the_cache(tmp_path):
    path = str(tmp_path / "t.sst")
    entries, props = _build(path)
    fs = FileSystem()
    cache = BlockCache(1 << 20)
    mapped = Table.open(fs, path, file_number=1, block_cache=cache, mmap_reads=True)
    plain = Table.open(fs, path, file_number=2, block_cache=cache)
    try:
        assert mapped._data_map is None  # opening maps nothing
        maps_before = fs.counters.maps
        reads_before = fs.counters.read_calls
        rng = random.Random(5)
        for k, seq, kind, v in rng.sample(entries, 500):
            assert mapped.get(k) == (seq, kind, v)
        assert fs.counters.maps == maps_before + 2  # the data region and the filter region
        assert fs.counters.read_calls == reads_before  # no pread for any of those gets
        assert cache.hits == cache.misses == 0  # nor block-cache traffic
        assert mapped.data_block_file_reads > 0
        for k, seq, kind, v in rng.sample(entries, 200):
            assert plain.get(k) == (seq, kind, v) == mapped.get(k)
        assert cache.misses > 0  # the pread table does use the cache
        # Scans read with pread through the cache in both modes, and agree.
        assert list(mapped.iterate()) == list(plain.iterate()) == [
            (k, s, kd, v) for k, s, kd, v in entries]
        for probe in (b"", b"\x00", b"\xff" * 17):
            assert mapped.get(probe) == plain.get(probe)
    finally:
        mapped.close()
        plain.close()


def test_damage_in_a_mapped_block_is_a_corruption_error_not_a_wrong_value(tmp_path):
    path = str(tmp_path / "t.sst")
    entries, props = _build(path, n=400)
    t = Table.open(FileSystem(), path, mmap_reads=True, verify_every_read=True)
    try:
        k0, seq0, kind0, v0 = entries[0]
        assert t.get(k0) == (seq0, kind0, v0)  # the mapping exists now
        # Flip a byte of the first block in place: the mapping shares the page cache, so the
        # open table sees the damage on its next read and, checking every read, the checksum
        # must catch it (by default only a block's first read per open is checked).
        with open(path, "r+b") as f:
            f.seek(40)
            b = f.read(1)
            f.seek(40)
            f.write(bytes([b[0] ^ 0x41]))
            f.flush()
            os.fsync(f.fileno())
        with pytest.raises(CorruptionError) as ei:
            t.get(k0)
        assert ei.value.path == path and ei.value.offset == 0
    finally:
        t.close()


@pytest.mark.parametrize("mmap_reads", [True, False], ids=["mapped", "pread"])
def test_get_after_close_and_racing_close_raise_closed_error_only(tmp_path, mmap_reads):
    """Readers racing close get right answers or ClosedError, never another error and never
    another file's bytes: right after close this test opens other files, which take the
    descriptor numbers close freed (a pread on a closed-and-reused number would read them)."""
    path = str(tmp_path / "t.sst")
    entries, _ = _build(path, n=3000)
    decoy = str(tmp_path / "decoy.sst")
    _build(decoy, n=3000, seed=4)  # same layout, other keys and values: valid CRCs
    for round_ in range(8):
        t = Table.open(FileSystem(), path, mmap_reads=mmap_reads)
        t.get(entries[0][0])
        fds = []
        errors, wrong = readers_racing_close(
            t, entries, round_ * 10,
            after_close=lambda: fds.extend(os.open(decoy, os.O_RDONLY) for _ in range(8)))
        for fd in fds:
            os.close(fd)
        assert errors == [] and wrong == []
        with pytest.raises(ClosedError):
            t.get(entries[1][0])


def readers_racing_close(t, entries, seed, before_close=None, after_close=None):
    """Three threads get random ``entries`` ((key, seq, kind, value)) of table ``t`` while it
    is closed under them; ``(errors, wrong)``: exceptions other than ClosedError, and keys
    read with a wrong answer."""
    errors, wrong = [], []
    stop = threading.Event()

    def reader(seed):
        rng = random.Random(seed)
        while not stop.is_set():
            k, seq, kind, v = rng.choice(entries)
            try:
                got = t.get(k)
            except ClosedError:
                return
            except Exception as exc:  # anything else is a bug
                errors.append(exc)
                return
            if got != (seq, kind, v):
                wrong.append(k)

    threads = [threading.Thread(target=reader, args=(seed + i,)) for i in range(3)]
    for th in threads:
        th.start()
    if before_close is not None:
        before_close()
    t.close()
    if after_close is not None:
        after_close()
    stop.set()
    for th in threads:
        th.join()
    return errors, wrong


@pytest.mark.parametrize("mmap_reads", [True, False])
def test_db_reads_the_same_in_both_modes(tmp_path, mmap_reads):
    rng = random.Random(11)
    model = {}
    with DB.open(str(tmp_path / "db"), mmap_reads=mmap_reads, memtable_bytes=64 << 10,
                 table_workers=0) as db:
        for i in range(3000):
            k = rng.randbytes(rng.randrange(1, 20))
            if i % 7 == 3:
                db.delete(k)
                model.pop(k, None)
            else:
                v = rng.randbytes(rng.randrange(60))
                db.put(k, v)
                model[k] = v
        db.flush()
        db.compact()

        def cache_traffic():
            c = db.stats()["block_cache"]
            return c["hits"] + c["misses"]

        before = cache_traffic()
        for k, v in model.items():
            assert db.get(k) == v
        keys = list(model)
        assert db.multi_get(keys[:50]) == [model[k] for k in keys[:50]]
        after_gets = cache_traffic()
        # Mapped gets bypass the block cache; pread gets go through it.
        assert (after_gets == before) if mmap_reads else (after_gets > before)
        assert list(db.scan()) == sorted(model.items())
        assert cache_traffic() > after_gets  # scans use the cache in both modes
        reads = db.stats()["reads"]
        assert reads["mmap_reads"] is mmap_reads and reads["map_failures"] == 0
        assert (reads["mapped_tables"] > 0) is mmap_reads
    with DB.open(str(tmp_path / "db"), mmap_reads=mmap_reads) as db:  # and after reopen
        for k, v in list(model.items())[:500]:
            assert db.get(k) == v


@pytest.mark.parametrize("mmap_reads", [False, True], ids=["pread", "mapped"])
def test_get_works_without_a_free_descriptor(tmp_path, mmap_reads):
    """engine/sstable/reader.py _map_data: CPython's mmap dup()s the descriptor, so a mapped
    table holds 3 fds (file, filter mapping, data mapping) instead of 2, and the first get of
    a table needs a free descriptor. Near RLIMIT_NOFILE (no max_open_files, nothing raises the
    limit) pread gets still answered but mapped gets raised StorageIOError (EMFILE), on every
    get of every table not yet mapped (found in review). Now a table the OS will not map
    falls back to pread and counts a map failure."""
    path = str(tmp_path / "t.sst")
    entries, _ = _build(path)
    k, seq, kind, v = entries[1234]
    t = Table.open(FileSystem(), path, mmap_reads=mmap_reads)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fillers = []
    result = error = None
    try:
        assert t.may_match(k)  # maps the filter region now: its partition stays resident
        top = max(int(x) for x in os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (top + 64, hard))
        try:
            while True:  # take every free descriptor below the limit
                fillers.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        try:
            result = t.get(k)
        except StorageIOError as exc:
            error = exc
        failures = t.map_failures
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        t.close()
    assert error is None, f"get failed with a free-descriptor shortage: {error}"
    assert result == (seq, kind, v)
    assert failures == (1 if mmap_reads else 0)
