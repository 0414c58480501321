"""Reads one block written by :class:`BlockBuilder` (docs/format.md, "Blocks").

A :class:`Block` wraps verified block contents (the trailer is already checked and stripped).
The constructor checks the restart count and the first and last restart points in O(1) (it
runs on every block read from the file); an entry or restart offset found malformed later
raises :class:`CorruptionError` naming the file and the block's offset, never IndexError.

Lookups binary-search the restart points (whose keys are stored whole) and then scan at most
one restart interval: O(log(restarts) + restart_interval) entry decodes. :meth:`get_whole` is
the fast path for blocks written with restart interval 1 (a pure binary search).

Scans do not build a Block: :func:`restart_entries` decodes a run of restart intervals of a
data block into a list of ``(key, seq, kind, value)`` in one loop (``Table.blocks``), after
:func:`block_layout` (the constructor's O(1) checks) and :func:`seek_restart`.

Immutable after construction, so one Block may be shared by many threads (the block cache does).
"""

from __future__ import annotations

import struct
import sys
from typing import Iterator

import mmh3

from .. import speedups
from ..errors import CorruptionError
from ..format import BLOCK_HASH_FLAG, BLOCK_HASH_SEED, ENTRY_TAG, KIND_DELETE, KIND_VALUE
from .coding import get_varint as _varint

_U32 = struct.Struct("<I")
_u32_at = _U32.unpack_from
_u16_at = struct.Struct("<H").unpack_from
# The slot hash: mmh3.hash(key, seed, signed=False) (what block_builder.py writes), without
# the keyword argument (~17 ns less per call here).
_uhash = mmh3.mmh3_32_uintdigest
# The last 6 bytes of a block with a hash index: u16 slot count, u32 restart count | flag
_hash_tail = struct.Struct("<HI").unpack_from
_tag_at = ENTRY_TAG.unpack_from

# The restart array is read in place as native u32s (a cast memoryview: no per-offset
# decoding at construction) where native order is the format's little-endian.
_NATIVE_U32 = sys.byteorder == "little" and struct.calcsize("I") == 4


def block_layout(data: bytes, path: str | None = None, offset: int | None = None
                 ) -> tuple[int, int]:
    """``(entries_end, restart_count)`` of the block contents ``data``: where the entries end
    (the restart array begins) and how many restart points there are, after O(1) checks (the
    restart count and the hash index's slot count fit the block; the first restart point is 0
    and the last lies inside the entries). CorruptionError naming ``path`` and ``offset``
    otherwise. What every :class:`Block` and every scan of a block (``Table.blocks``) checks
    first."""
    n = len(data)
    if n < 4:
        raise CorruptionError("block: block shorter than its restart count", path=path,
                              offset=offset)
    num = _u32_at(data, n - 4)[0]
    end = n - 4  # where the restart array ends
    if num & BLOCK_HASH_FLAG:  # a hash index sits between the restarts and the count
        num &= ~BLOCK_HASH_FLAG
        slots = _u16_at(data, n - 6)[0] if n >= 6 else 0
        end = n - 6 - slots
        if slots <= num or end < 0:
            raise CorruptionError(f"block: bad hash index ({slots} slots, {num} restarts)",
                                  path=path, offset=offset)
    if num < 1 or num > end // 4:
        raise CorruptionError(f"block: bad restart count {num}", path=path, offset=offset)
    limit = end - 4 * num
    # The others are bounds-checked when a lookup reads them (an offset past the entries
    # raises CorruptionError), not sorted again on every block read: the checksum already
    # vouches for what the writer wrote.
    if _u32_at(data, limit)[0] != 0 or (limit and _u32_at(data, end - 4)[0] >= limit):
        raise CorruptionError("block: bad restart array", path=path, offset=offset)
    return limit, num


