"""The compiled point-read functions (engine/_speedups.pyx) against their Python references.

engine/speedups.py promises that the compiled ``find_hashed`` and blocked Bloom probe return
what the Python versions return and raise what they raise, on any input. These tests compare
the two on well-formed data written by our own builders, on the same data damaged at random,
on malformed filters and on odd buffers; and check that the compiled module is in use where
it can be built, and that a DB gives the same answers with and without it.
"""

from __future__ import annotations

import json
import mmap
import os
import random
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import pytest
from hypothesis import given, settings, strategies as st

from engine import speedups
from engine.errors import CorruptionError
from engine.filters import get_policy
from engine.filters.blocked_bloom import probe_reference
from engine.format import ENTRY_TAG
from engine.sstable.block import find_hashed_py
from engine.sstable.block_builder import BlockBuilder

from .test_cli_e2e import cli_env_cleared  # noqa: F401 (fixture)

native = speedups.native
PURE = speedups.pure_python_requested()  # this test process was told to run the Python versions
needs_native = pytest.mark.skipif(native is None, reason="compiled speed-ups not in use")


def _can_compile() -> bool:
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    headers = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    return shutil.which(cc) is not None and os.path.exists(headers)


def test_native_in_use_where_it_can_be_built():
    """pip install builds it where a compiler and the headers are present (setup.py); a
    failed build is not an install error, so this test is what notices one."""
    if PURE:
        assert native is None
    elif _can_compile():
        assert native is not None, "engine/_speedups.pyx was not built: see setup.py"


def test_a_build_of_other_source_is_not_used(tmp_path):
    """A build records the SHA-256 of its .pyx (setup.py); a .pyx edited since, or a
    checkout of another version, does not match it, and the Python versions run."""
    import hashlib
    import types

    src = tmp_path / "_speedups.pyx"
    src.write_bytes(b"source one")
    built = types.SimpleNamespace(SOURCE_SHA256=hashlib.sha256(b"source one").hexdigest())
    assert not speedups.is_stale(str(src), built)
    src.write_bytes(b"source two")
    assert speedups.is_stale(str(src), built)
    assert not speedups.is_stale(str(tmp_path / "missing.pyx"), built)  # a wheel: no source
    assert not speedups.is_stale(str(src), types.SimpleNamespace())  # built without a record
    if native is not None:  # this tree's own build was made from this tree's source
        source = os.path.join(os.path.dirname(speedups.__file__), "_speedups.pyx")
        assert native.SOURCE_SHA256 and not speedups.is_stale(source, native)


# -- find_hashed ------------------------------------------------------------------------------

def _outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except CorruptionError as exc:
        return ("corrupt", str(exc))
    except Exception as exc:  # only for odd arguments (test_find_hashed_odd_arguments...)
        return (type(exc).__name__, str(exc))


def _block(rng: random.Random, n: int, long_keys: bool) -> tuple[bytes, list[bytes]]:
    sizes = (1, 300) if long_keys else (1, 24)
    keys = sorted({rng.randbytes(rng.randint(*sizes)) for _ in range(n)})
    b = BlockBuilder(1, hash_index=True)
    for k in keys:
        vlen = rng.choice((0, 3, 100, 200))
        b.add(k, ENTRY_TAG.pack(rng.randrange(1 << 40) << 8 | 1) + rng.randbytes(vlen))
    return b.finish(), keys


def _agree(buf, start, end, queries):
    for q in queries:
        want = _outcome(find_hashed_py, buf, start, end, q, "t.sst", 77)
        got = _outcome(native.find_hashed, buf, start, end, q, "t.sst", 77)
        assert got == want, (q, start, end)


@needs_native
@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(1, 60), long_keys=st.booleans(),
       pad=st.integers(0, 40))
def test_find_hashed_agrees_on_written_blocks(seed, n, long_keys, pad):
    rng = random.Random(seed)
    data, keys = _block(rng, n, long_keys)
    absent = [rng.randbytes(rng.randint(1, 20)) for _ in range(20)]
    queries = keys + absent + [k + b"\x00" for k in keys[:5]] + [k[:-1] for k in keys[:5]]
    _agree(data, 0, len(data), queries)
    # inside a larger buffer, as a mapped get reads it: bytes before and after
    framed = rng.randbytes(pad) + data + rng.randbytes(5)
    _agree(framed, pad, pad + len(data), queries)
    _agree(memoryview(framed), pad, pad + len(data), queries[:10])
    _agree(bytearray(framed), pad, pad + len(data), queries[:10])


