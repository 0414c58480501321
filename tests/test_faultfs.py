"""The fault-injecting file system itself: crash semantics, injected errors, crash points."""

from __future__ import annotations

import errno
import os

import pytest

from engine.errors import LockedError, StorageIOError
from engine.faultfs import FaultInjectionFS, InjectedCrash
from engine.vfs import FileSystem


@pytest.fixture
def fs():
    return FaultInjectionFS(seed=1)


def write(fs, path, data, *, sync=True):
    f = fs.open_writable(path)
    f.append(data)
    if sync:
        f.sync()
    f.close()


def test_unsynced_appends_are_dropped(fs, tmp_path):
    d = str(tmp_path)
    p = os.path.join(d, "a")
    f = fs.open_writable(p)
    fs.sync_dir(d)
    f.append(b"abc")
    f.sync()
    f.append(b"def")
    assert open(p, "rb").read() == b"abcdef"
    fs.crash()
    assert open(p, "rb").read() == b"abc"


def test_file_never_dir_synced_disappears_even_if_fsynced(fs, tmp_path):
    d = str(tmp_path)
    write(fs, os.path.join(d, "old"), b"x")
    fs.sync_dir(d)
    write(fs, os.path.join(d, "new"), b"data")
    fs.crash()
    assert sorted(os.listdir(d)) == ["old"]


def test_dir_synced_but_never_fsynced_file_is_empty(fs, tmp_path):
    d = str(tmp_path)
    write(fs, os.path.join(d, "f"), b"data", sync=False)
    fs.sync_dir(d)
    fs.crash()
    assert open(os.path.join(d, "f"), "rb").read() == b""


def test_preexisting_files_count_as_durable(fs, tmp_path):
    (tmp_path / "before").write_bytes(b"kept")
    f = fs.open_appendable(str(tmp_path / "before"))
    f.append(b" + lost")
    fs.crash()
    assert (tmp_path / "before").read_bytes() == b"kept"


def test_rename_without_dir_sync_is_undone(fs, tmp_path):
    d = str(tmp_path)
    cur, tmp = os.path.join(d, "CURRENT"), os.path.join(d, "000002.tmp")
    write(fs, cur, b"old\n")
    fs.sync_dir(d)
    write(fs, tmp, b"new\n")
    fs.rename(tmp, cur)
    assert open(cur, "rb").read() == b"new\n"
    fs.crash()
    assert sorted(os.listdir(d)) == ["CURRENT"] and open(cur, "rb").read() == b"old\n"


def test_rename_followed_by_dir_sync_survives(fs, tmp_path):
    d = str(tmp_path)
    cur, tmp = os.path.join(d, "CURRENT"), os.path.join(d, "000002.tmp")
    write(fs, cur, b"old\n")
    fs.sync_dir(d)
    write(fs, tmp, b"new\n")
    fs.rename(tmp, cur)
    fs.sync_dir(d)
    fs.crash()
    assert sorted(os.listdir(d)) == ["CURRENT"] and open(cur, "rb").read() == b"new\n"


def test_rename_of_durable_file_to_new_name_is_undone(fs, tmp_path):
    d = str(tmp_path)
    write(fs, os.path.join(d, "a"), b"AAA")
    fs.sync_dir(d)
    fs.rename(os.path.join(d, "a"), os.path.join(d, "b"))
    fs.crash()
    assert sorted(os.listdir(d)) == ["a"] and (tmp_path / "a").read_bytes() == b"AAA"


def test_remove_without_dir_sync_is_undone(fs, tmp_path):
    d = str(tmp_path)
    f = fs.open_writable(os.path.join(d, "t"))
    f.append(b"synced")
    f.sync()
    f.append(b"-unsynced")
    f.close()
    fs.sync_dir(d)
    fs.remove(os.path.join(d, "t"))
    write(fs, os.path.join(d, "other"), b"reuses the inode, maybe")
    fs.crash()
    assert sorted(os.listdir(d)) == ["t"] and (tmp_path / "t").read_bytes() == b"synced"
    fs.remove(os.path.join(d, "t"))
    fs.sync_dir(d)
    fs.crash()
    assert os.listdir(d) == []


def test_torn_mode_keeps_a_prefix_of_unsynced_data(tmp_path):
    kept = set()
    for seed in range(20):
        fs = FaultInjectionFS(seed=seed)
        d = tmp_path / str(seed)
        d.mkdir()
        p = str(d / "log")
        f = fs.open_writable(p)
        fs.sync_dir(str(d))
        f.append(b"0123")
        f.sync()
        f.append(b"456789")
        fs.crash("torn")
        data = open(p, "rb").read()
        assert b"0123456789".startswith(data) and len(data) >= 4
        kept.add(len(data))
    assert len(kept) > 3


def test_keep_mode_keeps_everything(fs, tmp_path):
    d = str(tmp_path)
    write(fs, os.path.join(d, "f"), b"abc", sync=False)
    fs.crash("keep")
    assert (tmp_path / "f").read_bytes() == b"abc"