class Block:
    __slots__ = ("data", "path", "offset", "_restarts_at", "_restarts")

    def __init__(self, data: bytes, *, path: str | None = None, offset: int | None = None):
        self.data = data
        self.path = path
        self.offset = offset
        limit, num = block_layout(data, path, offset)
        self._restarts_at = limit
        if _NATIVE_U32:
            rs = memoryview(data)[limit:limit + 4 * num].cast("I")
        else:  # pragma: no cover - big-endian hosts
            rs = struct.unpack_from(f"<{num}I", data, limit)
        self._restarts = rs

    def __len__(self) -> int:
        return len(self.data)

    @property
    def entries_end(self) -> int:
        """Offset where the entries end and the restart array begins."""
        return self._restarts_at

    def _corrupt(self, what: str) -> CorruptionError:
        return CorruptionError(f"block: {what}", path=self.path, offset=self.offset)

    # -- decoding ----------------------------------------------------------------------------
    def _entry(self, pos: int, prev_key: bytes) -> tuple[bytes, int, int]:
        """Decode the entry at ``pos``: (key, value start, value end = next entry's offset)."""
        data = self.data
        limit = self._restarts_at
        try:
            shared = data[pos]
            if shared < 0x80:
                pos += 1
            else:
                shared, pos = _varint(data, pos, limit)
            non_shared = data[pos]
            if non_shared < 0x80:
                pos += 1
            else:
                non_shared, pos = _varint(data, pos, limit)
            vlen = data[pos]
            if vlen < 0x80:
                pos += 1
            else:
                vlen, pos = _varint(data, pos, limit)
        except (IndexError, ValueError):
            raise self._corrupt("truncated entry header") from None
        kend = pos + non_shared
        vend = kend + vlen
        if shared > len(prev_key) or vend > limit:
            raise self._corrupt(f"bad entry at block offset {pos}")
        key = prev_key[:shared] + data[pos:kend] if shared else data[pos:kend]
        return key, kend, vend

    def _seek_restart(self, target: bytes) -> int:
        """Offset of the last restart point whose key is < ``target`` (the first if none)."""
        rs = self._restarts
        entry = self._entry
        lo, hi = 0, len(rs) - 1
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if entry(rs[mid], b"")[0] < target:
                lo = mid
            else:
                hi = mid - 1
        return rs[lo]

    # -- public ------------------------------------------------------------------------------
    def get(self, target: bytes):
        """Return ``(value_start, value_end)`` of ``target``'s entry, or None if absent.

        The value bytes are ``block.data[value_start:value_end]``. The scan below is
        :meth:`_entry` inlined (this is the hot path of every lookup that reads a block).
        """
        limit = self._restarts_at
        if limit == 0:
            return None
        data = self.data
        rs = self._restarts
        # _seek_restart inlined: restart keys with one-byte lengths are sliced directly.
        lo, hi = 0, len(rs) - 1
        try:
            while lo < hi:
                mid = (lo + hi + 1) >> 1
                pos = rs[mid]
                kl = data[pos + 1]
                if data[pos] or (kl | data[pos + 2]) > 0x7F or pos >= limit:
                    key = self._entry(pos, b"")[0]  # decodes in full or raises CorruptionError
                else:
                    key = data[pos + 3 : pos + 3 + kl]
                if key < target:
                    lo = mid
                else:
                    hi = mid - 1
        except IndexError:
            raise self._corrupt("restart point outside the block") from None
        pos = rs[lo]
        key = b""
        try:
            while pos < limit:
                shared = data[pos]
                non_shared = data[pos + 1]
                vlen = data[pos + 2]
                if (shared | non_shared | vlen) < 0x80:
                    pos += 3
                else:
                    shared, pos = _varint(data, pos, limit)
                    non_shared, pos = _varint(data, pos, limit)
                    vlen, pos = _varint(data, pos, limit)
                kend = pos + non_shared
                vend = kend + vlen
                if shared > len(key) or vend > limit:
                    raise ValueError
                key = key[:shared] + data[pos:kend] if shared else data[pos:kend]
                if key >= target:
                    return (kend, vend) if key == target else None
                pos = vend
        except (IndexError, ValueError):
            raise self._corrupt(f"bad entry at block offset {pos}") from None
        return None

    def get_whole(self, target: bytes):
        """:meth:`get` for a block whose every entry is a restart point (restart interval 1):
        :func:`find_whole` on this block's contents."""
        return find_whole(self.data, target, self.path, self.offset)

    def whole_entries(self) -> list[tuple[bytes, int, int]]:
        """Every ``(key, value_start, value_end)`` of a block written with restart interval 1
        (index, filter index, properties, metaindex), decoded in one tight loop.

        Raises CorruptionError if an entry shares a prefix or runs past the entries. The header
        decode is inlined as in :meth:`get` (it runs once per index entry at every open).
        """
        data = self.data
        limit = self._restarts_at
        out = []
        append = out.append
        pos = 0
        try:
            while pos < limit:
                shared = data[pos]
                klen = data[pos + 1]
                vlen = data[pos + 2]
                if (shared | klen | vlen) < 0x80:
                    pos += 3
                else:
                    shared, pos = _varint(data, pos, limit)
                    klen, pos = _varint(data, pos, limit)
                    vlen, pos = _varint(data, pos, limit)
                kend = pos + klen
                vend = kend + vlen
                if shared or vend > limit:
                    raise ValueError
                append((data[pos:kend], kend, vend))
                pos = vend
        except (IndexError, ValueError):
            raise self._corrupt(f"bad entry at block offset {pos}") from None
        return out

    def entries(self, start: bytes | None = None) -> Iterator[tuple[bytes, int, int]]:
        """Yield ``(key, value_start, value_end)`` for every entry with key >= ``start``."""
        limit = self._restarts_at
        if limit == 0:
            return
        if start is None:
            pos = 0
        else:
            pos = self._seek_restart(start)
        key = b""
        entry = self._entry
        while pos < limit:
            key, vstart, pos = entry(pos, key)
            if start is None or key >= start:
                yield key, vstart, pos


