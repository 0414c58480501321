"""File names: build/parse round trips, foreign names, CURRENT written atomically."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import filenames as fn
from engine.errors import CorruptionError, StorageIOError
from engine.filenames import FileKind
from engine.vfs import FileSystem


@given(st.integers(0, 10**12))
def test_round_trip(number):
    for build, kind in [
        (fn.table_file_name, FileKind.TABLE),
        (fn.log_file_name, FileKind.LOG),
        (fn.manifest_file_name, FileKind.MANIFEST),
        (fn.temp_file_name, FileKind.TEMP),
    ]:
        path = build("/db", number)
        assert os.path.dirname(path) == "/db"
        assert fn.parse_file_name(os.path.basename(path)) == (kind, number)


def test_exact_names():
    assert fn.table_file_name("d", 12) == os.path.join("d", "000012.sst")
    assert fn.log_file_name("d", 11) == os.path.join("d", "000011.log")
    assert fn.manifest_file_name("d", 3) == os.path.join("d", "MANIFEST-000003")
    assert fn.temp_file_name("d", 1234567) == os.path.join("d", "1234567.tmp")
    assert fn.parse_file_name("CURRENT") == (FileKind.CURRENT, 0)
    assert fn.parse_file_name("LOCK") == (FileKind.LOCK, 0)


@pytest.mark.parametrize(
    "name",
    ["12.sst", "000012.SST", "000012.sst.bak", "MANIFEST-", "MANIFEST-12", "MANIFEST-00001a",
     "x000012.log", "0000012.log", "LOG", "current", "notes.txt", "", ".sst", "００００１２.sst",
     "000012.", "-00012.log"],
)
def test_foreign_names(name):
    assert fn.parse_file_name(name) is None


def test_list_files_skips_foreign(tmp_path):
    fs = FileSystem()
    for name in ["000001.log", "000002.sst", "MANIFEST-000003", "CURRENT", "LOCK", "x.txt", "000009.tmp"]:
        (tmp_path / name).write_bytes(b"")
    got = fn.list_files(fs, str(tmp_path))
    assert [(k, n) for k, n, _ in got] == [
        (FileKind.LOG, 1), (FileKind.TABLE, 2), (FileKind.TEMP, 9),
        (FileKind.CURRENT, 0), (FileKind.LOCK, 0), (FileKind.MANIFEST, 3),
    ]


def test_set_and_read_current(tmp_path):
    fs = FileSystem()
    d = str(tmp_path)
    fn.set_current_file(fs, d, 5)
    assert (tmp_path / "CURRENT").read_bytes() == b"MANIFEST-000005\n"
    assert fn.read_current_file(fs, d) == "MANIFEST-000005"
    fn.set_current_file(fs, d, 8)
    assert fn.read_current_file(fs, d) == "MANIFEST-000008"
    assert sorted(os.listdir(d)) == ["CURRENT"]  # the temp file was renamed away


@pytest.mark.parametrize("content", [b"", b"MANIFEST-000005", b"MANIFEST-5\n", b"000005.log\n", b"\xff\xfe\n",
                                     b"MANIFEST-000005\nMANIFEST-000006\n"])
def test_bad_current_is_corruption(tmp_path, content):
    (tmp_path / "CURRENT").write_bytes(content)
    with pytest.raises(CorruptionError):
        fn.read_current_file(FileSystem(), str(tmp_path))


def test_missing_current_is_io_error(tmp_path):
    with pytest.raises(StorageIOError):
        fn.read_current_file(FileSystem(), str(tmp_path))