def test_process_mode_keeps_files_but_not_their_durability(fs, tmp_path):
    """A process crash keeps what the OS has; a later power loss still drops what nobody
    synced, unless the next process syncs it."""
    d = str(tmp_path)
    f = fs.open_writable(os.path.join(d, "log"))
    fs.sync_dir(d)
    f.append(b"0123")
    f.sync()
    f.append(b"4567")  # in the OS only
    fs.crash("process")
    assert (tmp_path / "log").read_bytes() == b"01234567"
    fs.crash("drop")
    assert (tmp_path / "log").read_bytes() == b"0123"
    g = fs.open_appendable(os.path.join(d, "log"))
    g.append(b"89")
    fs.crash("process")
    g = fs.open_appendable(os.path.join(d, "log"))
    g.sync()  # the next process syncs: now it all survives
    fs.crash("drop")
    assert (tmp_path / "log").read_bytes() == b"012389"


def test_enospc_fails_appends(fs, tmp_path):
    f = fs.open_writable(str(tmp_path / "f"))
    f.append(b"ok")
    fs.fail_writes_with(errno.ENOSPC)
    with pytest.raises(StorageIOError) as ei:
        f.append(b"more")
    assert ei.value.errno == errno.ENOSPC
    fs.fail_writes_with(None)
    f.append(b"!")
    f.close()
    assert (tmp_path / "f").read_bytes() == b"ok!"


def test_enospc_after_bytes_writes_a_partial_record(fs, tmp_path):
    f = fs.open_writable(str(tmp_path / "f"))
    fs.fail_writes_with(errno.ENOSPC, after_bytes=5)
    f.append(b"abc")
    with pytest.raises(StorageIOError) as ei:
        f.append(b"defg")
    assert ei.value.errno == errno.ENOSPC
    with pytest.raises(StorageIOError):
        f.append(b"h")
    assert f.size == 5 and (tmp_path / "f").read_bytes() == b"abcde"


def test_failed_sync_makes_nothing_durable(fs, tmp_path):
    d = str(tmp_path)
    f = fs.open_writable(os.path.join(d, "f"))
    fs.sync_dir(d)
    f.append(b"data")
    fs.fail_sync(True)
    with pytest.raises(StorageIOError) as ei:
        f.sync()
    assert ei.value.errno == errno.EIO
    with pytest.raises(StorageIOError):
        fs.sync_dir(d)
    fs.crash()
    assert (tmp_path / "f").read_bytes() == b""


def test_failed_reads(fs, tmp_path):
    write(fs, str(tmp_path / "f"), b"abc")
    r = fs.open_readable(str(tmp_path / "f"))
    fs.fail_reads_with(errno.EIO)
    with pytest.raises(StorageIOError) as ei:
        r.read_at(0, 3)
    assert ei.value.errno == errno.EIO
    with pytest.raises(StorageIOError):
        fs.read_file(str(tmp_path / "f"))
    fs.fail_reads_with(None)
    assert r.read_at(0, 3) == b"abc"
    r.close()


def test_crash_after_n_operations(fs, tmp_path):
    d = str(tmp_path)
    fs.crash_after(3)
    f = fs.open_writable(os.path.join(d, "f"))  # op 1
    f.append(b"abc")  # op 2
    with pytest.raises(InjectedCrash):
        f.sync()  # op 3: the crash point; the sync does not happen
    assert fs.dead
    for call in (lambda: f.append(b"x"), lambda: fs.sync_dir(d), lambda: fs.listdir(d),
                 lambda: fs.open_writable(os.path.join(d, "g"))):
        with pytest.raises(InjectedCrash):
            call()
    assert fs.op_count == 3 and fs.ops["sync"] == 1
    fs.crash()
    assert not fs.dead and os.listdir(d) == []
    with pytest.raises(InjectedCrash):  # a handle from before the crash stays dead
        f.append(b"zombie")
    f.close()
    write(fs, os.path.join(d, "g"), b"after reboot")


def test_crash_during_append_leaves_a_random_prefix_in_keep_mode(tmp_path):
    lengths = set()
    for seed in range(10):
        fs = FaultInjectionFS(seed=seed)
        p = str(tmp_path / f"f{seed}")
        f = fs.open_writable(p)
        fs.crash_after(1)
        with pytest.raises(InjectedCrash):
            f.append(b"0123456789")
        fs.crash("keep")
        data = open(p, "rb").read()
        assert b"0123456789".startswith(data)
        lengths.add(len(data))
    assert len(lengths) > 2


def test_crash_releases_locks(fs, tmp_path):
    lock_path = str(tmp_path / "LOCK")
    fs.lock(lock_path)
    with pytest.raises(LockedError):
        fs.lock(lock_path)
    fs.crash()
    fs.lock(lock_path).release()


@pytest.mark.parametrize("kind", ["posix", "fault"])
def test_a_closed_writable_file_never_reaches_the_file_that_reuses_its_descriptor(tmp_path, kind):
    """Session 21 review: after close (even one that reports an error) the descriptor
    number may belong to the next file opened; append and sync must fail, not act on it."""
    fs = FileSystem() if kind == "posix" else FaultInjectionFS(seed=1)
    a = fs.open_writable(str(tmp_path / "a"))
    a.append(b"x")
    a.close()
    a.close()  # idempotent
    b = fs.open_writable(str(tmp_path / "b"))  # usually takes a's old descriptor number
    try:
        for op in (a.sync, lambda: a.append(b"into b?")):  # (an empty append: 21c's test)
            with pytest.raises(StorageIOError) as ei:
                op()
            assert ei.value.errno == errno.EBADF
        a.start_writeback(0, 1)  # advice: silent
        b.append(b"b")
    finally:
        b.close()
    assert open(tmp_path / "b", "rb").read() == b"b"
    assert open(tmp_path / "a", "rb").read() == b"x"