def find_whole(data: bytes, target: bytes, path: str | None = None, offset: int | None = None):
    """``Block(data).get(target)`` for block contents whose every entry is a restart point
    (restart interval 1), without building a :class:`Block`: the point-read fast path.

    A block with a hash index (docs/format.md, "Data block hash index") is answered by it:
    one mmh3 hash, then the entries its probe sequence names until the key or an empty slot
    (about 1.5 entries read for a present key at the writer's load of 1/2). Any inconsistency
    in the index (a slot past the entries, an entry that shares a prefix or runs past them,
    no empty slot on the probe path after ``B`` slots) is a CorruptionError. Other blocks:

    A pure binary search over the restart array: per step one restart offset, three header
    bytes and one key slice, no entry decoding loop. The restart count is checked on every
    call (O(1)), offsets when read. Headers with multi-byte varints (keys or values of 128
    bytes or more), restart entries that share a prefix, an empty block or a first restart
    point other than 0 send the lookup to ``Block(data).get``, which reads (or rejects) any
    block; an "absent" answer is given only once the entry before the gap is seen to end where
    the next restart point starts, so a block that is not really interval 1 still reads
    right. Damage raises CorruptionError naming ``path`` and ``offset``, never IndexError.
    """
    n = len(data) - 4
    num = _u32_at(data, n)[0] if n >= 0 else 0
    if num > BLOCK_HASH_FLAG:  # flagged, >= 1 entry: the hash index answers
        return find_hashed(data, 0, n + 4, target, path, offset)
    limit = n - 4 * num
    if num < 1 or limit <= 0:
        return Block(data, path=path, offset=offset).get(target)  # empty, or raises
    lo = 0
    hi = num
    found = None
    try:
        while lo < hi:
            mid = (lo + hi) >> 1
            p = _u32_at(data, limit + 4 * mid)[0]
            kl = data[p + 1]
            if data[p] or (kl | data[p + 2]) > 0x7F or p >= limit:
                return Block(data, path=path, offset=offset).get(target)
            p += 3
            key = data[p : p + kl]
            if key < target:
                lo = mid + 1
            else:
                hi = mid
                found = key
    except IndexError:
        raise CorruptionError("block: restart point outside the block", path=path,
                              offset=offset) from None
    if found != target:
        # Absent, if no entry hides in the gap: nothing before the first restart point, and
        # the entry before the gap (examined above when hi > 0) ends where the next starts.
        if hi:
            p = _u32_at(data, limit + 4 * (hi - 1))[0]
            if p + 3 + data[p + 1] + data[p + 2] != (
                    _u32_at(data, limit + 4 * hi)[0] if hi < num else limit):
                return Block(data, path=path, offset=offset).get(target)
        elif _u32_at(data, limit)[0]:
            return Block(data, path=path, offset=offset).get(target)  # raises: bad restarts
        return None
    # Restart point hi was examined above: shared 0, one-byte key and value lengths, inside
    # the entries.
    p = _u32_at(data, limit + 4 * hi)[0]
    kend = p + 3 + data[p + 1]
    vend = kend + data[p + 2]
    if vend > limit:
        raise CorruptionError(f"block: bad entry at block offset {p}", path=path, offset=offset)
    return kend, vend


