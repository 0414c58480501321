"""Human-readable quantities: byte sizes and durations, both directions.

``format_bytes(1536) == "1.5 KiB"``; ``parse_size("64MiB") == 67108864``;
``format_duration(3725) == "1h02m"``. Pure functions, no I/O; used by the config loader (sizes
written by people) and by the CLI's tables (sizes read by people). ``--json`` output never goes
through this module: scripts get raw numbers.

>>> format_bytes(0), format_bytes(1023), format_bytes(1536), format_bytes(5 * 2**30)
('0 B', '1023 B', '1.5 KiB', '5.0 GiB')
>>> parse_size("4MiB"), parse_size("1.5 KiB"), parse_size(4096), parse_size("2k")
(4194304, 1536, 4096, 2048)
>>> format_duration(0.4), format_duration(59), format_duration(61), format_duration(90061)
('0s', '59s', '1m01s', '1d01h')
"""

from __future__ import annotations

import math
import re

_UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]

# Binary multiples; the short and decimal-looking spellings mean the same binary multiple, as
# in RocksDB's and most operators' usage ("64MB" block cache == 64 MiB).
_SUFFIX = {
    "": 1,
    "b": 1,
    "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
    "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
    "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
    "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: int | str) -> int:
    """Parse a byte count: an int, or a string like ``"64MiB"``, ``"64MB"``, ``"1.5g"``.

    Raises ValueError (with a message fit for a user) on anything else, including negatives,
    bools and fractional byte counts.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a size like 4096 or \"64MiB\", got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative, got {value}")
        return value
    if not isinstance(value, str):
        raise ValueError(f"expected a size like 4096 or \"64MiB\", got {value!r}")
    m = _SIZE_RE.match(value)
    if not m or m.group(2).lower() not in _SUFFIX:
        raise ValueError(f"expected a size like 4096 or \"64MiB\", got {value!r}")
    number = float(m.group(1)) * _SUFFIX[m.group(2).lower()]
    if number != math.floor(number):
        raise ValueError(f"{value!r} is not a whole number of bytes")
    return int(number)


def format_bytes(n: int | float | None) -> str:
    """``1536 -> "1.5 KiB"``; None (unknown) -> ``"-"``."""
    if n is None:
        return "-"
    n = float(n)
    if abs(n) < 1024:
        return f"{int(n)} B"
    i = 0
    # compare what will be printed: 1048575 B is "1.0 MiB", not "1024.0 KiB"
    while abs(round(n, 1)) >= 1024 and i < len(_UNITS) - 1:
        n /= 1024
        i += 1
    return f"{n:.1f} {_UNITS[i]}"


def format_duration(seconds: float | None) -> str:
    """Two most significant units: ``"59s"``, ``"1m01s"``, ``"3h05m"``, ``"2d04h"``."""
    if seconds is None:
        return "-"
    s = int(max(0.0, seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}d{h:02d}h"
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"


def format_ratio(x: float | None, digits: int = 4) -> str:
    """A probability or fraction for a table cell; None -> ``"-"``."""
    if x is None:
        return "-"
    if x == 0:
        return "0"
    if x < 10 ** -digits:
        return f"{x:.1e}"
    return f"{x:.{digits}f}"


def format_count(n: int | None) -> str:
    """``1234567 -> "1,234,567"``; None -> ``"-"``."""
    return "-" if n is None else f"{n:,}"


def format_counted(n: int | None, noun: str, plural: str | None = None) -> str:
    """:func:`format_count` and ``noun``, singular for exactly one: ``1 table``, ``2 tables``,
    ``1,234 records`` (``plural`` where adding "s" is wrong)."""
    return f"{format_count(n)} {noun if n == 1 else (plural or noun + 's')}"
