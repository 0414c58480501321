"""Name -> filter policy class: what ``get_policy`` and the table reader look up.

Each policy has a short name (what users and options pass: "bloom", "blocked-bloom") and a
versioned stored name ("sievekv.BloomFilter.v1", "sievekv.BlockedBloomFilter.v1") that the
SSTable writer records with ``policy.params()``. Both names are accepted everywhere. A new
encoding (or a new version of one) is a new class added to ``_POLICY_CLASSES``.
"""

from __future__ import annotations

from typing import Any

from .base import FilterPolicy, UnknownFilterPolicy
from .blocked_bloom import BlockedBloomFilterPolicy
from .bloom import BloomFilterPolicy

DEFAULT_POLICY = BlockedBloomFilterPolicy.short_name

_POLICY_CLASSES: tuple[type[FilterPolicy], ...] = (BloomFilterPolicy, BlockedBloomFilterPolicy)
_BY_NAME: dict[str, type[FilterPolicy]] = {
    **{cls.short_name: cls for cls in _POLICY_CLASSES},
    **{cls.name: cls for cls in _POLICY_CLASSES},
}

POLICY_NAMES: tuple[str, ...] = tuple(cls.short_name for cls in _POLICY_CLASSES)
STORED_NAMES: tuple[str, ...] = tuple(cls.name for cls in _POLICY_CLASSES)


def lookup_class(name: Any) -> type[FilterPolicy]:
    """The policy class for a short or stored name; UnknownFilterPolicy for anything else."""
    cls = _BY_NAME.get(name) if isinstance(name, str) else None
    if cls is None:
        known = ", ".join(POLICY_NAMES + STORED_NAMES)
        raise UnknownFilterPolicy(f"unknown filter policy {name!r} (known: {known})")
    return cls


def get_policy(name: str, bits_per_key: float, *, num_probes: int | None = None) -> FilterPolicy:
    """A policy by short or stored name, e.g. ``get_policy("blocked-bloom", 10)``.

    ``num_probes`` overrides the policy's choice of k (benchmarks use it).
    Raises InvalidArgumentError (UnknownFilterPolicy, a subclass, for an unknown name) if the
    name is unknown, ``bits_per_key`` is outside [1, 64] or ``num_probes`` out of range.
    """
    return lookup_class(name)(bits_per_key, num_probes)


def policy_from_stored_name(name: str, params: dict | None = None) -> FilterPolicy:
    """Rebuild the decoder a table's filter needs from its stored name and ``params()``.

    Raises UnknownFilterPolicy if the name or the params are not understood: the reader then
    treats the filter as absent (every key may match).
    """
    return lookup_class(name).from_params(params)
