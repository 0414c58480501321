"""The filter-policy protocol every filter encoding implements, and its shared checks.

A policy turns a set of keys into filter bytes and answers "may this key be in the set?" from
those bytes. The SSTable writer stores ``policy.name`` (a versioned name) and
``policy.params()`` with the table; the reader rebuilds a decoder with
:func:`engine.filters.policy_from_stored_name`, so adding an encoding is a new module and a
registry entry, never an edit of the read path.

Contract of every policy (docs/format.md, "Filter encodings"):

* ``build(keys)`` never drops a key: ``may_match(build(keys), k)`` is True for every ``k`` in
  ``keys`` (duplicates and the empty key included).
* ``may_match`` never raises on bad filter bytes and never answers False for them: a filter
  that is too short, has the wrong length or a wrong trailer answers True ("may match"), so an
  unreadable filter costs a read, never a wrong answer. It does raise ``TypeError`` for a key
  that is not bytes-like: that is a caller bug, not bad data.
* ``may_match`` reads the probe count from the filter's trailer, so a filter stays readable by
  any policy object of the same stored name, whatever its ``bits_per_key``.

Thread safety: policies are immutable after construction; ``build`` and ``may_match`` may be
called from any number of threads at once.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any, Callable, ClassVar

from ..errors import InvalidArgumentError

MIN_BITS_PER_KEY = 1.0
MAX_BITS_PER_KEY = 64.0


class UnknownFilterPolicy(InvalidArgumentError):
    """A filter policy name (or stored parameters) this build does not understand.

    A subclass of InvalidArgumentError, which ``get_policy`` documents for unknown names. The
    table reader catches this class and treats the table's filter as absent: every key may
    match.
    """


def check_bits_per_key(bits_per_key: Any) -> float:
    """Return ``bits_per_key`` as a float; raise InvalidArgumentError unless it is a finite
    number in [MIN_BITS_PER_KEY, MAX_BITS_PER_KEY]."""
    if isinstance(bits_per_key, bool) or not isinstance(bits_per_key, (int, float)):
        raise InvalidArgumentError(f"bits_per_key must be a number, got {bits_per_key!r}")
    value = float(bits_per_key)
    if not (MIN_BITS_PER_KEY <= value <= MAX_BITS_PER_KEY):  # also rejects NaN
        raise InvalidArgumentError(
            f"bits_per_key must be in [{MIN_BITS_PER_KEY:g}, {MAX_BITS_PER_KEY:g}], got {value!r}"
        )
    return value


def check_count(value: Any, what: str, low: int, high: int | None = None) -> int:
    """Return ``value`` if it is an int in [low, high]; raise InvalidArgumentError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{what} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise InvalidArgumentError(f"{what} must be in {bound}, got {value}")
    return value


