"""The classic Bloom filter, "sievekv.BloomFilter.v1" (short name "bloom").

Layout (docs/format.md, "Filter encodings", "Classic Bloom"): ``nbytes`` bytes of bit array
(m = 8 * nbytes bits; bit j is bit ``j & 7`` of byte ``j >> 3``) followed by the 4-byte
trailer (k, ``nbytes mod 2^16``, marker 0xB1). A key sets bits ``(h1 + i * h2) mod m`` for i in 0..k-1, where (h1, h2) are the two
64-bit halves of its MurmurHash3 x64 128 digest (Kirsch-Mitzenmacher double hashing, as
Cassandra does) and the sum is taken over the integers, not modulo 2^64.

k = round(bits_per_key * ln 2) clamped to [1, 30]. Expected FPR: :func:`fpr.classic_fpr`.

Probes touch k scattered bytes (no cache locality); the blocked encoding is the default.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any, Callable

import numpy as np

from . import layout
from .base import FilterPolicy, bits_for, check_count
from .fpr import classic_fpr
from .hashing import digest_halves, key_chunks, uint_digest

_M64 = (1 << 64) - 1
_BIT = tuple(1 << i for i in range(8))


def probe_positions(key: bytes, num_bits: int, num_probes: int) -> list[int]:
    """The bit indices ``key`` sets in a filter of ``num_bits`` bits: the spec, in code.

    Builds and probes must agree with this function bit for bit (tests check it).
    """
    h = uint_digest(key)
    a, b = (h & _M64) % num_bits, (h >> 64) % num_bits
    return [(a + i * b) % num_bits for i in range(num_probes)]


def probe_reference(filter_data, key: bytes) -> bool:
    """``may_match`` for any well-formed classic filter, whatever its k; True for a malformed
    one. Slower than the specialised probes; used when the trailer's k differs from the
    policy's and as the reference in tests."""
    try:
        n = len(filter_data) - layout.TRAILER_SIZE
        if n < layout.BLOOM_MIN_BIT_BYTES:
            return True
        k, length_check, marker = layout.TRAILER.unpack_from(filter_data, n)
        if marker != layout.MARKER_BLOOM or length_check != n % layout.LENGTH_CHECK_MOD:
            return True
        if not 1 <= k <= layout.BLOOM_MAX_PROBES:
            return True
        for j in probe_positions(key, n << 3, k):
            if not filter_data[j >> 3] >> (j & 7) & 1:
                return False
        return True
    except Exception:  # any malformed buffer: "may match", never a false "absent"
        return True


@cache
def _specialised_probe(k: int) -> Callable[[Any, bytes], bool]:
    """Generate ``may_match`` unrolled for k probes (no loop, constants inlined)."""
    steps = []
    for i in range(k):
        steps.append("        if not data[a >> 3] & BIT[a & 7]:\n            return False\n")
        if i < k - 1:
            steps.append("        a = (a + b) % m\n")
    src = (
        "def may_match(data, key):\n"
        "    h = DIGEST(key)\n"
        "    try:\n"
        f"        n = len(data) - {layout.TRAILER_SIZE}\n"
        f"        if n < {layout.BLOOM_MIN_BIT_BYTES} or data[n + {layout.TRAILER_MARKER}] != {layout.MARKER_BLOOM}"
        f" or data[n + {layout.TRAILER_PROBES}] != {k}:\n"
        "            return REFERENCE(data, key)\n"
        "        m = n << 3\n"
        f"        a = (h & {_M64:#x}) % m\n"
        "        b = (h >> 64) % m\n"
        + "".join(steps)
        + "        return True\n"
        "    except Exception:\n"
        "        return True\n"
    )
    namespace = {"DIGEST": uint_digest, "BIT": _BIT, "REFERENCE": probe_reference}
    exec(compile(src, f"<bloom probe k={k}>", "exec"), namespace)
    probe = namespace["may_match"]
    probe.__doc__ = f"Classic Bloom may_match specialised for k={k}; see FilterPolicy.may_match."
    return probe


class BloomFilterPolicy(FilterPolicy):
    """Classic Bloom filter policy. See the module docstring for the layout."""

    short_name = "bloom"
    name = layout.BLOOM_NAME
    max_probes = layout.BLOOM_MAX_PROBES
    min_size = layout.BLOOM_MIN_BIT_BYTES + layout.TRAILER_SIZE

    @staticmethod
    def choose_num_probes(bits_per_key: float) -> int:
        """round(bits_per_key * ln 2) (halves round up), clamped to [1, 30]."""
        return min(layout.BLOOM_MAX_PROBES, max(1, int(bits_per_key * math.log(2) + 0.5)))

    fpr_model = staticmethod(classic_fpr)

    def estimate_size(self, num_keys: int) -> int:
        check_count(num_keys, "num_keys", 0)
        nbytes = max(layout.BLOOM_MIN_BIT_BYTES, -(-bits_for(num_keys, self.bits_per_key) // 8))
        return nbytes + layout.TRAILER_SIZE

    def fit_size(self, size_bytes: int) -> int:
        check_count(size_bytes, "size_bytes", 0)
        return max(self.min_size, size_bytes)

    def _make_probe(self, num_probes: int) -> Callable[[Any, bytes], bool]:
        return _specialised_probe(num_probes)

    def _build_bytes(self, keys: list, size: int) -> bytes:
        nbytes = size - layout.TRAILER_SIZE
        m = nbytes * 8
        trailer = layout.TRAILER.pack(self.num_probes, nbytes % layout.LENGTH_CHECK_MOD, layout.MARKER_BLOOM)
        if not keys:
            return bytes(nbytes) + trailer
        m64 = np.uint64(m)
        bits = np.zeros(m, dtype=np.bool_)
        for chunk in key_chunks(keys):
            halves = digest_halves(chunk)
            pos = halves[:, 0] % m64  # a = h1 mod m
            step = halves[:, 1] % m64  # b = h2 mod m; a + b < 2m < 2^64: no wrap-around
            for i in range(self.num_probes):
                bits[pos] = True
                if i < self.num_probes - 1:
                    pos += step
                    pos %= m64
        return np.packbits(bits, bitorder="little").tobytes() + trailer
