"""CRC32C checksums for every block and record (docs/format.md, "Checksums").

We store checksums *masked* the way LevelDB does (``util/crc32c.h``): computing the CRC of a
string that contains embedded CRCs is problematic, so the stored value is rotated and offset.
CRC32C itself comes from google-crc32c (hardware accelerated where the CPU allows).
"""

from __future__ import annotations

import google_crc32c

_MASK_DELTA = 0xA282EAD8
MASK_DELTA = _MASK_DELTA  # for hot paths that inline mask() (engine/sstable/reader.py)
_U32 = 0xFFFFFFFF

_value = google_crc32c.value
_extend = google_crc32c.extend


def crc32c(data, crc: int = 0) -> int:
    """CRC32C of ``data`` (bytes-like), optionally extending a previous ``crc``."""
    if crc:
        return _extend(crc, bytes(data) if not isinstance(data, bytes) else data)
    return _value(data if isinstance(data, bytes) else bytes(data))


def mask(crc: int) -> int:
    """Return the masked form of ``crc`` that is stored on disk."""
    return ((((crc >> 15) | (crc << 17)) & _U32) + _MASK_DELTA) & _U32


def unmask(masked: int) -> int:
    """Inverse of :func:`mask`."""
    rot = (masked - _MASK_DELTA) & _U32
    return ((rot >> 17) | (rot << 15)) & _U32


def masked_crc(data) -> int:
    """``mask(crc32c(data))``: the value written beside a block or record."""
    return mask(crc32c(data))
