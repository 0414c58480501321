"""The cluster configuration: a TOML file, loaded, checked and completed with defaults.

The embedded default (``router/default_config.toml``) documents every option; a user's file
is read the same way and may leave any option out. :func:`load` returns a frozen
:class:`ClusterConfig` whose paths are absolute and whose shard list is complete (address,
slot range and metrics port of every shard), or raises :class:`ConfigError` with one line
that names the file, the option and what is wrong.

Contract: a ClusterConfig that :func:`load` returned is valid; :func:`from_dict` of its
:meth:`ClusterConfig.to_dict` gives it back (the supervisor and the state file carry it as
JSON). Pure apart from reading the file; thread-safe.
"""

from __future__ import annotations

import importlib.resources
import math
import os
import tomllib
from dataclasses import asdict, dataclass, replace

from shard.limits import MAX_VALUE_BYTES_LIMIT

from .humanize import parse_size

NUM_SLOTS = 16384
DEFAULT_CONFIG_NAME = "<embedded default>"


class ConfigError(ValueError):
    """The configuration cannot be used. ``str()`` is one line naming file and option."""


@dataclass(frozen=True)
class ShardSpec:
    index: int
    host: str
    port: int  # 0: pick a free port at cluster start
    slot_start: int  # first slot, inclusive
    slot_end: int  # last slot, inclusive
    metrics_port: int  # 0: no metrics endpoint

    @property
    def address(self) -> str:
        return join_address(self.host, self.port)

    @property
    def name(self) -> str:
        return f"shard-{self.index}"


@dataclass(frozen=True)
class RouterSpec:
    host: str
    port: int
    processes: int
    metrics_port: int
    workers: int = 32
    max_calls_per_shard: int = 0  # 0: the router's default, a quarter of workers

    @property
    def address(self) -> str:
        return join_address(self.host, self.port)


@dataclass(frozen=True)
class LimitsSpec:
    max_value_size: int


@dataclass(frozen=True)
class SupervisorSpec:
    start_timeout: float
    stop_timeout: float
    restart_delay: float
    restart_delay_max: float
    max_restarts: int
    restart_window: float


@dataclass(frozen=True)
class TlsSpec:
    """[tls]: absolute paths of PEM files, "" = not set (plaintext when cert is "")."""

    cert: str = ""
    key: str = ""
    ca: str = ""
    client_ca: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.cert)


@dataclass(frozen=True)
class ClusterConfig:
    source: str  # the file it came from, or DEFAULT_CONFIG_NAME
    data_dir: str  # absolute
    router: RouterSpec
    shards: tuple[ShardSpec, ...]
    engine: dict  # keyword arguments of engine.options.Options.from_kwargs (JSON-safe)
    limits: LimitsSpec
    supervisor: SupervisorSpec
    tls: TlsSpec = TlsSpec()

    def to_dict(self) -> dict:
        return asdict(self)

    def with_ports(self, router_port: int | None, shard_ports: list[int] | None) -> "ClusterConfig":
        """A copy with ports filled in (used when the config asked for port 0)."""
        router = self.router if router_port is None else replace(self.router, port=router_port)
        shards = self.shards
        if shard_ports is not None:
            shards = tuple(replace(s, port=p) for s, p in zip(self.shards, shard_ports))
        return replace(self, router=router, shards=shards)


# ---------------------------------------------------------------------------------------------
# Addresses
# ---------------------------------------------------------------------------------------------

