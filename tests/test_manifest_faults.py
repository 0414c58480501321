"""The manifest under injected faults: a crash at any operation of create / log_and_apply /
rotation recovers to the last acknowledged state or the one being written, never an error."""

from __future__ import annotations

import os

import pytest

from engine import filenames as fn
from engine.errors import StorageIOError
from engine.faultfs import FaultInjectionFS, InjectedCrash
from engine.manifest import Manifest, obsolete_files
from engine.version_edit import FileMeta, VersionEdit


def state(m):
    return (m.current, m.log_number, m.last_sequence)


def scenario(fs, d, acked):
    m = Manifest.create(fs, d, max_manifest_bytes=120)  # rotates every few edits
    acked.append(state(m))
    for i in range(8):
        edit = VersionEdit(last_sequence=10 * (i + 1))
        edit.add_file(0, FileMeta(m.new_file_number(), 100, b"a%d" % i, b"b%d" % i))
        if i % 3 == 2:
            edit.delete_file(0, m.current.levels[0][-1].number)
        if i == 5:
            edit.log_number = m.new_file_number()
        m.log_and_apply(edit)
        acked.append(state(m))
    m.close()


@pytest.mark.parametrize("mode", ["drop", "torn", "keep"])
def test_crash_at_every_operation(tmp_path, mode):
    dry = FaultInjectionFS()
    states: list = []
    scenario(dry, str(tmp_path / "dry"), states)
    total = dry.op_count
    assert dry.ops["rename"] >= 3  # create + at least two rotations
    for n in range(1, total + 1):
        fs = FaultInjectionFS(seed=n)
        d = str(tmp_path / f"{mode}-{n}")
        acked: list = []
        fs.crash_after(n)
        with pytest.raises(InjectedCrash):
            scenario(fs, d, acked)
        fs.crash(mode)
        if not os.path.exists(fn.current_file_name(d)):
            assert not acked, (mode, n)  # the DB was never created
            continue
        m = Manifest.recover(fs, d)
        got = state(m)
        k = len(acked)
        assert got in states[max(k - 1, 0) : k + 1], (mode, n)
        # The recovered DB keeps working, and a second recovery agrees.
        m.log_and_apply(VersionEdit(last_sequence=1000))
        want = state(m)
        m.close()
        assert state(Manifest.recover(fs, d, read_only=True)) == want
        leftovers = obsolete_files(fs, d, m)
        assert fn.read_current_file(fs, d) not in {os.path.basename(p) for p in leftovers}


def test_failed_manifest_sync_stops_edits_until_reopen(tmp_path):
    fs = FaultInjectionFS()
    d = str(tmp_path)
    m = Manifest.create(fs, d)
    before = state(m)
    fs.fail_sync(True)
    edit = VersionEdit(last_sequence=5)
    edit.add_file(0, FileMeta(m.new_file_number(), 1, b"a", b"b"))
    with pytest.raises(StorageIOError):
        m.log_and_apply(edit)
    assert state(m) == before  # not installed
    fs.fail_sync(False)
    with pytest.raises(StorageIOError, match="earlier write failed"):
        m.log_and_apply(VersionEdit(last_sequence=6))
    m.close()
    fs.crash()  # the unsynced edit is lost
    assert state(Manifest.recover(fs, d)) == before