@needs_native
@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(1, 40), long_keys=st.booleans(),
       flips=st.integers(1, 4))
def test_find_hashed_agrees_on_damaged_blocks(seed, n, long_keys, flips):
    """Any byte, anywhere (entries, restarts, slots, counts): the same value, None or
    CorruptionError as the Python version, never a crash or an out-of-bounds read."""
    rng = random.Random(seed)
    data, keys = _block(rng, n, long_keys)
    bad = bytearray(data)
    for _ in range(flips):
        i = rng.randrange(len(bad)) if rng.random() < 0.6 else len(bad) - rng.randint(1, 12)
        bad[i] = rng.randrange(256) if rng.random() < 0.5 else bad[i] ^ (1 << rng.randrange(8))
    bad = bytes(bad)
    queries = keys + [rng.randbytes(8) for _ in range(5)]
    _agree(bad, 0, len(bad), queries)
    tail = rng.randbytes(rng.randint(0, 300))  # a damaged block may point past its end
    _agree(bad + tail, 0, len(bad), queries)
    cut = rng.randint(0, len(bad))
    _agree(bad, 0, cut, queries[:5])  # bounds that do not fit the contents


@needs_native
@pytest.mark.parametrize("long_keys", [False, True])
def test_find_hashed_agrees_with_every_byte_damaged(long_keys):
    """Every byte of a small block (entries, restart offsets, slots, counts) set to each of
    several values: boundaries a random flip rarely reaches, such as a restart offset equal
    to the end of the entries or a slot one past the restart count."""
    rng = random.Random(8)
    keys = sorted({rng.randbytes(rng.choice((1, 5, 130) if long_keys else (1, 5, 9)))
                   for _ in range(8)})
    b = BlockBuilder(1, hash_index=True)
    for k in keys:
        b.add(k, ENTRY_TAG.pack(7 << 8 | 1) + rng.randbytes(rng.choice((0, 2, 130))))
    data = b.finish()
    queries = keys + [b"\x00", b"zz"]
    for i in range(len(data)):
        for v in {0, 1, 2, 3, 0x7F, 0x80, 0x81, 0xFF, data[i] ^ 1, (data[i] + 1) & 0xFF,
                  (data[i] - 1) & 0xFF, (data[i] + 4) & 0xFF, (data[i] - 4) & 0xFF}:
            bad = data[:i] + bytes([v]) + data[i + 1:]
            _agree(bad, 0, len(bad), queries)


@needs_native
def test_find_hashed_agrees_with_restart_offsets_near_the_end():
    """Each restart offset rewritten to point just before, at and past the end of the
    entries (where the restart array begins), or anywhere: as a damaged index may."""
    import struct

    data, keys = _block(random.Random(11), 12, True)
    nb, count = struct.unpack_from("<HI", data, len(data) - 6)
    num = count & 0x7FFFFFFF
    limit = len(data) - 6 - nb - 4 * num
    for r in range(num):
        for target in [*range(limit - 4, limit + 9), 0xFFFFFFFF, len(data), len(data) - 1]:
            bad = bytearray(data)
            struct.pack_into("<I", bad, limit + 4 * r, target)
            _agree(bytes(bad), 0, len(bad), keys + [b"q"])


@needs_native
def test_find_hashed_odd_arguments_answer_as_python():
    data, keys = _block(random.Random(5), 20, False)
    for start, end in ((0, len(data)), (-3, len(data)), (0, len(data) + 10), (0, 5), (2, 1)):
        for key in (keys[3], bytearray(keys[3]), memoryview(keys[3])):
            assert _outcome(native.find_hashed, data, start, end, key) == \
                _outcome(find_hashed_py, data, start, end, key)
    strided = memoryview(data + data)[::2]  # not contiguous: the Python version reads it
    assert _outcome(native.find_hashed, strided, 0, len(strided), keys[0]) == \
        _outcome(find_hashed_py, strided, 0, len(strided), keys[0])
    released = memoryview(data)
    released.release()
    assert _outcome(native.find_hashed, released, 0, len(data), keys[0]) == \
        _outcome(find_hashed_py, released, 0, len(data), keys[0]) == \
        ("corrupt", "corruption: block: bad hash index or entry")


