"""Key hashing shared by the filter encodings: MurmurHash3 x64 128 (mmh3), one key at a time
for probes and a whole batch at once (numpy views) for builds.

``digest(key, seed)`` is the 16-byte hash; as an integer (little-endian) its low 64 bits are
``h1`` and its high 64 bits ``h2`` of MurmurHash3_x64_128, the pair Cassandra's Bloom filter
uses. No call here takes mmh3's ``signed`` flag (see PITFALLS: it must be a keyword).

Thread safety: pure functions.
"""

from __future__ import annotations

from itertools import repeat

import mmh3
import numpy as np

digest = mmh3.mmh3_x64_128_digest  # (key, seed=0, /) -> 16 bytes
uint_digest = mmh3.mmh3_x64_128_uintdigest  # (key, seed=0, /) -> int, h2 << 64 | h1


CHUNK_KEYS = 1 << 16  # keys hashed per batch: keeps temporaries in cache, memory reused


def key_chunks(keys: list, size: int = CHUNK_KEYS):
    """Yield consecutive slices of ``keys`` of at most ``size`` keys."""
    for start in range(0, len(keys), size):
        yield keys[start : start + size]


def digest_batch(keys: list, seed: int = 0) -> bytes:
    """The 16-byte digests of ``keys`` with ``seed``, concatenated in order.

    Raises TypeError if a key is not bytes-like. Complexity: O(total key bytes).
    """
    if seed:
        return b"".join(map(digest, keys, repeat(seed, len(keys))))
    return b"".join(map(digest, keys))


def digest_words(keys: list, seed: int = 0) -> np.ndarray:
    """``(len(keys), 8)`` array of little-endian uint16: each key's digest as eight words."""
    return np.frombuffer(digest_batch(keys, seed), dtype="<u2").reshape(len(keys), 8)


def digest_halves(keys: list, seed: int = 0) -> np.ndarray:
    """``(len(keys), 2)`` array of little-endian uint64: each key's ``(h1, h2)``."""
    return np.frombuffer(digest_batch(keys, seed), dtype="<u8").reshape(len(keys), 2)
