"""The memtable: the newest version of each recently written key, in key order.

A :class:`MemTable` maps each key to its newest entry ``(seq, kind, value)``. Deletes are
stored as ``(seq, KIND_DELETE, b"")`` tombstones so that they hide older versions in tables.
Older versions are kept only while a scan reads the memtable (Snapshots, below).

An entry is held as one *record*, a bytes object: the 8-byte tag ``seq << 8 | kind``
(little-endian, as in a table's entries: docs/format.md "Data blocks"), then the value. So its
first byte is the kind and ``record[8:]`` the value. One object per entry instead of a
``(seq, kind, value)`` tuple, a seq int and the value: 88 bytes less per entry (tracemalloc,
CPython 3.11), so the same ``memtable_bytes`` holds ~22% more entries of 16-byte keys and
100-byte values (ENTRY_OVERHEAD). The cost is one copy of the value per write (when the
record is built), and one per read that finds the key here (``record[8:]``).

Layout: a plain ``dict`` holds the entries (point lookups and overwrites: one hash operation)
and a ``sortedcontainers.SortedList`` holds the keys in order. New keys are not inserted into
the SortedList one by one: they are appended to a pending list and merged in a batch
(``SortedList.update``, a C sort) when an ordered read needs them (a scan, or the flush).
Profiling the put path showed ``SortedDict.__setitem__`` at ~25% of a put's CPU; this way a put
costs one dict store and, for a new key, one list append.

Thread safety:
- One writer at a time calls :meth:`add` (the DB holds its mutex or is the group-commit
  leader); it holds ``self.lock`` while it mutates.
- A batch (a group commit's writes) becomes visible to readers at once: :meth:`add` builds
  its records first, then stores them with one ``dict.update``, a C call that runs no Python
  code for bytes keys and values (and allocates no object the garbage collector tracks), so
  no other thread runs during it. Storing them one by one let a lock-free reader see the
  first keys of a batch written and the last not yet (tests/test_batch_visibility.py).
- :attr:`get_record` (the hot path: DB.get) and :meth:`get` take no lock: one ``dict.get``
  (atomic under the GIL).
- :meth:`iterate` copies the requested range lazily, ``chunk`` entries at a time, under
  ``self.lock`` (merging pending keys first). Without a snapshot, entries written after the
  iterator passed them are not seen and entries written ahead of it are; with one (below),
  what it returns is the memtable as it was when the snapshot was taken.
- Once frozen (:meth:`freeze`) the memtable is never mutated again. Freezing does not sort:
  it runs in a writer's path (the memtable switch), so the pending keys are merged by the
  first ordered read instead (:meth:`items`, a scan), or never, when a table worker process
  flushes the memtable from :meth:`columns` and sorts there.

Snapshots (what makes a scan a point-in-time read): :meth:`snapshot` returns the largest
sequence number stored, ``S``, and until the matching :meth:`release` every record that a write
replaces is kept in ``_history`` (key -> its replaced records, oldest first). ``iterate(...,
snapshot=S)`` then returns, for each key, its newest record with a sequence number <= S, and
skips a key with none (written after S: absent from this memtable at S, so older sources
answer for it). A DB applies records in sequence order (one writer at a time), so the records
<= S are exactly what the memtable held when S was taken. Log replay may not: after a crash
while recovery copied the last log, a read-only open replays that log and then its partial
copy, so S is the largest number stored, not the last one applied (tests/
test_review_session18.py). Once every snapshot is released, the next snapshot or the next
write that replaces a record drops the history; a frozen memtable takes no writes, so it
keeps its history until a later snapshot of it (a snapshot's read) or until it is freed
(after its flush, once no read state holds it). Kept records
cost no memory the flush trigger does not see: ``approximate_bytes`` already counts every
write, overwrites included (below).

Sizes: ``approximate_bytes`` counts ``len(key) + len(value) + ENTRY_OVERHEAD`` for every write
(overwrites included, as LevelDB's arena does), which is what the flush trigger compares:
ENTRY_OVERHEAD is what an entry's Python objects take beyond its key and value bytes, so the
count is the memtable's real memory (an overwrite frees the entry it replaces, so a memtable of
overwrites is charged more than it holds: it flushes early, never late).
"""

from __future__ import annotations