@needs_native
def test_find_hashed_on_a_closed_mapping_raises_as_python(tmp_path):
    data, keys = _block(random.Random(6), 20, False)
    path = tmp_path / "b"
    path.write_bytes(data)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    assert native.find_hashed(mm, 0, len(data), keys[1]) == find_hashed_py(
        mm, 0, len(data), keys[1])
    mm.close()  # no export left behind by the calls above (close would raise BufferError)
    assert _outcome(native.find_hashed, mm, 0, len(data), keys[1], "p", 3) == \
        _outcome(find_hashed_py, mm, 0, len(data), keys[1], "p", 3)


# -- the blocked Bloom probe ------------------------------------------------------------------

@needs_native
@settings(max_examples=120, deadline=None)
@given(seed=st.integers(0, 2**32), bits=st.sampled_from([1, 2, 4, 6, 8, 10, 12, 16, 20, 30, 40]),
       nkeys=st.integers(1, 3000), size=st.sampled_from([None, 64, 128, 4096, 4160]))
def test_probe_agrees_on_written_filters(seed, bits, nkeys, size):
    """Any k (1-30), one line or many, keys in the last line (positions % 480) or not."""
    rng = random.Random(seed)
    p = get_policy("blocked-bloom", bits)
    keys = [rng.randbytes(rng.randint(0, 30)) for _ in range(nkeys)]
    data = p.build(keys, size_bytes=size)
    probes = keys[:200] + [rng.randbytes(rng.randint(0, 30)) for _ in range(300)]
    for k in probes:
        assert native.blocked_may_match(data, k) == probe_reference(data, k), k
    for k in keys[:200]:
        assert native.blocked_may_match(data, k) is True  # no false "absent"


@needs_native
@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32), where=st.sampled_from(["any", "trailer", "cut"]))
def test_probe_agrees_on_damaged_and_malformed_filters(seed, where):
    rng = random.Random(seed)
    p = get_policy("blocked-bloom", rng.choice([5, 10, 14]))
    keys = [rng.randbytes(12) for _ in range(500)]
    data = bytearray(p.build(keys, size_bytes=rng.choice([64, 1024, 4096])))
    if where == "any":
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif where == "trailer":
        data[len(data) - rng.randint(1, 4)] = rng.randrange(256)
    else:
        data = data[: rng.randrange(len(data) + 70)] + bytes(rng.randrange(2) * 64)
    data = bytes(data)
    for k in keys[:50] + [rng.randbytes(12) for _ in range(50)]:
        assert native.blocked_may_match(data, k) == probe_reference(data, k)


@needs_native
def test_probe_odd_buffers_answer_as_the_reference(tmp_path):
    p = get_policy("blocked-bloom", 10)
    keys = [bytes([i, j]) for i in range(40) for j in range(40)]
    data = p.build(keys, size_bytes=2048)
    absent = [b"x" + bytes([i]) for i in range(200)]
    released = memoryview(data)
    released.release()
    path = tmp_path / "f"
    path.write_bytes(b"\x00" * 64 + data)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(mm)[64:]
    bufs = [memoryview(data), bytearray(data), view, memoryview(data).cast("I"),
            memoryview(data).cast("b"), memoryview(data + data)[::2], released, b"", bytes(64)]
    for buf in bufs:
        for k in keys[:100] + absent:
            assert native.blocked_may_match(buf, k) == probe_reference(buf, k), type(buf)
    view.release()
    mm.close()  # no export left behind
    with pytest.raises(TypeError):
        native.blocked_may_match(data, "text")  # as the policy's probe (tests/test_filters.py)


# -- a whole DB, with and without ---------------------------------------------------------------

