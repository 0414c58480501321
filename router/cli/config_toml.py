"""A resolved :class:`router.config.ClusterConfig` written back as a config file
(``sievekv config show``).

Every option is written, with the value the cluster would use: the absolute data directory,
the router's address, and one ``[[shard]]`` table per shard with its address, slot range and
metrics port; ``[engine]`` lists every option of the embedded default's ``[engine]`` in its
order (``"off"`` for the engine's None, whole binary multiples of sizes as ``"8MiB"``).
Contract: ``router.config.load`` of the text gives back the same config except ``source``.
Pure; thread-safe.
"""

from __future__ import annotations

import math
import tomllib

from ..config import ClusterConfig, default_config_text

_UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def render(cfg: ClusterConfig, header: str = "") -> str:
    """The config file text of ``cfg``; ``header`` lines become comments at the top.
    ValueError if a string cannot be written as TOML (a path with undecodable bytes)."""
    engine_defaults = tomllib.loads(default_config_text())["engine"]
    out = [f"# {line}".rstrip() for line in header.splitlines()]
    out += ["", "[cluster]", _kv("data_dir", cfg.data_dir)]
    out += ["", "[router]", _kv("listen", cfg.router.address),
            _kv("processes", cfg.router.processes), _kv("metrics_port", cfg.router.metrics_port),
            _kv("workers", cfg.router.workers),
            _kv("max_calls_per_shard", cfg.router.max_calls_per_shard)]
    first = cfg.shards[0]
    out += ["", "[shards]", _kv("count", len(cfg.shards)), _kv("host", first.host),
            _kv("base_port", _base([s.port for s in cfg.shards])),
            _kv("metrics_base_port", _base([s.metrics_port for s in cfg.shards]))]
    for s in cfg.shards:
        out += ["", "[[shard]]", _kv("listen", s.address), _kv("slots", [s.slot_start, s.slot_end]),
                _kv("metrics_port", s.metrics_port)]
    out += ["", "[engine]"]
    for name, default in engine_defaults.items():
        out.append(_kv(name, _engine_value(cfg.engine[name], default)))
    out += ["", "[limits]", _kv("max_value_size", _size(cfg.limits.max_value_size))]
    sv = cfg.supervisor
    out += ["", "[supervisor]"] + [_kv(k, getattr(sv, k)) for k in (
        "start_timeout", "stop_timeout", "restart_delay", "restart_delay_max", "max_restarts",
        "restart_window")]
    out += ["", "[tls]"] + [_kv(k, getattr(cfg.tls, k)) for k in ("cert", "key", "ca", "client_ca")]
    return "\n".join(out) + "\n"


def _base(ports: list[int]) -> int:
    """The base port that gives ``ports`` (port i = base + i), else 0 (the [[shard]] tables
    give each port anyway)."""
    base = ports[0]
    return base if base and ports == [base + i for i in range(len(ports))] else 0


def _engine_value(value, default):
    if value is None:
        return "off"
    if isinstance(default, str) and isinstance(value, int) and not isinstance(value, bool):
        return _size(value)  # a size option ("8MiB" in the default)
    return value


def _size(n: int):
    for unit, mult in _UNITS:
        if n and n % mult == 0:
            return f"{n // mult}{unit}"
    return n


def _kv(key: str, value) -> str:
    return f"{key} = {_value(value)}"


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"{v!r} cannot be written as a TOML number here")
        text = repr(v)
        return text if any(c in text for c in ".e") else text + ".0"
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise ValueError(f"cannot write {type(v).__name__} {v!r} as TOML")


def _string(s: str) -> str:
    """A TOML basic string: quote, backslash and control characters escaped."""
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\u{o:04x}")
        elif 0xD800 <= o <= 0xDFFF:
            raise ValueError(f"{s!r} is not valid Unicode (undecodable bytes in a path?) and "
                             f"cannot be written as TOML")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)