def find_hashed(buf, start: int, end: int, target: bytes, path: str | None = None,
                offset: int | None = None):
    """The hash-index lookup of :func:`find_whole` for the block contents ``buf[start:end]``,
    read in place: ``buf`` may be the block's bytes (``start`` 0) or a table's whole mapping,
    so a mapped get reads the few bytes it needs instead of copying the block. REQUIRES: the
    block's trailer flags a hash index (``find_whole`` checks; a mapped get checked it when
    the block's checksum was verified).

    Returns ``(value_start, value_end)`` as indexes into ``buf``, or None. Every index read is
    checked against the block's own bounds (a slice of a mapping does not stop at the block's
    end as bytes would), and any inconsistency is a CorruptionError naming ``path`` and
    ``offset``; a ValueError from a closed mapping surfaces as that CorruptionError too, so a
    caller reading a mapping that may be closed checks for that first.
    """
    try:
        nb, num = _hash_tail(buf, end - 6)  # slot count, restart count | BLOCK_HASH_FLAG
        num -= BLOCK_HASH_FLAG
        hs = end - 6 - nb  # the slots
        limit = hs - 4 * num
        if num < 1 or nb <= num or limit <= start:
            raise ValueError
        s = first = _uhash(target, BLOCK_HASH_SEED) % nb
        r = buf[hs + s]
        while r:  # a writer leaves a slot empty; damage may not (then: error, below)
            if r > num:
                raise ValueError
            p = start + _u32_at(buf, limit + 4 * r - 4)[0]
            if p >= limit:
                raise ValueError
            kl = buf[p + 1]
            vl = buf[p + 2]
            if (buf[p] | kl | vl) < 0x80:
                if buf[p]:  # shared != 0: an indexed entry is a restart point
                    raise ValueError
                p += 3
            else:
                shared, p = _varint(buf, p, limit)
                kl, p = _varint(buf, p, limit)
                vl, p = _varint(buf, p, limit)
                if shared:
                    raise ValueError
            kend = p + kl
            if buf[p:kend] == target:
                if kend + vl > limit:
                    raise ValueError
                return kend, kend + vl
            s += 1
            if s == nb:
                s = 0
            if s == first:
                raise ValueError  # every slot full: not what a writer makes
            r = buf[hs + s]
        return None
    except (IndexError, ValueError, struct.error):
        raise CorruptionError("block: bad hash index or entry", path=path,
                              offset=offset) from None


def seek_restart(data: bytes, limit: int, num: int, start: bytes | None,
                 path: str | None = None, offset: int | None = None) -> int:
    """Index of the last restart point whose key is < ``start`` (0 if none, or if ``start`` is
    None): where decoding starts to reach the first key >= ``start``. ``limit`` and ``num``
    are :func:`block_layout`'s. O(log(num)); CorruptionError on a malformed restart point."""
    if start is None or num == 1:
        return 0
    return _seek(data, limit, num, start, path, offset)


