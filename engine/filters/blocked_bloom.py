"""The cache-line-blocked Bloom filter, "sievekv.BlockedBloomFilter.v1" (short name
"blocked-bloom", the default), after RocksDB's FastLocalBloom: one hash picks a 64-byte line
and all k probes of a key land inside that line, so a probe reads one line.

Layout (docs/format.md, "Filter encodings", "Blocked Bloom"): L >= 1 lines of 64 bytes; the
4-byte trailer is the last 4 bytes of the last line, so a filter is exactly ``64 * L`` bytes
(``build(keys, size_bytes=4096)`` fills one page, metadata included).

Probe positions of a key, from D_s = MurmurHash3_x64_128(key, seed=s) read as little-endian
words: ``line = (u32(D_0[0:4]) * L) >> 32`` (RocksDB's FastRange32). The key's candidate
words are the six u16 of D_0[4:16], then the eight u16 of D_1, D_2, ...; each maps to a bit
of the line, ``w & 511`` (``w % 480`` in the last line, so the trailer's 32 bits are never
touched); the key's k probes are the first k *distinct* candidates (bit p is bit ``p & 7`` of
byte ``p >> 3`` of the line). Distinct positions measure ~1.2% lower FPR than k independent
ones (bench/filters_fpr.py --schemes) and cost a probe nothing on the way to "absent".

k follows RocksDB's FastLocalBloomImpl::ChooseNumProbes (6 at 10 bits/key). Expected FPR:
:func:`fpr.blocked_fpr` with 512-bit lines.
"""

from __future__ import annotations

import struct
from functools import cache
from typing import Any, Callable

import numpy as np

from .. import speedups
from . import layout
from .base import FilterPolicy, bits_for, check_count
from .fpr import blocked_fpr
from .hashing import digest, digest_words, key_chunks, uint_digest

_FIRST_WORDS = struct.Struct("<I6H").unpack  # line selector + WORDS_FIRST_DIGEST probe words
_MORE_WORDS = struct.Struct("<8H").unpack  # WORDS_PER_DIGEST probe words
_LINE_MASK = layout.LINE_BITS - 1

# RocksDB's FastLocalBloomImpl::ChooseNumProbes: (largest millibits/key, k) pairs.
_PROBES_BY_MILLIBITS = (
    (2080, 1), (3580, 2), (5100, 3), (6640, 4), (8300, 5), (10070, 6),
    (11720, 7), (14001, 8), (16050, 9), (18300, 10), (22001, 11), (25501, 12),
)  # fmt: skip


