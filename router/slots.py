"""Keys to slots, as in Redis Cluster (which uses CRC16; we use MurmurHash3).

``slot_of(key) = mmh3.hash(key, 0, signed=False) % 16384``: MurmurHash3 x86 32-bit of the raw
key bytes, seed 0, read as an *unsigned* 32-bit integer, modulo 16384. ``signed=False`` is
passed by keyword (PITFALLS.md: a positional ``signed`` argument is taken as true whatever its
value). Changing this function moves keys between shards: it is part of the cluster's format.

>>> slot_of(b"hello")
14919
"""

from __future__ import annotations

import mmh3

SLOT_COUNT = 16384
SLOT_FUNCTION = "mmh3.hash(key, seed=0, signed=False) % 16384"


def slot_of(key: bytes) -> int:
    """The slot (0..16383) of ``key``. ~0.1 µs."""
    return mmh3.hash(key, 0, signed=False) % SLOT_COUNT
