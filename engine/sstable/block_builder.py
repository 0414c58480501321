"""Builds one block: prefix-compressed entries plus a restart array (docs/format.md, "Blocks").

Like LevelDB's ``table/block_builder.cc``: every ``restart_interval``-th key is stored whole
(a restart point) and the others store only the suffix that differs from the previous key, so a
reader binary-searches the restart points and then scans at most ``restart_interval`` entries.

REQUIRES: keys are added in strictly increasing bytewise order (the table builder checks).
The sequence of calls must be ``add* finish`` then ``reset`` before the block is reused.
Not thread safe.
"""

from __future__ import annotations

import struct

from .coding import put_varint

_U32 = struct.Struct("<I")


class BlockBuilder:
    def __init__(self, restart_interval: int):
        if restart_interval < 1:
            raise ValueError("restart_interval must be >= 1")
        self._interval = restart_interval
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
        return len(self._buf) + 4 * len(self._restarts) + 4

    def add(self, key: bytes, value) -> None:
        """Append an entry. REQUIRES: ``key`` > the previous key; :meth:`finish` not called."""
        shared = 0
        if self._counter < self._interval:
            last = self._last_key
            n = min(len(last), len(key))
            while shared < n and last[shared] == key[shared]:
                shared += 1
        else:
            self._restarts.append(len(self._buf))
            self._counter = 0
        buf = self._buf
        put_varint(buf, shared)
        put_varint(buf, len(key) - shared)
        put_varint(buf, len(value))
        buf += key[shared:]
        buf += value
        self._last_key = key
        self._counter += 1
        self.num_entries += 1

    def finish(self) -> bytes:
        """Return the block contents: entries, restart offsets (u32 each), restart count (u32)."""
        buf = self._buf
        for r in self._restarts:
            buf += _U32.pack(r)
        buf += _U32.pack(len(self._restarts))
        return bytes(buf)

    def reset(self) -> None:
        self._buf = bytearray()
        self._restarts = [0]
        self._counter = 0
        self._last_key = b""
        self.num_entries = 0
