"""Builds one block: prefix-compressed entries plus a restart array (docs/format.md, "Blocks").

Like LevelDB's ``table/block_builder.cc``: every ``restart_interval``-th key is stored whole
(a restart point) and the others store only the suffix that differs from the previous key, so a
reader binary-searches the restart points and then scans at most ``restart_interval`` entries.

With ``hash_index=True`` and restart interval 1, :meth:`finish` also appends a hash index
(RocksDB's data block hash index, with linear probing): a point lookup hashes the key to a slot
and reads the entry it names instead of binary-searching (docs/format.md, "Data block hash
index"). A block of more than ``BLOCK_HASH_MAX_ENTRIES`` entries is written without one.

REQUIRES: keys are added in strictly increasing bytewise order (the table builder checks).
The sequence of calls must be ``add* finish`` then ``reset`` before the block is reused.
Not thread safe.
"""

from __future__ import annotations

import struct

import mmh3

from ..format import (BLOCK_HASH_FLAG, BLOCK_HASH_MAX_ENTRIES, BLOCK_HASH_SEED,
                      BLOCK_HASH_SLOTS_PER_ENTRY)
from .coding import put_varint

_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")


def hash_slots(keys: list, num_slots: int) -> bytearray:
    """The slot array of a hash index over ``keys`` (entry ``i`` stored as ``i + 1``; 0 =
    empty): each key goes to the first free slot from ``mmh3(key) % num_slots`` on, wrapping.
    REQUIRES: ``len(keys) < num_slots`` and ``len(keys) <= BLOCK_HASH_MAX_ENTRIES``."""
    slots = bytearray(num_slots)
    for i, key in enumerate(keys, 1):
        s = mmh3.hash(key, BLOCK_HASH_SEED, signed=False) % num_slots
        while slots[s]:
            s = s + 1 if s + 1 < num_slots else 0
        slots[s] = i
    return slots


class BlockBuilder:
    def __init__(self, restart_interval: int, hash_index: bool = False):
        if restart_interval < 1:
            raise ValueError("restart_interval must be >= 1")
        self._interval = restart_interval
        self._hash = hash_index and restart_interval == 1
        self._keys: list[bytes] = []  # the block's keys, kept for the hash index
        self._buf = bytearray()
        self._restarts = [0]
        self._counter = 0  # entries since the last restart point
        self._last_key = b""
        self.num_entries = 0

    @property
    def empty(self) -> bool:
        return self.num_entries == 0

    def current_size_estimate(self) -> int:
        """Bytes :meth:`finish` would return now (exact, without the trailer)."""
        n = len(self._buf) + 4 * len(self._restarts) + 4
        if self._hash and 0 < self.num_entries <= BLOCK_HASH_MAX_ENTRIES:
            n += BLOCK_HASH_SLOTS_PER_ENTRY * self.num_entries + 2
        return n

    def add(self, key: bytes, value) -> int:
        """Append an entry; return :meth:`current_size_estimate` after it (the table builder
        checks it after every entry: one call instead of two). REQUIRES: ``key`` > the previous
        key; :meth:`finish` not called."""
        buf = self._buf
        nk = len(key)
        nv = len(value)
        shared = 0
        if self._interval == 1:
            # Every entry is a restart point (shared 0): the format's default, the fast path.
            if self.num_entries:
                self._restarts.append(len(buf))
            if nk < 0x80 and nv < 0x80:  # one-byte varints, the usual case
                buf.append(0)
                buf.append(nk)
                buf.append(nv)
            else:
                buf.append(0)
                put_varint(buf, nk)
                put_varint(buf, nv)
        else:
            if self._counter < self._interval:
                last = self._last_key
                n = min(nk, len(last))
                while shared < n and last[shared] == key[shared]:
                    shared += 1
            else:
                self._restarts.append(len(buf))
                self._counter = 0
            put_varint(buf, shared)
            put_varint(buf, nk - shared)
            put_varint(buf, nv)
            self._counter += 1
        buf += key[shared:] if shared else key
        buf += value
        self._last_key = key
        self.num_entries = n = self.num_entries + 1
        size = len(buf) + 4 * len(self._restarts) + 4
        if self._hash:
            self._keys.append(key)
            if n <= BLOCK_HASH_MAX_ENTRIES:
                size += BLOCK_HASH_SLOTS_PER_ENTRY * n + 2
        return size

    def finish(self) -> bytes:
        """Return the block contents: entries, restart offsets (u32 each), then the restart
        count (u32); with a hash index, its slots and slot count (u16) before the count, whose
        bit 31 is then set."""
        buf = self._buf
        for r in self._restarts:
            buf += _U32.pack(r)
        count = len(self._restarts)
        if self._hash and 0 < self.num_entries <= BLOCK_HASH_MAX_ENTRIES:
            num_slots = BLOCK_HASH_SLOTS_PER_ENTRY * self.num_entries
            buf += hash_slots(self._keys, num_slots)
            buf += _U16.pack(num_slots)
            count |= BLOCK_HASH_FLAG
        buf += _U32.pack(count)
        return bytes(buf)

    def reset(self) -> None:
        self._buf = bytearray()
        self._restarts = [0]
        self._counter = 0
        self._last_key = b""
        self.num_entries = 0
        self._keys = []