def restart_entries(data: bytes, limit: int, num: int, first: int, stop: int,
                    start: bytes | None = None, path: str | None = None,
                    offset: int | None = None) -> list[tuple[bytes, int, int, bytes]]:
    """The entries of restart intervals ``first`` to ``stop - 1`` (``stop`` past ``num``: to
    the end of the entries) of the data block contents ``data`` (verified, decompressed), as
    ``(key, seq, kind, value)`` in key order, without those whose key is < ``start``: the
    scan path (``Table.blocks``), one loop per call instead of a generator step, a ``Block``
    and a decode call per entry. ``limit`` and ``num`` are :func:`block_layout`'s.

    Every entry decoded is checked: a malformed one (a header, key or value past the
    entries, a shared prefix longer than the key before, a value shorter than its 8-byte
    tag, a kind other than value or tombstone: docs/format.md "Data blocks"), or a last entry
    that does not end where restart point ``stop`` begins, raises CorruptionError naming
    ``path`` and ``offset`` before any entry of the call is returned. O(entries decoded).
    """
    try:
        pos = _u32_at(data, limit + 4 * first)[0]
        end = _u32_at(data, limit + 4 * stop)[0] if stop < num else limit
    except struct.error:
        pos = end = -1
    if not 0 <= pos <= end <= limit:
        raise CorruptionError("block: restart point outside the entries", path=path,
                              offset=offset)
    out = []
    if _decode(data, pos, end, limit, out, path, offset) != end:
        raise CorruptionError(f"block: restart point {end} inside an entry", path=path,
                              offset=offset)
    if start is not None and out and out[0][0] < start:
        # at most one restart interval's entries: decoding began at the last restart point
        # before start
        i = 1
        n = len(out)
        while i < n and out[i][0] < start:
            i += 1
        del out[:i]
    return out


def _seek(data, limit: int, num: int, start: bytes, path, offset) -> int:
    """Index of the last restart point whose key is < ``start`` (0 if none)."""
    lo, hi = 0, num - 1
    try:
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            p = _u32_at(data, limit + 4 * mid)[0]
            if p >= limit:
                raise ValueError
            kl = data[p + 1]
            if data[p] or (kl | data[p + 2]) > 0x7F:
                shared, q = _varint(data, p, limit)
                kl, q = _varint(data, q, limit)
                q = _varint(data, q, limit)[1]
                if shared or q + kl > limit:  # a restart point's key is whole
                    raise ValueError
                key = data[q : q + kl]
            else:
                key = data[p + 3 : p + 3 + kl]
            if key < start:
                lo = mid
            else:
                hi = mid - 1
    except (IndexError, ValueError):
        raise CorruptionError("block: bad restart point", path=path, offset=offset) from None
    return lo


def _decode(data, pos: int, stop: int, limit: int, out: list, path, offset) -> int:
    """Append to ``out`` the entries ``(key, seq, kind, value)`` from the restart point at
    ``pos`` until ``stop`` (a later restart point, or ``limit``, where the entries end);
    return where the last one ends. Raises CorruptionError on a malformed entry."""
    append = out.append
    key = b""
    try:
        while pos < stop:
            shared = data[pos]
            kl = data[pos + 1]
            vl = data[pos + 2]
            if (shared | kl | vl) < 0x80:
                pos += 3
            else:
                shared, pos = _varint(data, pos, limit)
                kl, pos = _varint(data, pos, limit)
                vl, pos = _varint(data, pos, limit)
            kend = pos + kl
            vend = kend + vl
            if vend > limit or shared > len(key):
                raise ValueError
            if vl < 8:
                raise CorruptionError("entry shorter than its tag", path=path, offset=offset)
            key = key[:shared] + data[pos:kend] if shared else data[pos:kend]
            tag = _tag_at(data, kend)[0]
            kind = tag & 0xFF
            if kind != KIND_VALUE and kind != KIND_DELETE:
                raise CorruptionError(f"bad entry kind {kind}", path=path, offset=offset)
            append((key, tag >> 8, kind, data[kend + 8 : vend]))
            pos = vend
    except (IndexError, ValueError, struct.error):
        raise CorruptionError(f"block: bad entry at block offset {pos}", path=path,
                              offset=offset) from None
    return pos


find_hashed_py = find_hashed
"""The Python ``find_hashed``: the reference the compiled version is checked against."""
if speedups.native is not None:  # engine/speedups.py: same answers and errors, in C
    speedups.native.register(find_hashed=find_hashed_py)
    find_hashed = speedups.native.find_hashed  # noqa: F811
