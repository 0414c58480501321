"""Manifest: create/recover, many edits, torn tail, corruption, rotation, obsolete files."""

from __future__ import annotations

import os
import random

import pytest

from engine import filenames as fn
from engine.errors import ClosedError, CorruptionError, InvalidArgumentError
from engine.manifest import Manifest, obsolete_files
from engine.vfs import FileSystem
from engine.version_edit import FileMeta, VersionEdit


@pytest.fixture
def fs():
    return FileSystem()


def add(m, level, lo, hi):
    n = m.new_file_number()
    m.log_and_apply(VersionEdit(new_files=[(level, FileMeta(n, 100, lo, hi, num_entries=3))]))
    return n


def state(m):
    return (m.current, m.log_number, m.last_sequence, m.compact_pointers)


def test_create_then_recover_empty(fs, tmp_path):
    d = str(tmp_path / "db")
    m = Manifest.create(fs, d)
    assert sorted(os.listdir(d)) == ["CURRENT", "MANIFEST-000001"]
    assert fn.read_current_file(fs, d) == "MANIFEST-000001"
    assert m.next_file_number == 2 and m.current.total_files() == 0
    m.close()
    r = Manifest.recover(fs, d)
    assert r.current.total_files() == 0 and r.log_number == 0 and r.last_sequence == 0
    assert r.manifest_number == 2 and r.next_file_number == 3
    assert fn.read_current_file(fs, d) == "MANIFEST-000002"
    with pytest.raises(InvalidArgumentError):
        Manifest.create(fs, d)


def test_many_random_edits_survive_recovery(fs, tmp_path):
    d = str(tmp_path)
    rng = random.Random(5)
    m = Manifest.create(fs, d)
    for i in range(300):
        edit = VersionEdit(last_sequence=m.last_sequence + rng.randrange(0, 50))
        l0 = m.current.levels[0]
        if l0 and rng.random() < 0.3:
            edit.delete_file(0, rng.choice(l0).number)
        if rng.random() < 0.8:
            n = m.new_file_number()
            edit.add_file(0, FileMeta(n, rng.randrange(1, 1 << 30), b"a%d" % i, b"z%d" % i, smallest_seq=1, largest_seq=i + 1))
        if rng.random() < 0.1:
            edit.log_number = m.new_file_number()
        if rng.random() < 0.1:
            edit.set_compact_pointer(rng.randrange(1, 7), b"k%d" % i)
        m.log_and_apply(edit)
    want = state(m)
    next_number = m.next_file_number
    m.close()
    r = Manifest.recover(fs, d)
    assert state(r) == want
    assert r.next_file_number == next_number + 1  # one number went to the new manifest
    r.close()
    assert state(Manifest.recover(fs, d, read_only=True)) == want


def test_torn_last_record_is_dropped(fs, tmp_path):
    d = str(tmp_path)
    m = Manifest.create(fs, d)
    add(m, 0, b"a", b"b")
    before = state(m)
    size_before = m.manifest_size
    add(m, 0, b"c", b"d")
    path = m.manifest_path
    m.close()
    for cut in range(size_before + 1, os.path.getsize(path)):
        with open(path, "r+b") as f:
            f.truncate(cut)
        r = Manifest.recover(fs, d, read_only=True)
        assert state(r) == before and r.recovered_torn_bytes == cut - size_before
    r = Manifest.recover(fs, d)  # rewrites a clean snapshot into a new manifest
    assert state(r) == before and r.manifest_path != path
    r.close()
    assert Manifest.recover(fs, d, read_only=True).recovered_torn_bytes == 0


