"""The record frame shared by the write-ahead log and the manifest (docs/format.md,
"Write-ahead log").

A record is ``[masked crc32c u32][length u32][type u8][payload]``. The checksum covers the
record's own file offset (u64), the length, the type and the payload, so a bad length is caught
and a copy of a record found at another offset (inside a value, say) never passes as a record.
"""

from __future__ import annotations

import google_crc32c

from ..format import LOG_CRC_PREFIX, LOG_HEADER, LOG_HEADER_SIZE, LOG_RECORD_FULL

__all__ = ["record_crc", "LOG_HEADER", "LOG_HEADER_SIZE", "LOG_RECORD_FULL"]

_value = google_crc32c.value
_extend = google_crc32c.extend
_pack_prefix = LOG_CRC_PREFIX.pack


def record_crc(offset: int, rtype: int, payload: bytes) -> int:
    """Unmasked CRC32C of a record starting at ``offset``. O(len(payload)).

    ``payload`` must be ``bytes`` (google-crc32c refuses memoryviews).
    """
    return _extend(_value(_pack_prefix(offset, len(payload), rtype)), payload)
