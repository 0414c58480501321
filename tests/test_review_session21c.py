"""Session 21c review of session 21's changes (fce181b..721fa4f): the memtable switch with the
DB mutex released, the closed WritableFile, router/wire_sizes.py and the MultiGet answer-size
checks.

Checked and holding (no test here; the existing tests cover them):

- engine/db.py ``_switch_memtable``: the mutex is released once and re-acquired exactly once
  (``try``/``finally`` around all of the I/O; nothing between ``release`` and ``try``), so
  every exit, the sync_dir and open_writable failures included, returns with it held, the
  state untouched on those failures. While it is out, only the group-commit leader can change
  ``_mem``/``_log``/``_log_broken`` (the leader stays at the head of the queue until its
  ``commit`` returns; the fast path needs an empty queue; a follower leaving at its deadline
  is never the head), so reading ``self._mem.log_number`` there is safe; the flush thread may
  install an older memtable and write an edit whose log number is the switching memtable's
  (a lower bound: harmless), and remove that older memtable's log; close() joins the
  background threads and then waits for the queue. ``log_errors`` and ``_set_bg_error`` run
  after re-acquiring. ``_remove_file`` swallows SieveError; only InjectedCrash (a simulated
  death) passes through it.
- MultiGetResponse overhead bound (shard/limits.py): encoding = [1 + varint(n) + n if n]
  + sum(1 + varint(len_i)); varint(len) <= 5 below 32 GiB (a value is at most ~2 GiB) and
  varint(n) <= 10, so overhead <= 7 n + 11 <= 7 n + 16 for every n (n = 0: 0 bytes). Checked
  against ByteSize() for 2,000 random answers (n up to 3,000, values of 0/1/127/128/16384
  bytes, found all false included). The router's ``limit - left`` is exactly the sum of the
  parts' value lengths (no dedupe of repeated keys), an upper bound on the merged values;
  ``limit``/``left`` are assigned before any path that reaches the code after the finally
  (an exception in the try leaves the function), including an empty key list.
- router/wire_sizes.py: mutation_bytes, delete_bytes, put_request_bytes (sync None / True /
  False) and a WriteRequest's sum plus SYNC_FIELD_BYTES equal ByteSize() for random lengths
  and every varint boundary up to 2**21 + 1 (key, value and the Mutation's own length).
  WriteBatcher: ``sync=False`` is counted (an optional bool is written when set), None not.

Finding (a strict xfail at first; fixed in session 21, now a plain test):

- A closed WritableFile accepts ``append(b"")`` without error (engine/vfs.py: the ``while mv``
  loop never calls os.write, and the write counters are bumped), and so does
  FaultInjectionFS's (it forwards a closed file's append to that code), though vfs.py's
  close() docstring promises "later appends and syncs fail with EBADF" and faultfs.py says
  "EBADF, as the real call" (os.write(-1, b"") raises EBADF). Low severity: the engine never
  appends nothing, but the contract the session wrote does not hold.
"""

from __future__ import annotations

import errno

import pytest

from engine.errors import StorageIOError
from engine.faultfs import FaultInjectionFS
from engine.vfs import FileSystem


# Fixed in session 21 (was a strict xfail): append checks ``closed`` first.
@pytest.mark.parametrize("kind", ["posix", "fault"])
def test_an_empty_append_on_a_closed_file_fails_with_ebadf(tmp_path, kind):
    fs = FileSystem() if kind == "posix" else FaultInjectionFS(seed=21)
    f = fs.open_writable(str(tmp_path / "a"))
    f.append(b"abc")
    f.close()
    calls = fs.counters.write_calls
    with pytest.raises(StorageIOError) as ei:
        f.append(b"")
    assert ei.value.errno == errno.EBADF
    assert fs.counters.write_calls == calls