import pickle
import struct
import threading
from array import array
from itertools import accumulate, chain
from operator import itemgetter
from typing import Iterator, NamedTuple

from sortedcontainers import SortedList

ENTRY_OVERHEAD = 176
"""Bytes charged per entry besides key and value: what the entry's Python objects take beyond
the key's and value's bytes (CPython 3.11, 64-bit): the key's and the record's bytes object
headers, the dict slot, the key's place in the pending list or SortedList, and allocator
rounding. So ``memtable_bytes`` bounds the memtable's real memory, as RocksDB's
write_buffer_size bounds its arena. Measured (session 14) as the growth of the process's
anonymous RSS while a memtable takes 100k-500k entries of 16-byte keys and 100-byte values and
sorts its keys: 158-176 bytes per entry beyond them (tracemalloc: 118 requested before the
sort). Until session 14 an entry was a (seq, kind, value) tuple beside a seq int, charged 240
bytes and measured the same way at 256-274; until session 13 it was charged 16."""

_TAG = struct.Struct("<Q")  # docs/format.md "Data blocks": the entry tag, seq << 8 | kind
_pack_tag = _TAG.pack
_tag_at = _TAG.unpack_from


def decode_record(record: bytes) -> tuple[int, int, bytes]:
    """``(seq, kind, value)`` of a memtable record (see the module docstring)."""
    tag = _tag_at(record)[0]
    return tag >> 8, tag & 0xFF, record[8:]


