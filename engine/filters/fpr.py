"""False-positive-rate models for reports and benchmarks (never used to decide a lookup).

Two models, named so that reports can say which one a number comes from:

* :func:`classic_fpr` -- the textbook Bloom filter estimate ``(1 - e^(-k n / m))^k``
  (n keys, m bits, k probes), written with ``bits_per_key = m / n``.
* :func:`blocked_fpr` -- the cache-line-blocked model (Putze, Sanders & Singler, "Cache-,
  Hash- and Space-Efficient Bloom Filters", 2007): the number of keys that land in one line
  of ``line_bits`` bits is Poisson with mean ``line_bits / bits_per_key``, and the rate is the
  average, over that distribution, of the exact per-line rate
  ``(1 - (1 - 1/line_bits)^(k j))^k`` for a line holding j keys. RocksDB's
  ``BloomMath::CacheLocalFpRate`` approximates the same average with two points (one standard
  deviation either side of the mean); this sums the distribution instead.

Both ignore hash collisions (we hash to 128 bits, negligible at any table size we write).

Complexity: classic O(1); blocked O(mean keys per line), well under a millisecond.
"""

from __future__ import annotations

import math


def classic_fpr(bits_per_key: float, num_probes: int) -> float:
    """``(1 - e^(-k / bits_per_key))^k``, the standard Bloom filter estimate.

    >>> round(classic_fpr(10, 7) * 100, 3)
    0.819
    """
    if bits_per_key <= 0:
        return 1.0
    return (1.0 - math.exp(-num_probes / bits_per_key)) ** num_probes


def blocked_fpr(bits_per_key: float, num_probes: int, line_bits: int = 512) -> float:
    """Expected FPR of a Bloom filter whose k probes all land in one ``line_bits``-bit line.

    Sums the per-line rate over a Poisson number of keys per line (see the module docstring).

    >>> round(blocked_fpr(10, 6) * 100, 3)
    0.958
    """
    if bits_per_key <= 0:
        return 1.0
    lam = line_bits / bits_per_key
    keep = 1.0 - 1.0 / line_bits
    j_max = int(lam + 12.0 * math.sqrt(lam) + 30)
    total = 0.0
    p = math.exp(-lam)  # Poisson(0); lam <= 512 keeps this far from underflow
    for j in range(j_max + 1):
        if j:
            p *= lam / j
        total += p * (1.0 - keep ** (num_probes * j)) ** num_probes
    return total


def theoretical_fpr(policy_name: str, bits_per_key: float, num_probes: int) -> float:
    """The model that fits the named policy: classic for "bloom", blocked for "blocked-bloom".

    Accepts the short names and the stored names (see :mod:`engine.filters.registry`).
    Raises :class:`engine.filters.base.UnknownFilterPolicy` for any other name.
    """
    from .registry import lookup_class  # late import: registry imports the policies

    return lookup_class(policy_name).fpr_model(bits_per_key, num_probes)