_DB_SCRIPT = textwrap.dedent("""
    import json, random, sys
    import engine
    path, write = sys.argv[1], sys.argv[2] == "1"
    rng = random.Random(9)
    keys = [rng.randbytes(rng.choice((8, 16, 200))) for _ in range(3000)]
    with engine.DB.open(path, memtable_bytes=64 * 1024) as db:
        if write:
            for i, k in enumerate(keys):
                db.put(k, bytes([i % 251]) * (i % 300))
            for k in keys[::7]:
                db.delete(k)
            db.flush()
            db.compact()
        probes = keys + [rng.randbytes(16) for _ in range(2000)]
        got = [None if v is None else v.hex() for v in map(db.get, probes)]
        assert got == [None if v is None else v.hex() for v in db.multi_get(probes)]
        json.dump({"native": db.stats()["native_speedups"], "got": got}, sys.stdout)
""")


def _run_db(path, write: bool, pure: bool) -> dict:
    env = dict(os.environ)
    env.pop(speedups.PURE_PYTHON_ENV, None)
    if pure:
        env[speedups.PURE_PYTHON_ENV] = "1"
    out = subprocess.run([sys.executable, "-c", _DB_SCRIPT, str(path), "1" if write else "0"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_db_answers_the_same_with_and_without(tmp_path):
    """Tables written by one, read by the other: the same values and absences, and stats()
    says which ran."""
    pure = _run_db(tmp_path / "db", write=True, pure=True)
    assert pure["native"] is False
    compiled = _run_db(tmp_path / "db", write=False, pure=False)
    if not PURE:
        assert compiled["native"] is (native is not None)
    assert compiled["got"] == pure["got"]
    assert sum(v is not None for v in pure["got"]) > 2000


@pytest.mark.usefixtures("cli_env_cleared")
def test_stats_names_a_shard_running_without_them(procs, tmp_path, monkeypatch, capsys):
    """A real shard started with SIEVEKV_PURE_PYTHON=1 reports native_speedups false, and
    `sievekv stats` prints a line for it; a shard running them prints none."""
    from router.cli import app
    from router.cli.report_cmds import SPEEDUPS_OFF

    from .conftest import start_router_process, start_shard_process, write_cluster_map

    monkeypatch.setenv(speedups.PURE_PYTHON_ENV, "1")
    pure = start_shard_process(procs, str(tmp_path / "p"), name="pure", wait=False)
    monkeypatch.delenv(speedups.PURE_PYTHON_ENV)
    other = start_shard_process(procs, str(tmp_path / "o"), name="other", wait=False)
    shards = [pure.wait_ready(), other.wait_ready()]
    router = start_router_process(procs, write_cluster_map(str(tmp_path / "m.toml"), shards))
    capsys.readouterr()
    code = app.main(["stats", "--router", router.address, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert doc["shards"]["pure"]["native_speedups"] is False
    other_native = doc["shards"]["other"]["native_speedups"]
    if not PURE:  # (else this process cannot tell what the other loads)
        assert other_native is (native is not None)
    code = app.main(["stats", "--router", router.address])
    out = capsys.readouterr().out
    assert code == 0
    lines = [ln for ln in out.splitlines() if SPEEDUPS_OFF in ln]
    off = ["pure"] if other_native else ["other", "pure"]
    assert lines == [f"{name}: {SPEEDUPS_OFF}" for name in off], out


# -- read_verified: Table.get's checked read of a verified block ---------------------------------

def _write_table(path, entries, **opts):
    from engine.sstable import TableBuilder, TableOptions
    from engine.vfs import FileSystem

    w = FileSystem().open_writable(str(path))
    b = TableBuilder(w, TableOptions(**opts))
    for e in entries:
        b.add(*e)
    b.finish()
    w.sync()
    w.close()


def _entries(rng, n):
    from engine.format import KIND_DELETE, KIND_VALUE

    keys = sorted({rng.randbytes(rng.choice((1, 8, 16, 40, 200))) for _ in range(n)})
    return [(k, 1000 + i, KIND_DELETE, b"") if i % 9 == 4 else
            (k, (1 << 50) + i, KIND_VALUE, rng.randbytes(rng.choice((0, 5, 100, 300))))
            for i, k in enumerate(keys)]


def _gets(path, probes, monkeypatch, compiled: bool, damage=None):
    """Every probe read three times (the first read of a block verifies it) by a fresh mapped
    Table; with ``damage`` (offset, byte), that byte of the file is overwritten after the
    first round. Returns the answers (or the error's type and text) and the read counters."""
    from engine.sstable import Table, reader
    from engine.vfs import FileSystem

    if not compiled:
        monkeypatch.setattr(reader, "_read_verified", None)
    out = []
    with Table.open(FileSystem(), str(path), mmap_reads=True) as t:
        for rnd in range(3):
            if rnd == 1 and damage is not None:
                with open(path, "r+b") as f:
                    f.seek(damage[0])
                    f.write(bytes([damage[1]]))
            for k in probes:
                try:
                    out.append(t.get(k))
                except CorruptionError as exc:
                    out.append(("corrupt", str(exc)))
        counters = (t.data_blocks_read, t.data_block_file_reads,
                    t._filter.true_positives if t._filter is not None else None)
    monkeypatch.undo()
    return out, counters


@needs_native
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(1, 1500),
       policy=st.sampled_from(["blocked-bloom", None]))
def test_table_gets_agree_with_and_without_read_verified(tmp_path_factory, seed, n, policy):
    rng = random.Random(seed)
    entries = _entries(rng, n)
    path = tmp_path_factory.mktemp("rv") / "t.sst"
    _write_table(path, entries, compression="none", filter_policy=policy)
    probes = [e[0] for e in entries] + [rng.randbytes(16) for _ in range(50)]
    with pytest.MonkeyPatch.context() as mp:
        compiled = _gets(path, probes, mp, compiled=True)
    with pytest.MonkeyPatch.context() as mp:
        python = _gets(path, probes, mp, compiled=False)
    assert compiled == python
    answers = compiled[0][: len(entries)]
    assert answers == [(seq, kind, value) for _, seq, kind, value in entries]


@needs_native
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_a_block_changed_after_its_verification_answers_as_python(tmp_path_factory, seed):
    """A byte of the file overwritten under the open table after its blocks were verified:
    the compiled read finds the checksum changed and hands the read to the Python path, so
    the answers (values, or the CorruptionError naming the file) are the same."""
    rng = random.Random(seed)
    entries = _entries(rng, 400)
    path = tmp_path_factory.mktemp("rvd") / "t.sst"
    _write_table(path, entries, compression="none")
    data_end = _first_filter_or_index_offset(path)
    damage = (rng.randrange(data_end), rng.randrange(256))
    probes = [e[0] for e in entries]
    with pytest.MonkeyPatch.context() as mp:
        compiled = _gets(path, probes, mp, compiled=True, damage=damage)
    _write_table(path, entries, compression="none")
    with pytest.MonkeyPatch.context() as mp:
        python = _gets(path, probes, mp, compiled=False, damage=damage)
    assert compiled == python


def _first_filter_or_index_offset(path) -> int:
    """Where the data blocks end: the offset of the first non-data block (the data region
    comes first in a table)."""
    from engine.sstable import Table
    from engine.vfs import FileSystem

    with Table.open(FileSystem(), str(path)) as t:
        return t._offsets[-1] + t._sizes[-1] + 5  # the last block and its trailer


@needs_native
def test_read_verified_hands_back_what_it_cannot_answer(tmp_path):
    from engine.sstable import Table
    from engine.vfs import FileSystem

    entries = _entries(random.Random(3), 200)
    path = tmp_path / "t.sst"
    _write_table(path, entries, compression="none")
    key = entries[0][0]
    with Table.open(FileSystem(), str(path), mmap_reads=True) as t:
        assert t.get(key) == entries[0][1:]  # maps the table and verifies block 0
        m, off, end = t._data_map, t._offsets[0], t._offsets[0] + t._sizes[0]
        known = t._crc_of[0]
        assert known >= 0
        rv, slow = native.read_verified, native.SLOW
        assert rv(m, off, end, key, known) == entries[0][1:]
        assert rv(m, off, end, b"absent", known) is None or entries[0][0] == b"absent"
        assert rv(m, off, end, key, -1) is slow  # not verified yet
        assert rv(m, off, end, key, known ^ 1) is slow  # the bytes changed since
        assert rv(m, off, len(m) + 10, key, known) is slow  # past the mapping
        assert rv(bytes(m), off, end, key, known) is slow  # not a mapping
        assert rv(m, off, end, bytearray(key), known) is slow  # not a bytes key
    assert rv(m, off, end, key, known) is slow  # closed with the table
