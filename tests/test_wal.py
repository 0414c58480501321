"""Write-ahead log record framing: round trips, torn tails, corruption in the middle."""

from __future__ import annotations

import os
import random

import pytest

from engine.errors import CorruptionError, StorageIOError
from engine.format import LOG_HEADER, LOG_HEADER_SIZE
from engine.vfs import FileSystem
from engine.wal import LogWriter, parse_log, read_log
from engine.wal.record import record_crc
from engine import checksum


def write_log(tmp_path, payloads, name="000001.log"):
    fs = FileSystem()
    path = str(tmp_path / name)
    w = LogWriter(fs.open_writable(path))
    for p in payloads:
        w.add_record(p)
    w.sync()
    w.close()
    return fs, path


def image(payloads):
    """The bytes a LogWriter produces for ``payloads``, plus each record's start offset."""
    out, offsets = bytearray(), []
    for p in payloads:
        offsets.append(len(out))
        crc = checksum.mask(record_crc(len(out), 1, p))
        out += LOG_HEADER.pack(crc, len(p), 1) + p
    return bytes(out), offsets


def test_round_trip_empty_large_and_many_small(tmp_path):
    rng = random.Random(1)
    payloads = [b"", rng.randbytes(1_500_000), b""] + [rng.randbytes(rng.randrange(0, 40)) for _ in range(2000)]
    fs, path = write_log(tmp_path, payloads)
    res = read_log(fs, path)
    assert list(res) == payloads
    assert not res.torn_tail and res.dropped_bytes == 0
    assert res.end_offset == res.file_size == os.path.getsize(path)
    assert res.file_size == sum(len(p) + LOG_HEADER_SIZE for p in payloads)


def test_writer_matches_documented_image(tmp_path):
    payloads = [b"a", b"", b"hello world" * 3]
    fs, path = write_log(tmp_path, payloads)
    assert fs.read_file(path) == image(payloads)[0]


def test_empty_file_has_no_records():
    res = parse_log(b"")
    assert res.records == [] and not res.torn_tail


def test_appending_after_reopen_continues_offsets(tmp_path):
    fs, path = write_log(tmp_path, [b"one", b"two"])
    w = LogWriter(fs.open_appendable(path))
    assert w.size == os.path.getsize(path)
    w.add_record(b"three")
    w.sync()
    w.close()
    assert read_log(fs, path).records == [b"one", b"two", b"three"]


def test_truncation_at_every_offset_gives_a_clean_prefix():
    rng = random.Random(2)
    payloads = [rng.randbytes(n) for n in (0, 1, 7, 30, 0, 64, 3, 200, 9, 1)]
    data, offsets = image(payloads)
    ends = [o + LOG_HEADER_SIZE + len(p) for o, p in zip(offsets, payloads)]
    for cut in range(len(data) + 1):
        res = parse_log(data[:cut])
        complete = sum(1 for e in ends if e <= cut)
        assert res.records == payloads[:complete], cut
        assert res.end_offset == (ends[complete - 1] if complete else 0)
        assert res.dropped_bytes == cut - res.end_offset


def test_flipped_byte_in_a_middle_record_is_corruption_at_its_offset():
    rng = random.Random(3)
    payloads = [rng.randbytes(n) for n in (5, 0, 40, 12, 3)]
    data, offsets = image(payloads)
    last = offsets[-1]
    for pos in range(last):  # every byte of every record but the last
        bad = bytearray(data)
        bad[pos] ^= 0x5A
        start = max(o for o in offsets if o <= pos)
        with pytest.raises(CorruptionError) as ei:
            parse_log(bytes(bad), "x.log")
        assert ei.value.offset == start and ei.value.path == "x.log"


def test_flipped_byte_in_the_last_record_is_a_torn_tail():
    payloads = [b"first", b"second", b"the last record"]
    data, offsets = image(payloads)
    for pos in range(offsets[-1], len(data)):
        bad = bytearray(data)
        bad[pos] ^= 0x01
        res = parse_log(bytes(bad))
        assert res.records == payloads[:-1]
        assert res.end_offset == offsets[-1] and res.dropped_bytes == len(data) - offsets[-1]


@pytest.mark.parametrize("zeros", [1, 8, 9, 10, 100, 4096, 1 << 20])
def test_zero_filled_tail_is_a_torn_tail(zeros):
    payloads = [b"a" * 10, b"b" * 20]
    data, _ = image(payloads)
    res = parse_log(data + bytes(zeros))
    assert res.records == payloads and res.dropped_bytes == zeros


def test_zeroed_partial_last_record_is_a_torn_tail():
    payloads = [b"a" * 10, b"b" * 300]
    data, offsets = image(payloads)
    bad = data[: offsets[1] + 50] + bytes(len(data) - offsets[1] - 50 + 4096)
    res = parse_log(bad)
    assert res.records == payloads[:1] and res.end_offset == offsets[1]


def test_zeroed_block_in_the_middle_with_valid_records_after_is_corruption():
    payloads = [b"x" * 100 for _ in range(5)]
    data, offsets = image(payloads)
    bad = data[: offsets[1]] + bytes(offsets[3] - offsets[1]) + data[offsets[3]:]
    with pytest.raises(CorruptionError) as ei:
        parse_log(bad)
    assert ei.value.offset == offsets[1]


def test_random_garbage_tail_is_a_torn_tail():
    rng = random.Random(4)
    payloads = [b"a" * 10, b"b" * 20]
    data, _ = image(payloads)
    for _ in range(50):
        tail = rng.randbytes(rng.randrange(1, 2000))
        res = parse_log(data + tail)
        assert res.records == payloads and res.dropped_bytes == len(tail)


def test_a_record_copied_inside_a_payload_does_not_hide_a_torn_tail():
    # The checksum covers the record's offset, so a log image stored as a value is not
    # mistaken for a valid record when the record holding it is torn.
    inner, _ = image([b"inner record"])
    payloads = [b"head", b"pad" + inner + b"more"]
    data, offsets = image(payloads)
    res = parse_log(data[:-2])
    assert res.records == [b"head"] and res.end_offset == offsets[1]


def test_valid_checksum_with_unknown_type_is_corruption():
    payload = b"future"
    crc = checksum.mask(record_crc(0, 7, payload))
    with pytest.raises(CorruptionError, match="type 7"):
        parse_log(LOG_HEADER.pack(crc, len(payload), 7) + payload)


def test_read_log_of_missing_file_is_an_io_error(tmp_path):
    with pytest.raises(StorageIOError):
        read_log(FileSystem(), str(tmp_path / "nope.log"))


def test_truncated_file_on_disk(tmp_path):
    fs, path = write_log(tmp_path, [b"r1", b"r2", b"r3" * 100])
    os.truncate(path, os.path.getsize(path) - 5)
    res = read_log(fs, path)
    assert res.records == [b"r1", b"r2"] and res.torn_tail


def test_damage_far_from_the_next_record_is_still_found():
    # The scan works in 64 KiB windows; the next valid record here starts ~200 KiB later.
    payloads = [b"head", bytes([1]) * 200_000, b"after"]
    data, offsets = image(payloads)
    bad = bytearray(data)
    bad[offsets[1] + 100] ^= 0xFF
    with pytest.raises(CorruptionError) as ei:
        parse_log(bytes(bad))
    assert ei.value.offset == offsets[1]


def test_tail_of_type_bytes_is_a_torn_tail():
    payloads = [b"head", b"\x01" * 300_000]
    data, offsets = image(payloads)
    res = parse_log(data[:-1])
    assert res.records == [b"head"] and res.end_offset == offsets[1]