def digests_needed(num_probes: int) -> int:
    """How many digests (seeds 0, 1, ...) supply the probe words for ``num_probes``."""
    extra = max(0, num_probes - layout.WORDS_FIRST_DIGEST)
    return 1 + -(-extra // layout.WORDS_PER_DIGEST)


def probe_positions(key: bytes, num_lines: int, num_probes: int) -> tuple[int, list[int]]:
    """``(line, bit positions in that line)`` that ``key`` sets: the spec, in code.

    Builds and probes must agree with this function bit for bit (tests check it).
    """
    x, *words = _FIRST_WORDS(digest(key))
    line = x * num_lines >> 32  # "fastrange": x / 2^32 scaled to [0, num_lines)
    last = line == num_lines - 1
    chosen: list[int] = []
    seed = 0
    while True:
        for w in words:
            p = w % layout.LAST_LINE_BITS if last else w & _LINE_MASK
            if p not in chosen:
                chosen.append(p)
                if len(chosen) == num_probes:
                    return line, chosen
        seed += 1
        words = _MORE_WORDS(digest(key, seed))


def probe_reference(filter_data, key: bytes) -> bool:
    """``may_match`` for any well-formed blocked filter, whatever its k; True for a malformed
    one. Slower than the specialised probes; used when the trailer's k differs from the
    policy's and as the reference in tests."""
    try:
        n = len(filter_data)
        if n < layout.LINE_BYTES or n % layout.LINE_BYTES:
            return True
        k, length_check, marker = layout.TRAILER.unpack_from(filter_data, n - layout.TRAILER_SIZE)
        if marker != layout.MARKER_BLOCKED or length_check != (n >> layout.LINE_SHIFT) % layout.LENGTH_CHECK_MOD:
            return True
        if not 1 <= k <= layout.BLOCKED_MAX_PROBES:
            return True
        line, positions = probe_positions(key, n >> layout.LINE_SHIFT, k)
        base = line << layout.LINE_SHIFT
        for p in positions:
            if not filter_data[base + (p >> 3)] >> (p & 7) & 1:
                return False
        return True
    except Exception:  # any malformed buffer: "may match", never a false "absent"
        return True


if speedups.native is not None:  # it answers what it cannot read fast as the reference does
    speedups.native.register(probe_reference=probe_reference)

_CHAIN_MAX_PROBES = 6  # up to this k the distinct test compares pairs (see _probe_source)
_BYTE = tuple(p >> 3 for p in range(layout.LINE_BITS))  # bit position in a line -> byte
_MASK = tuple(1 << (p & 7) for p in range(layout.LINE_BITS))  # bit position -> bit mask


def _probe_source(k: int) -> str:
    """Source of ``may_match`` unrolled for k probes.

    Measured choices (``bench/filters_throughput.py --variants`` times the alternatives):
    the digest is read as one 128-bit int and each 9-bit position is cut out of it with a
    shift and a mask, which beats unpacking all six words with ``struct`` for absent keys
    (they stop after ~2 probes; present keys, which need all six, gain ~8% from struct), and
    beats 64K-entry lookup tables (cache misses) and testing a 512-bit int made from the line
    (slicing + ``int.from_bytes`` cost more than the probes); byte offset and mask come from
    512-entry tables, a little faster than computing them.

    A True answer is always safe, so the full trailer check runs only on the way to a False
    answer; a key whose k bits are all set only confirms the trailer's k (a filter written
    with more probes must be asked all of them). If the trailer is not exactly ours with this
    k, the reference decoder answers (any k; True for bad data).

    The code tests the key's first k candidates c_0..c_{k-1} in order, not its first k
    distinct ones. A miss is still exact: a failing c_i differs from every earlier candidate
    (a repeat tests a bit already found set), so at most i+1 <= k distinct values precede or
    are c_i, and c_i is one of the key's probes. Only an all-set answer must know the k were
    distinct; if they were not, the reference decoder (which draws further candidates)
    answers. That test is k(k-1)/2 comparisons up to ``_CHAIN_MAX_PROBES``, a set above: a
    set of 5 or more values outgrows its first table and allocates a second, and at k=6 (10
    bits per key) the set cost ~0.39 us per all-set probe against ~0.19 us for the 15
    comparisons (bench/results/db.md "Session 19")."""
    miss = (
        f"if n & {layout.LINE_BYTES - 1} or data[{layout.TRAILER_MARKER - layout.TRAILER_SIZE}] != "
        f"{layout.MARKER_BLOCKED} or data[{layout.TRAILER_PROBES - layout.TRAILER_SIZE}] != {k}: "
        "return REFERENCE(data, key)\n"
    )
    branches = {}
    for last_line in (False, True):
        ind = " " * 12
        out = []
        for i in range(k):
            extra = i - layout.WORDS_FIRST_DIGEST
            if extra < 0:
                var, shift = "h", 32 + 16 * i
            else:
                seed, j = 1 + extra // layout.WORDS_PER_DIGEST, extra % layout.WORDS_PER_DIGEST
                var, shift = f"g{seed}", 16 * j
                if j == 0:
                    out.append(f"{ind}{var} = DIGEST(key, {seed})\n")
            if last_line:
                out.append(f"{ind}p{i} = ({var} >> {shift} & 0xFFFF) % {layout.LAST_LINE_BITS}\n")
            else:
                out.append(f"{ind}p{i} = {var} >> {shift} & {_LINE_MASK}\n")
            out.append(f"{ind}if not data[off + BYTE[p{i}]] & MASK[p{i}]:\n{ind}    {miss}{ind}    return False\n")
        branches[last_line] = "".join(out)
    names = [f"p{i}" for i in range(k)]
    if k <= _CHAIN_MAX_PROBES:
        pairs = [f"{names[i]} != {names[j]}" for i in range(k) for j in range(i + 1, k)]
        distinct = "".join(f" and {c}" for c in pairs)
    else:
        distinct = f" and len({{{', '.join(names)}}}) == {k}"
    return (
        "def may_match(data, key):\n"
        "    h = DIGEST(key)\n"
        "    try:\n"
        "        n = len(data)\n"
        f"        off = (h & 0xFFFFFFFF) * n >> 32 & {-layout.LINE_BYTES}\n"
        f"        if off != n - {layout.LINE_BYTES}:\n"
        + branches[False]
        + "        else:\n"
        + branches[True]
        + f"        return data[{layout.TRAILER_PROBES - layout.TRAILER_SIZE}] == {k}{distinct} or REFERENCE(data, key)\n"
        "    except Exception:\n"
        "        return True\n"
    )


@cache
def _specialised_probe(k: int) -> Callable[[Any, bytes], bool]:
    """Compile ``may_match`` for k probes (see ``_probe_source``); one per k per process."""
    namespace = {"BYTE": _BYTE, "MASK": _MASK, "DIGEST": uint_digest, "REFERENCE": probe_reference}
    exec(compile(_probe_source(k), f"<blocked bloom probe k={k}>", "exec"), namespace)
    probe = namespace["may_match"]
    probe.__doc__ = f"Blocked Bloom may_match specialised for k={k}; see FilterPolicy.may_match."
    return probe


class BlockedBloomFilterPolicy(FilterPolicy):
    """Cache-line-blocked Bloom filter policy. See the module docstring for the layout."""

    short_name = "blocked-bloom"
    name = layout.BLOCKED_NAME
    max_probes = layout.BLOCKED_MAX_PROBES
    min_size = layout.LINE_BYTES

    @staticmethod
    def choose_num_probes(bits_per_key: float) -> int:
        """RocksDB's choice for a 512-bit line: 6 at 10 bits/key, 8 at 12, 9 at 16, ... 24."""
        millibits = int(bits_per_key * 1000.0 + 0.500001)
        for limit, k in _PROBES_BY_MILLIBITS:
            if millibits <= limit:
                return k
        if millibits > 50000:
            return 24
        return (millibits - 1) // 2000 - 1

    fpr_model = staticmethod(blocked_fpr)

    def estimate_size(self, num_keys: int) -> int:
        check_count(num_keys, "num_keys", 0)
        nbytes = -(-bits_for(num_keys, self.bits_per_key) // 8) + layout.TRAILER_SIZE
        return max(1, -(-nbytes // layout.LINE_BYTES)) * layout.LINE_BYTES

    def fit_size(self, size_bytes: int) -> int:
        check_count(size_bytes, "size_bytes", 0)
        return max(self.min_size, size_bytes // layout.LINE_BYTES * layout.LINE_BYTES)

    def _make_probe(self, num_probes: int) -> Callable[[Any, bytes], bool]:
        if speedups.native is not None:  # engine/speedups.py: probe_reference, in C
            return speedups.native.blocked_may_match
        return _specialised_probe(num_probes)

    def _build_bytes(self, keys: list, size: int) -> bytes:
        num_lines = size >> layout.LINE_SHIFT
        k = self.num_probes
        bits = np.zeros(num_lines * layout.LINE_BITS, dtype=np.bool_)
        lines64 = np.uint64(num_lines)
        for chunk in key_chunks(keys):
            first = digest_words(chunk)
            selector = np.ascontiguousarray(first[:, :2]).view("<u4")[:, 0]
            line = ((selector.astype(np.uint64) * lines64) >> np.uint64(32)).astype(np.intp)
            in_last = line == num_lines - 1
            words = [first[:, 2:]] + [digest_words(chunk, seed) for seed in range(1, digests_needed(k))]
            cand = _candidates(np.concatenate(words, axis=1), in_last)
            probes = cand[:, :k]
            repeats = _repeating_rows(probes)  # they take further candidates (~3% at k=6)
            if repeats.size:
                probes[repeats] = _first_distinct(chunk, repeats, cand, in_last, k)
            bits[((line << np.intp(9))[:, None] + probes).ravel()] = True  # line * LINE_BITS
        out = np.packbits(bits, bitorder="little")
        out[-layout.TRAILER_SIZE :] = np.frombuffer(
            layout.TRAILER.pack(k, num_lines % layout.LENGTH_CHECK_MOD, layout.MARKER_BLOCKED), dtype=np.uint8
        )
        return out.tobytes()


def _candidates(words: np.ndarray, in_last: np.ndarray) -> np.ndarray:
    """Candidate words -> bit positions in the line: ``w & 511``, ``w % 480`` in the last line."""
    cand = (words & np.uint16(_LINE_MASK)).astype(np.intp)
    last = np.flatnonzero(in_last)
    if last.size:
        cand[last] = words[last] % np.uint16(layout.LAST_LINE_BITS)
    return cand


def _repeating_rows(probes: np.ndarray) -> np.ndarray:
    """Indices of the rows of ``probes`` that hold some value twice."""
    k = probes.shape[1]
    if k <= 10:  # pairwise column compares beat a row sort for small k
        repeat = np.zeros(len(probes), dtype=np.bool_)
        for i in range(1, k):
            for j in range(i):
                repeat |= probes[:, i] == probes[:, j]
        return np.flatnonzero(repeat)
    ordered = np.sort(probes.astype(np.int16), axis=1)
    return np.flatnonzero((ordered[:, 1:] == ordered[:, :-1]).any(axis=1))


def _first_distinct(keys: list, rows: np.ndarray, cand: np.ndarray, in_last: np.ndarray, k: int) -> np.ndarray:
    """The first k distinct candidates of ``keys[rows]``, as a ``(len(rows), k)`` array:
    ``cand[rows]`` first, then the words of further digests while some row has fewer than k
    distinct values. Vectorised: a stable sort per row finds each value's first occurrence."""
    stream = cand[rows].astype(np.int16)  # positions < 512: small sorts are faster
    sub_keys = [keys[i] for i in rows]
    last = in_last[rows]
    seed = digests_needed(k)
    while True:
        order = np.argsort(stream, axis=1, kind="stable")
        ordered = np.take_along_axis(stream, order, axis=1)
        first = np.ones(ordered.shape, dtype=np.bool_)
        first[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
        keep = np.empty_like(first)
        np.put_along_axis(keep, order, first, axis=1)
        if (keep.sum(axis=1) >= k).all():
            break
        more = _candidates(digest_words(sub_keys, seed), last).astype(np.int16)
        stream = np.concatenate([stream, more], axis=1)
        seed += 1
    take = keep & (np.cumsum(keep, axis=1) <= k)
    return stream[take].reshape(len(rows), k)  # row-major: each row's picks in stream order