def test_unwritten_sectors_in_the_last_record_are_a_torn_tail(fs, tmp_path):
    """What a crash leaves when the file's size was recorded but not all its sectors were
    written (zeros from a 512-byte boundary, or the whole record zero) is dropped like a cut;
    the same record with other wrong bytes is corruption (session 6: the strict tail rule)."""
    d = str(tmp_path)
    m = Manifest.create(fs, d)
    add(m, 0, b"a", b"b")
    before = state(m)
    start = m.manifest_size
    add(m, 0, b"c" * 1500, b"d" * 1500)  # a last record over several sectors
    path = m.manifest_path
    m.close()
    data = open(path, "rb").read()
    assert len(data) - start > 3 * 512
    first_boundary = (start // 512 + 1) * 512
    for z in (start, first_boundary, first_boundary + 512, first_boundary + 1024):
        open(path, "wb").write(data[:z] + bytes(len(data) - z))
        r = Manifest.recover(fs, d, read_only=True)
        assert state(r) == before and r.recovered_torn_bytes == len(data) - start, z
    flipped = bytearray(data)
    flipped[first_boundary + 10] ^= 1
    zeroed = bytearray(data)
    zeroed[first_boundary + 100] = 0  # a 'd' (3 bits), with no zero run from a boundary
    # also a flipped bit where the payload ends in zeros from a boundary on (its f64 and varint
    # fields): the single-bit search tells it from unwritten sectors
    tail = bytearray(data)
    tail[start + 20] ^= 4
    for bad in (bytes(zeroed), bytes(flipped), bytes(tail)):
        open(path, "wb").write(bad)
        with pytest.raises(CorruptionError) as info:
            Manifest.recover(fs, d, read_only=True)
        assert info.value.offset == start and "last record is damaged" in str(info.value)


def test_corruption_before_the_tail_is_an_error(fs, tmp_path):
    d = str(tmp_path)
    m = Manifest.create(fs, d)
    first_end = m.manifest_size
    add(m, 0, b"a", b"b")
    add(m, 0, b"c", b"d")
    path = m.manifest_path
    m.close()
    data = bytearray(open(path, "rb").read())
    data[first_end + 12] ^= 0xFF  # inside the second record; a third follows
    open(path, "wb").write(bytes(data))
    with pytest.raises(CorruptionError) as ei:
        Manifest.recover(fs, d)
    assert ei.value.path == path and ei.value.offset == first_end
    assert fn.read_current_file(fs, d) == os.path.basename(path)  # nothing was rewritten


def test_torn_first_record_and_bad_current(fs, tmp_path):
    d = str(tmp_path)
    m = Manifest.create(fs, d)
    path = m.manifest_path
    m.close()
    with open(path, "r+b") as f:
        f.truncate(5)
    with pytest.raises(CorruptionError, match="no complete record"):
        Manifest.recover(fs, d)
    fn.set_current_file(fs, d, 77)
    # CURRENT names a manifest that does not exist: corruption (LevelDB's "CURRENT points to
    # a non-existent file"), not an I/O error.
    with pytest.raises(CorruptionError, match="MANIFEST-000077, which does not exist"):
        Manifest.recover(fs, d)


def test_edits_that_do_not_apply_are_refused_without_writing(fs, tmp_path):
    m = Manifest.create(fs, str(tmp_path))
    n = add(m, 1, b"a", b"c")
    size = m.manifest_size
    bad = [
        VersionEdit(deleted_files=[(2, n)]),
        VersionEdit(new_files=[(1, FileMeta(m.new_file_number(), 1, b"b", b"d"))]),  # overlaps
        VersionEdit(new_files=[(0, FileMeta(m.next_file_number + 5, 1, b"b", b"d"))]),  # not allocated
        VersionEdit(log_number=m.next_file_number + 1),
        VersionEdit(last_sequence=-1),
        VersionEdit(comparator="other"),
    ]
    for edit in bad:
        with pytest.raises(InvalidArgumentError):
            m.log_and_apply(edit)
    assert m.manifest_size == size and m.current.num_files(1) == 1
    m.log_and_apply(VersionEdit(last_sequence=10))  # still usable
    m.close()
    with pytest.raises(ClosedError):
        m.log_and_apply(VersionEdit())


def test_rotation_keeps_state_and_removes_old_manifest(fs, tmp_path):
    d = str(tmp_path)
    m = Manifest.create(fs, d, max_manifest_bytes=300)
    numbers = {m.manifest_number}
    for i in range(60):
        add(m, 0, b"k%03d" % i, b"k%03d" % i)
        numbers.add(m.manifest_number)
        assert m.manifest_size < 300 + 200 + 60 * 30  # a snapshot plus at most a few edits
    assert len(numbers) > 3
    manifests = [n for n in os.listdir(d) if n.startswith("MANIFEST-")]
    assert manifests == [os.path.basename(m.manifest_path)]
    assert fn.read_current_file(fs, d) == manifests[0]
    want = state(m)
    m.close()
    assert state(Manifest.recover(fs, d)) == want


def test_read_only_recovery_writes_nothing(fs, tmp_path):
    d = str(tmp_path)
    Manifest.create(fs, d).close()
    before = sorted(os.listdir(d))
    r = Manifest.recover(fs, d, read_only=True)
    assert sorted(os.listdir(d)) == before
    with pytest.raises(InvalidArgumentError):
        r.log_and_apply(VersionEdit())


def test_obsolete_files_and_logs_to_replay(fs, tmp_path):
    d = str(tmp_path)
    m = Manifest.create(fs, d)
    live = add(m, 0, b"a", b"b")
    log_old = m.new_file_number()
    log_new = m.new_file_number()
    m.log_and_apply(VersionEdit(log_number=log_new))
    dead = m.new_file_number()
    pending = m.new_file_number()
    for name in [fn.table_file_name(d, n) for n in (live, dead, pending, 999)] + [
        fn.log_file_name(d, log_old), fn.log_file_name(d, log_new), fn.log_file_name(d, 1000),
        fn.temp_file_name(d, 55), fn.manifest_file_name(d, 40), os.path.join(d, "notes.txt"), fn.lock_file_name(d),
    ]:
        open(name, "wb").close()
    got = obsolete_files(fs, d, m, pending={pending})
    assert sorted(os.path.basename(p) for p in got) == sorted(
        os.path.basename(p) for p in [
            fn.table_file_name(d, dead), fn.table_file_name(d, 999), fn.log_file_name(d, log_old),
            fn.temp_file_name(d, 55), fn.manifest_file_name(d, 40),
        ]
    )
    assert m.logs_to_replay() == [(log_new, fn.log_file_name(d, log_new)), (1000, fn.log_file_name(d, 1000))]
    assert m.new_file_number() == 1001


@pytest.mark.parametrize(
    "edit",
    [
        VersionEdit(compact_pointers=[(7, b"k")]),
        VersionEdit(new_files=[(0, FileMeta(2, 1, b"a", b"b", smallest_seq=-1, largest_seq=0))]),
        VersionEdit(new_files=[(0, FileMeta(2, 1, "a", "b"))]),
        VersionEdit(new_files=[(0, FileMeta(2, 1, b"a", b"b", filter_bytes=1 << 64))]),
    ],
)
def test_unencodable_edits_are_refused_and_the_manifest_stays_usable(fs, tmp_path, edit):
    m = Manifest.create(fs, str(tmp_path))
    assert m.new_file_number() == 2
    size = m.manifest_size
    with pytest.raises(InvalidArgumentError):
        m.log_and_apply(edit)
    assert m.manifest_size == size
    add(m, 0, b"a", b"b")
    m.close()
    assert Manifest.recover(fs, str(tmp_path)).current.num_files(0) == 1


def test_every_flipped_byte_is_an_error(fs, tmp_path):
    """Session 6: damage to the last record is corruption too, never an earlier state (which
    was the rule before: an older version came back and the newer tables were deleted; see
    tests/test_corruption_sweep.py). Only a short record or zero sectors are a torn tail."""
    d = str(tmp_path)
    m = Manifest.create(fs, d)
    states = [state(m)]
    for i in range(3):
        add(m, 1, b"k%d" % i, b"k%d" % i)
        states.append(state(m))
    path = m.manifest_path
    m.close()
    data = open(path, "rb").read()
    outcomes = set()
    for pos in range(len(data)):
        bad = bytearray(data)
        bad[pos] ^= 0x20
        open(path, "wb").write(bytes(bad))
        try:
            got = state(Manifest.recover(fs, d, read_only=True))
        except CorruptionError:
            outcomes.add("corruption")
            continue
        outcomes.add(("read", pos, got == states[-1], got == states[-2]))
    assert outcomes == {"corruption"}


def test_strict_tail_tells_an_unwritten_sector_from_a_flipped_bit(tmp_path):
    """The manifest's rule at record level (engine/wal/reader.py strict_tail): a record whose
    last sector a crash never wrote is one bit away from valid when that sector held a single
    byte with one bit set; that is still a torn tail. The same one-bit difference before the
    trailing zeros is damage (no crash changes a written sector)."""
    from engine.vfs import default_fs
    from engine.wal import LogWriter, parse_log

    path = str(tmp_path / "m.log")
    w = LogWriter(default_fs().open_writable(path))
    w.add_record(b"first")
    start = w.size
    # the record's last byte is alone in its sector and is 0x01; the bytes before end in zeros
    n = 2 * 512 + 1 - start - 9
    payload = b"x" * (n - 40) + bytes(39) + b"\x01"
    w.add_record(payload)
    w.close()
    data = open(path, "rb").read()
    assert len(data) == 2 * 512 + 1
    torn = data[:-1] + b"\0"  # the last sector never written
    res = parse_log(torn, strict_tail=True)
    assert res.records == [b"first"] and res.dropped_bytes == len(data) - start
    flipped = bytearray(data)
    flipped[start + 9 + 5] ^= 0x04  # an 'x' well before the zeros
    with pytest.raises(CorruptionError):
        parse_log(bytes(flipped), strict_tail=True)
    assert parse_log(bytes(flipped)).records == [b"first"]  # the log's lenient rule drops it
    # a payload that ends in zeros from a sector boundary by itself, with a flipped bit before
    # them: one bit away, and that bit was in a written sector: damage, not a torn write
    q = str(tmp_path / "n.log")
    w = LogWriter(default_fs().open_writable(q))
    w.add_record(b"first")
    w.add_record(b"x" * (n - 1) + b"\0")
    w.close()
    natural = bytearray(open(q, "rb").read())
    natural[start + 9 + 5] ^= 0x04
    with pytest.raises(CorruptionError):
        parse_log(bytes(natural), strict_tail=True)
