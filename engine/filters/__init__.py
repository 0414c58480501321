"""Bloom filter policies: the filters that let a read skip a table that lacks the key.

Public API (a policy behaves as described in :mod:`engine.filters.base`)::

    policy = get_policy("blocked-bloom", 10)     # or "bloom", or a stored name
    data = policy.build(keys)                    # bytes; build(keys, size_bytes=4096) fills a page
    policy.may_match(data, key)                  # False only if key was certainly not built in
    policy.name, policy.params()                 # what a table stores
    policy_from_stored_name(name, params)        # what a table reader calls

Modules: ``base`` (the protocol), ``bloom`` and ``blocked_bloom`` (the two encodings),
``registry`` (names), ``fpr`` (expected false-positive rates), ``hashing``, ``layout``
(byte-layout constants of docs/format.md, "Filter encodings").
"""

from .base import MAX_BITS_PER_KEY, MIN_BITS_PER_KEY, FilterPolicy, UnknownFilterPolicy
from .blocked_bloom import BlockedBloomFilterPolicy
from .bloom import BloomFilterPolicy
from .fpr import blocked_fpr, classic_fpr, theoretical_fpr
from .registry import (
    DEFAULT_POLICY,
    POLICY_NAMES,
    STORED_NAMES,
    get_policy,
    lookup_class,
    policy_from_stored_name,
)

__all__ = [
    "BlockedBloomFilterPolicy",
    "BloomFilterPolicy",
    "DEFAULT_POLICY",
    "FilterPolicy",
    "MAX_BITS_PER_KEY",
    "MIN_BITS_PER_KEY",
    "POLICY_NAMES",
    "STORED_NAMES",
    "UnknownFilterPolicy",
    "blocked_fpr",
    "classic_fpr",
    "get_policy",
    "lookup_class",
    "policy_from_stored_name",
    "theoretical_fpr",
]