def split_address(address: str) -> tuple[str, int]:
    """``"127.0.0.1:50051" -> ("127.0.0.1", 50051)``; ``"[::1]:5" -> ("::1", 5)``.

    Raises ValueError with a user-facing message.
    """
    if not isinstance(address, str) or ":" not in address:
        raise ValueError(f"expected host:port, got {address!r}")
    host, _, port_s = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise ValueError(f"expected host:port, got {address!r}")
    try:
        port = int(port_s)
    except ValueError:
        raise ValueError(f"port of {address!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"port of {address!r} is out of range 0..65535")
    return host, port


def join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------

def default_config_text() -> str:
    """The embedded default configuration file, comments included."""
    return importlib.resources.files("router").joinpath("default_config.toml").read_text("utf-8")


def load(path: str | None = None, *, data_dir: str | None = None, cwd: str | None = None,
         check_filters: bool = True) -> ClusterConfig:
    """Load ``path`` (or the embedded default when None) and validate it.

    A relative ``data_dir`` in a file is taken from the file's directory; in the embedded
    default, from ``cwd`` (default: the current directory). ``data_dir``, when given,
    overrides the file's (relative to ``cwd``). ``check_filters=False`` skips the engine's
    filter checks (they import numpy): for commands that only need the data directory.
    """
    cwd = os.path.abspath(cwd or os.getcwd())
    if path is None:
        source, text, base = DEFAULT_CONFIG_NAME, default_config_text(), cwd
    else:
        source = os.path.abspath(os.path.join(cwd, path))
        try:
            with open(source, "rb") as f:
                raw = f.read()
        except OSError as exc:
            raise ConfigError(f"config {source}: cannot read: {exc.strerror or exc}") from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(f"config {source}: not UTF-8 text") from None
        base = os.path.dirname(source)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config {source}: invalid TOML: {exc}") from None
    cfg = from_toml(doc, source=source, base_dir=base, check_filters=check_filters)
    if data_dir is not None:
        cfg = replace(cfg, data_dir=os.path.abspath(os.path.join(cwd, data_dir)))
    return cfg


def loads(text: str, *, source: str = "<string>", base_dir: str | None = None) -> ClusterConfig:
    """Like :func:`load` for TOML text (tests, `config check` of stdin)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config {source}: invalid TOML: {exc}") from None
    return from_toml(doc, source=source, base_dir=base_dir or os.getcwd())


class _Section:
    """Reads typed options out of one TOML table, remembering which were used."""

    def __init__(self, source: str, name: str, table: object, defaults: dict):
        self.source, self.name, self.defaults = source, name, defaults
        if not isinstance(table, dict):
            self.fail(None, f"must be a table, got {_type_name(table)}")
        unknown = sorted(set(table) - set(defaults))
        if unknown:
            hint = ", ".join(sorted(defaults))
            self.fail(unknown[0], f"unknown option (known: {hint})")
        self.table = table

    def fail(self, key: str | None, message: str):
        where = f"[{self.name}]" if key is None else f"[{self.name}] {key}"
        raise ConfigError(f"config {self.source}: {where}: {message}")

    def raw(self, key: str):
        return self.table.get(key, self.defaults[key])

    def int(self, key: str, lo: int, hi: int | None = None) -> int:
        v = self.raw(key)
        if isinstance(v, bool) or not isinstance(v, int):
            self.fail(key, f"must be an integer, got {_type_name(v)} {v!r}")
        if v < lo or (hi is not None and v > hi):
            rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
            self.fail(key, f"must be {rng}, got {v}")
        return v

    def number(self, key: str, lo: float, positive: bool = False) -> float:
        v = self.raw(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            self.fail(key, f"must be a number, got {_type_name(v)} {v!r}")
        if not math.isfinite(v) or v < lo or (positive and v <= 0):
            self.fail(key, f"must be a finite number {'>' if positive else '>='} {lo}, got {v}")
        return float(v)

    def size(self, key: str, minimum: int = 0) -> int:
        try:
            v = parse_size(self.raw(key))
        except ValueError as exc:
            self.fail(key, str(exc))
        if v < minimum:
            self.fail(key, f"must be at least {minimum} bytes, got {v}")
        return v

    def bool(self, key: str) -> bool:
        v = self.raw(key)
        if not isinstance(v, bool):
            self.fail(key, f"must be true or false, got {v!r}")
        return v

    def str(self, key: str) -> str:
        v = self.raw(key)
        if not isinstance(v, str) or not v:
            self.fail(key, f"must be a non-empty string, got {v!r}")
        return v

    def address(self, key: str) -> tuple[str, int]:
        text = self.str(key)  # its ConfigError already names file and option
        try:
            return split_address(text)
        except ValueError as exc:
            self.fail(key, str(exc))


def _type_name(v) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
            dict: "table"}.get(type(v), type(v).__name__)


def _defaults() -> dict:
    return tomllib.loads(default_config_text())


def from_toml(doc: dict, *, source: str, base_dir: str, check_filters: bool = True) -> ClusterConfig:
    """Validate a parsed TOML document against the embedded default's options."""
    d = _defaults()
    known = set(d) | {"shard"}
    for key in doc:
        if key not in known:
            raise ConfigError(f"config {source}: [{key}]: unknown section (known: "
                              f"{', '.join(sorted(known))})")

    c = _Section(source, "cluster", doc.get("cluster", {}), d["cluster"])
    data_dir = os.path.abspath(os.path.join(base_dir, os.path.expanduser(c.str("data_dir"))))

    r = _Section(source, "router", doc.get("router", {}), d["router"])
    rhost, rport = r.address("listen")
    workers = r.int("workers", 1, 1024)
    router = RouterSpec(rhost, rport, r.int("processes", 1, 256), r.int("metrics_port", 0, 65535),
                        workers, r.int("max_calls_per_shard", 0, workers))

    shards = _shards(source, doc, d)

    lm = _Section(source, "limits", doc.get("limits", {}), d["limits"])
    limits = LimitsSpec(lm.size("max_value_size", 0))
    if limits.max_value_size > MAX_VALUE_BYTES_LIMIT:
        lm.fail("max_value_size", f"must be at most {MAX_VALUE_BYTES_LIMIT} bytes (gRPC messages "
                                  f"are limited to 2 GiB), got {limits.max_value_size}")
    engine = _engine(source, doc, d, limits, check_filters)

    sv = _Section(source, "supervisor", doc.get("supervisor", {}), d["supervisor"])
    sup = SupervisorSpec(
        start_timeout=sv.number("start_timeout", 0, positive=True),
        stop_timeout=sv.number("stop_timeout", 0, positive=True),
        restart_delay=sv.number("restart_delay", 0),
        restart_delay_max=sv.number("restart_delay_max", 0),
        max_restarts=sv.int("max_restarts", 0),
        restart_window=sv.number("restart_window", 0, positive=True),
    )
    if sup.restart_delay_max < sup.restart_delay:
        sv.fail("restart_delay_max", "must be >= restart_delay")

    cfg = ClusterConfig(source, data_dir, router, shards, engine, limits, sup,
                        _tls(source, doc, d, base_dir))
    _check_ports(cfg)
    return cfg


def _tls(source: str, doc: dict, d: dict, base_dir: str) -> TlsSpec:
    """[tls] with absolute paths; the files themselves are checked when the cluster starts
    (shard/tls.py), by the supervisor."""
    t = _Section(source, "tls", doc.get("tls", {}), d["tls"])
    paths = {}
    for key in d["tls"]:
        v = t.raw(key)
        if not isinstance(v, str):
            t.fail(key, f'must be a path or "" (off), got {_type_name(v)} {v!r}')
        paths[key] = os.path.abspath(os.path.join(base_dir, os.path.expanduser(v))) if v else ""
    spec = TlsSpec(**paths)
    if bool(spec.cert) != bool(spec.key):
        t.fail("key" if spec.cert else "cert", "missing: cert and key go together")
    if spec.cert and not spec.ca:
        t.fail("ca", "missing: with cert, the CA that signed it (to verify the servers)")
    if not spec.cert and (spec.ca or spec.client_ca):
        t.fail("ca" if spec.ca else "client_ca", "needs cert and key (TLS is off without them)")
    return spec


def _shards(source: str, doc: dict, d: dict) -> tuple[ShardSpec, ...]:
    s = _Section(source, "shards", doc.get("shards", {}), d["shards"])
    entries = doc.get("shard", [])
    if not isinstance(entries, list):
        raise ConfigError(f"config {source}: [[shard]]: must be an array of tables")
    if entries and "count" not in s.table:
        count = len(entries)
    else:
        count = s.int("count", 1, NUM_SLOTS)
    if entries and len(entries) != count:
        s.fail("count", f"is {count} but there are {len(entries)} [[shard]] tables")
    host = s.str("host")
    base_port = s.int("base_port", 0, 65535)
    metrics_base = s.int("metrics_base_port", 0, 65535)
    if base_port and base_port + count - 1 > 65535:
        s.fail("base_port", f"{base_port} + {count} shards runs past port 65535")
    if metrics_base and metrics_base + count - 1 > 65535:
        s.fail("metrics_base_port", f"{metrics_base} + {count} shards runs past port 65535")

    shard_defaults = {"listen": None, "slots": None, "metrics_port": None}
    out = []
    explicit_slots = []
    for i in range(count):
        e = _Section(source, f"shard {i}", entries[i] if entries else {}, shard_defaults)
        if e.raw("listen") is None:
            h, p = host, (base_port + i if base_port else 0)
        else:
            h, p = e.address("listen")
        if e.raw("metrics_port") is None:
            mp = metrics_base + i if metrics_base else 0
        else:
            mp = e.int("metrics_port", 0, 65535)
        slots = e.raw("slots")
        if slots is not None:
            if (not isinstance(slots, list) or len(slots) != 2
                    or not all(isinstance(x, int) and not isinstance(x, bool) for x in slots)):
                e.fail("slots", f"must be [first, last], two integers, got {slots!r}")
            if not 0 <= slots[0] <= slots[1] < NUM_SLOTS:
                e.fail("slots", f"must satisfy 0 <= first <= last <= {NUM_SLOTS - 1}, got {slots}")
        explicit_slots.append(slots)
        out.append([i, h, p, mp])

    given = [x is not None for x in explicit_slots]
    if any(given) and not all(given):
        missing = given.index(False)
        raise ConfigError(f"config {source}: [shard {missing}] slots: missing; give slots for "
                          f"every shard or for none")
    if all(given):
        ranges = [tuple(x) for x in explicit_slots]
        expect = 0
        for i, (lo, hi) in enumerate(ranges):
            if lo != expect:
                what = "overlaps the previous shard" if lo < expect else "leaves a gap"
                raise ConfigError(f"config {source}: [shard {i}] slots: starts at {lo}, expected "
                                  f"{expect} ({what}; ranges must be contiguous, in order)")
            expect = hi + 1
        if expect != NUM_SLOTS:
            raise ConfigError(f"config {source}: [shard {count - 1}] slots: ends at {expect - 1}, "
                              f"must end at {NUM_SLOTS - 1}")
    else:
        ranges = even_slot_ranges(count)
    return tuple(ShardSpec(i, h, p, lo, hi, mp) for (i, h, p, mp), (lo, hi) in zip(out, ranges))


def even_slot_ranges(count: int) -> list[tuple[int, int]]:
    """Split 0..NUM_SLOTS-1 into ``count`` contiguous inclusive ranges of near-equal size."""
    bounds = [i * NUM_SLOTS // count for i in range(count + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(count)]


# Engine options whose values are byte counts (the config accepts "64MiB" for them) and those
# whose engine default is None (written "off" in the config).
_SIZE_OPTIONS = {"memtable_bytes", "max_bytes_for_level_base", "target_file_size", "block_size",
                 "block_cache_bytes", "filter_memory_budget", "filter_memory_cap",
                 "partition_bytes", "delayed_write_rate"}
_OFF_OPTIONS = {"filter_policy", "bits_per_key_per_level", "filter_memory_budget",
                "filter_memory_cap", "tombstone_compaction_ratio"}
# Options of engine.options.Options that the config does not expose: the file system is the
# shard's business, a cluster always creates its shards, keys are limited to 64 KiB by the
# protocol, and the value limit lives in [limits].
ENGINE_HIDDEN = {"fs", "create_if_missing", "error_if_exists", "max_key_size", "max_value_size"}


def _engine(source: str, doc: dict, d: dict, limits: LimitsSpec, check_filters: bool) -> dict:
    """The [engine] table as keyword arguments of Options.from_kwargs, validated by it."""
    from engine.errors import InvalidArgumentError
    from engine.options import Options

    e = _Section(source, "engine", doc.get("engine", {}), d["engine"])
    kw: dict = {}
    for name in d["engine"]:
        v = e.raw(name)
        if name in _OFF_OPTIONS and v == "off":
            kw[name] = None
        elif name in _SIZE_OPTIONS:
            kw[name] = e.size(name)
        elif name == "bits_per_key_per_level":
            if (not isinstance(v, list)
                    or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)):
                e.fail(name, f'must be "off" or an array of numbers, got {v!r}')
            kw[name] = [float(x) for x in v]
        elif isinstance(v, int) and not isinstance(v, bool) and isinstance(d["engine"][name], float):
            kw[name] = float(v)  # TOML `10` where the engine takes a float
        else:
            kw[name] = v
    kw["max_value_size"] = limits.max_value_size
    try:
        Options.from_kwargs(check_filters=check_filters, **kw)
    except (InvalidArgumentError, TypeError) as exc:
        raise ConfigError(f"config {source}: [engine]: {exc}") from None
    return kw


def _check_ports(cfg: ClusterConfig) -> None:
    """Two processes of one cluster never get the same (non-zero) port."""
    seen: dict[int, str] = {}

    def claim(port: int, who: str):
        if port == 0:
            return
        if port in seen:
            raise ConfigError(f"config {cfg.source}: {who} uses port {port}, "
                              f"already used by {seen[port]}")
        seen[port] = who

    claim(cfg.router.port, "[router] listen")
    if cfg.router.metrics_port:  # router process i serves metrics on metrics_port + i
        last = cfg.router.metrics_port + cfg.router.processes - 1
        if last > 65535:
            raise ConfigError(f"config {cfg.source}: [router] metrics_port: "
                              f"{cfg.router.processes} router processes need ports "
                              f"{cfg.router.metrics_port}..{last}, past 65535")
        for i in range(cfg.router.processes):
            claim(cfg.router.metrics_port + i, "[router] metrics_port" + (
                f" (+{i}, router process {i})" if i else ""))
    for s in cfg.shards:
        claim(s.port, f"shard {s.index} listen")
        claim(s.metrics_port, f"shard {s.index} metrics_port")


# ---------------------------------------------------------------------------------------------
# JSON round trip (supervisor, state file)
# ---------------------------------------------------------------------------------------------

def from_dict(d: dict) -> ClusterConfig:
    """Inverse of :meth:`ClusterConfig.to_dict` (no validation: the dict came from one)."""
    return ClusterConfig(
        source=d["source"],
        data_dir=d["data_dir"],
        router=RouterSpec(**d["router"]),
        shards=tuple(ShardSpec(**s) for s in d["shards"]),
        engine=dict(d["engine"]),
        limits=LimitsSpec(**d["limits"]),
        supervisor=SupervisorSpec(**d["supervisor"]),
        tls=TlsSpec(**d.get("tls", {})),  # absent in state files of older versions
    )