class MemTable:
    """Sorted map of recent writes to their newest records (older ones kept only for open
    snapshots). See the module docstring for the contract."""

    __slots__ = ("_data", "_keys", "_pending", "get_record", "lock", "approximate_bytes",
                 "log_number", "frozen", "last_seq", "_history", "_snapshots", "_released")

    def __init__(self, log_number: int = 0):
        self._data: dict = {}
        self._keys = SortedList()
        self._pending: list = []  # keys in _data but not yet in _keys
        # key -> record | None (module docstring); O(1), lock-free: DB.get's first lookup
        self.get_record = self._data.get
        self.lock = threading.Lock()
        self.approximate_bytes = 0
        self.log_number = log_number
        self.frozen = False
        self.last_seq = 0  # the largest sequence number stored (set under self.lock)
        self._history: dict | None = None  # while snapshots are open (module docstring)
        self._snapshots = 0  # snapshots taken; those released are also in _released
        self._released: list = []  # one item per release() not yet counted (release says why)

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: bytes) -> tuple[int, int, bytes] | None:
        """``(seq, kind, value)`` of ``key``'s entry, or None. Lock-free."""
        r = self._data.get(key)
        return None if r is None else decode_record(r)

    def add(self, first_seq: int, ops) -> int:
        """Insert ``ops`` = [(kind, key, value)] with sequence numbers first_seq, first_seq+1, ...

        Returns the last sequence number used. REQUIRES: a single writer; not frozen.
        O(len(ops)) (plus the deferred sort of new keys, O(k log k) per batch of k).
        """
        data = self._data
        if len(ops) == 1:
            kind, key, value = ops[0]
            with self.lock:
                if key not in data:
                    self._pending.append(key)
                elif self._history is not None:  # a scan may still need the old record
                    self._keep(key, data[key])
                data[key] = _pack_tag(first_seq << 8 | kind) + value
                if first_seq > self.last_seq:
                    self.last_seq = first_seq
                self.approximate_bytes += len(key) + len(value) + ENTRY_OVERHEAD
            return first_seq
        size = 0
        seq = first_seq - 1
        batch = {}  # later pairs for the same key win, as in one store after another
        for kind, key, value in ops:
            seq += 1
            batch[key] = _pack_tag(seq << 8 | kind) + value
            size += len(key) + len(value)
        with self.lock:
            # _pending under the lock: _sorted_keys() replaces the list
            history = self._history
            if history is not None and self._released:
                self._count_releases()
                history = self._history
            if history is None:
                self._pending.extend([k for k in batch if k not in data])  # the new keys
            else:  # a scan may still need the records this batch replaces
                new = []
                for k in batch:
                    old = data.get(k)
                    if old is None:
                        new.append(k)
                    else:
                        history.setdefault(k, []).append(old)
                self._pending.extend(new)
            data.update(batch)  # visible to lock-free readers at once (module docstring)
            if seq > self.last_seq:
                self.last_seq = seq
            self.approximate_bytes += size + len(ops) * ENTRY_OVERHEAD
        return seq

    def snapshot(self) -> int:
        """Open a snapshot: returns S, the largest sequence number stored; until the matching
        :meth:`release`, ``iterate(..., snapshot=S)`` reads the memtable as it is now
        (module docstring, "Snapshots")."""
        with self.lock:
            if self._released:
                self._count_releases()
            if self._history is None:
                self._history = {}
            self._snapshots += 1
            return self.last_seq

    def release(self) -> None:
        """Close one snapshot; once all are closed, the next snapshot, or the next write that
        replaces a record, drops the kept records. Takes no lock: a scan's generator calls
        this when it is finalized, which the garbage collector may do in any thread,
        including one inside :meth:`add` holding ``self.lock`` (``list.append`` is atomic
        under the GIL)."""
        self._released.append(None)

    def _keep(self, key: bytes, record: bytes) -> None:
        """Keep ``record``, which a write replaces, for the open snapshots (if any are still
        open). REQUIRES: self.lock held."""
        if self._released:
            self._count_releases()
            if self._history is None:
                return
        self._history.setdefault(key, []).append(record)

    def _count_releases(self) -> None:
        """Count the releases made since the last call. REQUIRES: self.lock held."""
        n = len(self._released)
        del self._released[:n]
        self._snapshots -= n
        if not self._snapshots:
            self._history = None

    def snapshot_stats(self) -> tuple[int, int]:
        """``(open snapshots, replaced records kept for them)``, for ``DB.stats()``. Takes the
        lock; O(keys with kept records)."""
        with self.lock:
            if self._released:
                self._count_releases()
            history = self._history
            kept = sum(map(len, history.values())) if history else 0
            return self._snapshots, kept

    def record_at(self, key: bytes, snapshot: int):
        """``key``'s record as of ``snapshot`` (a value from :meth:`snapshot`, still open), or
        None if it had none here then."""
        r = self._data.get(key)
        if r is None or _tag_at(r)[0] >> 8 <= snapshot:
            return r  # records only get newer: one <= snapshot now was the newest then
        with self.lock:
            return self._as_of(key, snapshot)

    def _as_of(self, key: bytes, snapshot: int):
        """``key``'s newest kept record with a sequence number <= ``snapshot``, or None.
        REQUIRES: self.lock held, a snapshot open."""
        for r in reversed(self._history.get(key, ())):
            if _tag_at(r)[0] >> 8 <= snapshot:
                return r
        return None

    def _sorted_keys(self) -> SortedList:
        """The SortedList with every key. REQUIRES: self.lock held (or frozen)."""
        if self._pending:
            self._keys.update(self._pending)
            self._pending = []
        return self._keys

    def freeze(self) -> None:
        """Mark immutable: from now on the memtable is only read (and flushed). O(1): the
        pending keys are sorted by the first ordered read, if any (module docstring)."""
        with self.lock:
            self.frozen = True

    def items(self) -> Iterator[tuple[bytes, int, int, bytes]]:
        """All entries as (key, seq, kind, value) in key order. REQUIRES: frozen."""
        data = self._data
        with self.lock:  # a scan may be merging the pending keys at the same moment
            keys = self._sorted_keys()
        for key in keys:
            r = data[key]
            tag = _tag_at(r)[0]
            yield key, tag >> 8, tag & 0xFF, r[8:]

    def columns(self) -> "Columns":
        """All entries, unsorted, packed into a few flat buffers (:class:`Columns`) with C-level
        operations only: what a flush sends to a table worker process, where
        :func:`entries_from_columns` unpacks and sorts them. For 480k entries of 16 + 100 bytes
        this costs ~0.1 s of this process's CPU against ~1.1 s to sort the keys, build the
        entry tuples and pickle them (bench/results/db.md "Session 12"). REQUIRES: frozen.
        """
        data = self._data
        keys = list(data)
        records = list(data.values())
        return Columns(b"".join(keys), array("I", map(len, keys)).tobytes(),
                       b"".join(records), array("I", map(len, records)).tobytes())

    def iterate(self, start: bytes | None = None, end: bytes | None = None,
                chunk: int = 16, snapshot: int | None = None
                ) -> Iterator[tuple[bytes, int, int, bytes]]:
        """Entries with start <= key < end as (key, seq, kind, value), copied in chunks of
        ``chunk`` entries, each next one twice as large up to 4096 (the chunks chained: no
        Python frame per entry). A seek that reads one entry copies 16, not 128 (until
        session 15 the first chunk was 128: ~30 us of every seek that a memtable of 128+
        entries past the start slowed down).

        Safe while a writer adds entries (see the module docstring). ``snapshot``: a value
        from :meth:`snapshot`, still open; the entries as they were then.
        """
        return chain.from_iterable(self._chunks(start, end, chunk, snapshot))

    def _chunks(self, lo, end, chunk, snapshot):
        data = self._data
        lock = self.lock
        inclusive = True
        while True:
            with lock:
                keys = self._sorted_keys().irange(lo, end, inclusive=(inclusive, False))
                batch = []
                append = batch.append
                seen = 0
                for key in keys:
                    seen += 1
                    r = data[key]
                    tag = _tag_at(r)[0]
                    if snapshot is not None and tag >> 8 > snapshot:
                        r = self._as_of(key, snapshot)  # written since: as it was then
                        if r is None:
                            if seen >= chunk:
                                break
                            continue
                        tag = _tag_at(r)[0]
                    append((key, tag >> 8, tag & 0xFF, r[8:]))
                    if seen >= chunk:
                        break
            yield batch
            if seen < chunk:
                return
            lo = key
            inclusive = False
            if chunk < 4096:
                chunk *= 2


