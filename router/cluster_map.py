"""The cluster map: which shard serves which slots (a TOML file read with tomllib).

Format (every slot 0..16383 assigned to exactly one shard; ranges are inclusive, as in Redis
Cluster's ``CLUSTER SLOTS``)::

    # optional; if present it must be 16384
    slot_count = 16384

    [[shards]]
    name = "s0"                      # unique; used in errors, reports, metrics and as a
                                     # checkpoint directory name: no '/', '.', '..' or
                                     # control characters, at most 255 bytes
    address = "10.0.0.11:7000"       # host:port of the shard's gRPC server; unique
    slots = [[0, 8191]]              # one or more [first, last] ranges (or one bare pair)

    [[shards]]
    name = "s1"
    address = "10.0.0.12:7000"
    slots = [[8192, 16383]]

:func:`load` and :func:`parse` raise :class:`ClusterMapError` naming the problem: unknown
keys, a missing field, a duplicate or unusable name, a duplicate address, a malformed address, a range out of
bounds or reversed, a slot assigned twice (naming both shards), slots assigned to nobody
(naming the first gap).
"""

from __future__ import annotations

import tomllib
from array import array
from dataclasses import dataclass

from engine.errors import InvalidArgumentError

from .slots import SLOT_COUNT, slot_of


class ClusterMapError(InvalidArgumentError):
    """The cluster map file is unreadable or invalid; the message names the problem."""


@dataclass(frozen=True)
class ShardSpec:
    name: str
    address: str
    slots: tuple[tuple[int, int], ...]  # inclusive ranges, sorted