class FilterPolicy(ABC):
    """Base class of the filter policies. Subclasses set the class attributes and implement
    the abstract methods.

    Instance attributes: ``bits_per_key`` (float), ``num_probes`` (k), and ``may_match``, a
    plain function ``(filter_data, key) -> bool`` specialised for this k (bind it to a local
    in hot loops: ``probe = policy.may_match``).
    """

    short_name: ClassVar[str]  # what users pass to get_policy, e.g. "bloom"
    name: ClassVar[str]  # the versioned name stored in each table
    max_probes: ClassVar[int]  # the largest k the encoding can store and read
    min_size: ClassVar[int]  # the smallest filter the encoding produces, in bytes

    def __init__(self, bits_per_key: float, num_probes: int | None = None):
        self.bits_per_key = check_bits_per_key(bits_per_key)
        if num_probes is None:
            num_probes = self.choose_num_probes(self.bits_per_key)
        self.num_probes = check_count(num_probes, "num_probes", 1, self.max_probes)
        probe: Callable[[Any, bytes], bool] = self._make_probe(self.num_probes)
        self.may_match = probe  # an instance attribute: no bound-method cost per call

    # -- the protocol -----------------------------------------------------------------------

    def may_match(self, filter_data, key: bytes) -> bool:  # replaced per instance in __init__
        """True if ``key`` may be in the set ``filter_data`` was built from; False only if it
        certainly is not. ``filter_data`` is bytes, bytearray, or a memoryview (a slice of an
        mmap included; read in place, never copied). Malformed data answers True."""
        return self._make_probe(self.num_probes)(filter_data, key)

    def build(self, keys: Iterable[bytes], size_bytes: int | None = None) -> bytes:
        """Encode a filter over ``keys`` (bytes-like; duplicates allowed; any number).

        Without ``size_bytes`` the filter has ``estimate_size(len(keys))`` bytes. With it, the
        filter has exactly ``fit_size(size_bytes)`` bytes: ``size_bytes`` rounded down as the
        encoding requires, but never below ``min_size`` (so the SSTable writer can fill a page).
        Raises InvalidArgumentError for a key that is not bytes-like or a bad ``size_bytes``.
        Complexity: O(len(keys) * k), vectorised.
        """
        if not isinstance(keys, (list, tuple)):
            keys = list(keys)
        if size_bytes is None:
            size = self.estimate_size(len(keys))
        else:
            size = self.fit_size(size_bytes)
        try:
            return self._build_bytes(keys, size)
        except TypeError as exc:
            raise InvalidArgumentError(f"filter keys must be bytes-like: {exc}") from exc

    def params(self) -> dict:
        """JSON-able parameters stored in the table properties beside ``name``."""
        return {"bits_per_key": self.bits_per_key, "num_probes": self.num_probes}

    @classmethod
    def from_params(cls, params: dict | None) -> "FilterPolicy":
        """Rebuild a policy from stored ``params`` (missing keys take defaults: decoding only
        needs the trailer). Raises UnknownFilterPolicy for values this build cannot use."""
        params = params or {}
        if not isinstance(params, dict):
            raise UnknownFilterPolicy(f"{cls.name}: stored params are not a mapping: {params!r}")
        try:
            return cls(params.get("bits_per_key", 10.0), params.get("num_probes"))
        except InvalidArgumentError as exc:
            raise UnknownFilterPolicy(f"{cls.name}: unusable stored params: {exc}") from exc

    def expected_fpr(self, bits_per_key: float | None = None) -> float:
        """The model FPR (see ``fpr_model``) at ``bits_per_key`` (default: this policy's)."""
        bpk = self.bits_per_key if bits_per_key is None else bits_per_key
        return self.fpr_model(bpk, self.num_probes)

    # -- what each encoding implements -----------------------------------------------------

    @staticmethod
    @abstractmethod
    def choose_num_probes(bits_per_key: float) -> int:
        """The default k for ``bits_per_key``."""

    @staticmethod
    @abstractmethod
    def fpr_model(bits_per_key: float, num_probes: int) -> float:
        """The model FPR of this encoding (see :mod:`engine.filters.fpr`)."""

    @abstractmethod
    def estimate_size(self, num_keys: int) -> int:
        """The exact length ``build`` produces for ``num_keys`` keys (duplicates counted)."""

    @abstractmethod
    def fit_size(self, size_bytes: int) -> int:
        """The exact length ``build(keys, size_bytes=size_bytes)`` produces."""

    @abstractmethod
    def _make_probe(self, num_probes: int) -> Callable[[Any, bytes], bool]:
        """The ``may_match`` function specialised for ``num_probes``."""

    @abstractmethod
    def _build_bytes(self, keys: list, size: int) -> bytes:
        """Encode ``keys`` into exactly ``size`` bytes (``size`` already validated)."""

    # -- plumbing ---------------------------------------------------------------------------

    def __repr__(self) -> str:
        return f"{type(self).__name__}(bits_per_key={self.bits_per_key:g}, num_probes={self.num_probes})"

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is type(self)
            and other.bits_per_key == self.bits_per_key  # type: ignore[attr-defined]
            and other.num_probes == self.num_probes  # type: ignore[attr-defined]
        )

    def __hash__(self) -> int:
        return hash((type(self), self.bits_per_key, self.num_probes))


def bits_for(num_keys: int, bits_per_key: float) -> int:
    """Bits a filter of ``num_keys`` keys wants at ``bits_per_key``: ceil(num_keys * bpk)."""
    return math.ceil(num_keys * bits_per_key)