_KEY = itemgetter(0)


class Columns(NamedTuple):
    """A memtable's entries as flat buffers (see :meth:`MemTable.columns`); entry i is key
    ``keys[ko[i]:ko[i+1]]`` (``ko``: running sums of ``key_lens``) and record (tag, then
    value: the module docstring) likewise. Lengths are native u32 arrays
    (``array.tobytes``): the buffers never leave this machine."""

    keys: bytes
    key_lens: bytes
    records: bytes
    record_lens: bytes

    def __reduce_ex__(self, protocol):
        # Protocol 5 (a table worker's job, engine/table_workers.py): each buffer out of band,
        # sent from its own memory; unpickled, the fields are the bytes received.
        if protocol >= 5:
            return Columns, tuple(pickle.PickleBuffer(f) for f in self)
        return Columns, tuple(self)


class ColumnsOf:
    """A frozen memtable as a table worker job's argument: pickled (protocol 5) as its
    :class:`Columns`, built at that moment, so the buffers exist only while the job is sent,
    not while it runs (the owner keeps the memtable itself until the flush is installed)."""

    __slots__ = ("mem",)

    def __init__(self, mem: MemTable):
        self.mem = mem

    def __reduce_ex__(self, protocol):
        return self.mem.columns().__reduce_ex__(protocol)


def entries_from_columns(c: Columns) -> Iterator[tuple[bytes, int, int, bytes]]:
    """The entries of ``c`` as (key, seq, kind, value), in key order (what
    :meth:`MemTable.items` yields), as an iterator: each value is sliced from the buffer when
    its entry is reached, so a flush never holds every value as an object at once (the keys
    must all exist, for the sort). Raises ValueError, before the first entry, if the buffers
    do not agree."""
    kl = array("I")
    kl.frombytes(c.key_lens)
    rl = array("I")
    rl.frombytes(c.record_lens)
    n = len(kl)
    if not (len(rl) == n and sum(kl) == len(c.keys) and sum(rl) == len(c.records)
            and (not n or min(rl) >= _TAG.size)):
        raise ValueError("memtable columns disagree")
    kb = c.keys
    keys = []
    append = keys.append
    p = 0
    for length in kl:
        q = p + length
        append(kb[p:q])
        p = q
    # (key, record start, record length), sorted on a C key function: 0.32 s for 480k
    # entries, against 0.78 s for an argsort through a keys list's __getitem__ and 0.67 s for
    # comparing whole tuples (keys are unique)
    order = list(zip(keys, accumulate(rl, initial=0), rl))
    del keys
    order.sort(key=_KEY)
    return _in_order(order, c.records)


def _in_order(order, rb):
    for key, rs, rn in order:
        tag = _tag_at(rb, rs)[0]
        yield key, tag >> 8, tag & 0xFF, rb[rs + 8:rs + rn]