@dataclass(frozen=True)
class ClusterMap:
    """A validated map. ``table[slot]`` is the index in ``shards`` of the slot's shard.

    Immutable, so safe to share between threads.
    """

    shards: tuple[ShardSpec, ...]
    table: array  # array('H') of SLOT_COUNT shard indexes

    def shard_index(self, key: bytes) -> int:
        """Index in ``shards`` of the shard serving ``key``."""
        return self.table[slot_of(key)]

    def shard_for(self, key: bytes) -> ShardSpec:
        return self.shards[self.table[slot_of(key)]]

    def to_toml(self) -> str:
        """The map as TOML text that :func:`parse_text` reads back to an equal map."""
        lines = [f"slot_count = {SLOT_COUNT}", ""]
        for s in self.shards:
            ranges = ", ".join(f"[{a}, {b}]" for a, b in s.slots)
            lines += ["[[shards]]", f"name = {_quote(s.name)}", f"address = {_quote(s.address)}",
                      f"slots = [{ranges}]", ""]
        return "\n".join(lines)

    @classmethod
    def even(cls, shards: list[tuple[str, str]]) -> "ClusterMap":
        """A map giving each ``(name, address)`` one contiguous, nearly equal slot range."""
        if not shards:
            raise ClusterMapError("a cluster map needs at least one shard")
        n = len(shards)
        doc = {"shards": [{"name": name, "address": addr,
                           "slots": [[i * SLOT_COUNT // n, (i + 1) * SLOT_COUNT // n - 1]]}
                          for i, (name, addr) in enumerate(shards)]}
        return parse(doc)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def load(path: str) -> ClusterMap:
    """Read and validate the TOML cluster map at ``path``."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ClusterMapError(f"cannot read cluster map {path}: {exc.strerror or exc}") from None
    return parse_text(data.decode("utf-8", errors="replace"), source=path)


def parse_text(text: str, source: str = "<cluster map>") -> ClusterMap:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ClusterMapError(f"{source}: not valid TOML: {exc}") from None
    return parse(doc, source)


def _check_address(address, where: str) -> str:
    if not isinstance(address, str) or not address:
        raise ClusterMapError(f"{where}: address must be a non-empty 'host:port' string")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterMapError(f"{where}: address {address!r} is not 'host:port' with a port 1-65535")
    return address


def _ranges(value, where: str) -> tuple[tuple[int, int], ...]:
    if (isinstance(value, list) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ClusterMapError(f"{where}: slots must be a list of [first, last] ranges")
    out = []
    for r in value:
        if (not isinstance(r, list) or len(r) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in r)):
            raise ClusterMapError(f"{where}: slot range {r!r} is not a [first, last] pair of integers")
        a, b = r
        if not 0 <= a <= b < SLOT_COUNT:
            raise ClusterMapError(
                f"{where}: slot range [{a}, {b}] must satisfy 0 <= first <= last <= {SLOT_COUNT - 1}")
        out.append((a, b))
    return tuple(sorted(out))


def parse(doc: dict, source: str = "<cluster map>") -> ClusterMap:
    """Validate a decoded TOML document (see the module docstring for the rules)."""
    unknown = sorted(set(doc) - {"slot_count", "shards"})
    if unknown:
        raise ClusterMapError(f"{source}: unknown top-level key(s): {', '.join(unknown)}")
    if doc.get("slot_count", SLOT_COUNT) != SLOT_COUNT:
        raise ClusterMapError(f"{source}: slot_count must be {SLOT_COUNT}, got {doc['slot_count']!r}")
    raw = doc.get("shards")
    if not isinstance(raw, list) or not raw:
        raise ClusterMapError(f"{source}: no shards: add at least one [[shards]] table")
    if len(raw) > 65535:
        raise ClusterMapError(f"{source}: too many shards ({len(raw)})")
    shards: list[ShardSpec] = []
    names: set[str] = set()
    addresses: dict[str, str] = {}
    for i, entry in enumerate(raw):
        where = f"{source}: shard #{i + 1}"
        if not isinstance(entry, dict):
            raise ClusterMapError(f"{where}: must be a table")
        unknown = sorted(set(entry) - {"name", "address", "slots"})
        if unknown:
            raise ClusterMapError(f"{where}: unknown key(s): {', '.join(unknown)}")
        for field in ("name", "address", "slots"):
            if field not in entry:
                raise ClusterMapError(f"{where}: missing '{field}'")
        name = entry["name"]
        if not isinstance(name, str) or not name:
            raise ClusterMapError(f"{where}: name must be a non-empty string")
        bad = _name_problem(name)
        if bad:
            raise ClusterMapError(f"{where}: shard name {name!r} {bad}")
        where = f"{source}: shard {name!r}"
        if name in names:
            raise ClusterMapError(f"{where}: duplicate shard name")
        address = _check_address(entry["address"], where)
        if address in addresses:
            raise ClusterMapError(f"{where}: address {address} is also used by shard {addresses[address]!r}")
        names.add(name)
        addresses[address] = name
        shards.append(ShardSpec(name, address, _ranges(entry["slots"], where)))

    unset = len(shards)
    table = array("H", [unset]) * SLOT_COUNT
    for index, spec in enumerate(shards):
        for a, b in spec.slots:
            for slot in range(a, b + 1):
                owner = table[slot]
                if owner != unset:
                    raise ClusterMapError(
                        f"{source}: slot {slot} is assigned to both {shards[owner].name!r} "
                        f"and {spec.name!r}")
                table[slot] = index
    for slot in range(SLOT_COUNT):
        if table[slot] == unset:
            end = slot
            while end + 1 < SLOT_COUNT and table[end + 1] == unset:
                end += 1
            raise ClusterMapError(f"{source}: slots {slot}-{end} are not assigned to any shard")
    return ClusterMap(tuple(shards), table)


def _name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a shard, or None.

    A shard's name becomes a directory (``sievekv checkpoint DIR`` writes ``DIR/<name>``), a
    metric label and a word in one-line messages, so it may not contain '/', NUL or control
    characters, may not be '.' or '..', and is at most 255 bytes (a file name's limit).
    """
    if name in (".", ".."):
        return "cannot be '.' or '..' (it names a checkpoint directory)"
    if "/" in name:
        return "cannot contain '/' (it names a checkpoint directory)"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "cannot contain control characters"
    if len(name.encode("utf-8", "surrogatepass")) > 255:
        return "is longer than 255 bytes"
    return None
