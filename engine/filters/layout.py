"""Byte-layout constants of the filter encodings.

The constants live in engine/format.py, the one module that transcribes docs/format.md
("Filter partitions" / "Filter encodings"); this module names the ones the filter code uses.
The document is the spec. Changing any of these values changes the stored format and needs a
new versioned policy name (``...v2``), never an edit of a ``v1`` layout.

Both encodings end with the same 4-byte trailer (docs/format.md, "Filter encodings", "Trailer"):

    byte 0     num_probes k          (1..MAX_PROBES of the encoding)
    bytes 1-2  length check, u16 LE  (classic: bit-array bytes mod 2^16; blocked: lines mod 2^16)
    byte 3     encoding marker       (MARKER_BLOOM or MARKER_BLOCKED)

A reader checks the marker, k, the length and the length check; any mismatch makes the filter
"may match".
"""

from __future__ import annotations

from ..format import (  # noqa: F401 - re-exported for the filter modules
    TRAILER_SIZE,
    TRAILER,
    TRAILER_PROBES,
    TRAILER_MARKER,
    LENGTH_CHECK_MOD,
    BLOOM_NAME,
    MARKER_BLOOM,
    BLOOM_MIN_BIT_BYTES,
    BLOOM_MAX_PROBES,
    BLOCKED_NAME,
    MARKER_BLOCKED,
    LINE_BYTES,
    LINE_SHIFT,
    LINE_BITS,
    LAST_LINE_BITS,
    BLOCKED_MAX_PROBES,
    WORDS_FIRST_DIGEST,
    WORDS_PER_DIGEST,
)
