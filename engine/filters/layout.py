"""Byte-layout constants of the filter encodings.

This module is the transcription of docs/format.md, "Filter partitions" / "Filter encodings";
the document is the spec. Changing any of these values changes the stored format and needs a
new versioned policy name (``...v2``), never an edit of a ``v1`` layout.

Both encodings end with the same 4-byte trailer (docs/format.md, "Filter encodings", "Trailer"):

    byte 0     num_probes k          (1..MAX_PROBES of the encoding)
    bytes 1-2  length check, u16 LE  (classic: bit-array bytes mod 2^16; blocked: lines mod 2^16)
    byte 3     encoding marker       (MARKER_BLOOM or MARKER_BLOCKED)

A reader checks the marker, k, the length and the length check; any mismatch makes the filter
"may match".
"""

from __future__ import annotations

import struct

# ---------------------------------------------------------------------------------------------
# Shared trailer (docs/format.md, "Filter encodings", "Trailer")
# ---------------------------------------------------------------------------------------------
TRAILER_SIZE = 4
TRAILER = struct.Struct("<BHB")  # num_probes, length check, marker
TRAILER_PROBES = 0  # offset of k inside the trailer
TRAILER_MARKER = 3  # offset of the marker inside the trailer
LENGTH_CHECK_MOD = 1 << 16  # the length check is a count modulo 2^16

# ---------------------------------------------------------------------------------------------
# Classic Bloom filter, "sievekv.BloomFilter.v1" (docs/format.md, "Classic Bloom")
# ---------------------------------------------------------------------------------------------
BLOOM_NAME = "sievekv.BloomFilter.v1"
MARKER_BLOOM = 0xB1
BLOOM_MIN_BIT_BYTES = 8  # smallest bit array: 64 bits, so a filter is never under 12 bytes
BLOOM_MAX_PROBES = 30

# ---------------------------------------------------------------------------------------------
# Cache-line-blocked Bloom filter, "sievekv.BlockedBloomFilter.v1"
# (docs/format.md, "Blocked Bloom")
# ---------------------------------------------------------------------------------------------
BLOCKED_NAME = "sievekv.BlockedBloomFilter.v1"
MARKER_BLOCKED = 0xB2
LINE_BYTES = 64  # one cache line; every probe of a key lands in one line
LINE_SHIFT = 6  # log2(LINE_BYTES)
LINE_BITS = LINE_BYTES * 8  # 512
LAST_LINE_BITS = LINE_BITS - TRAILER_SIZE * 8  # 480: the trailer lives in the last line
BLOCKED_MAX_PROBES = 30
WORDS_FIRST_DIGEST = 6  # candidate words in digest seed 0 (after the 4-byte line selector)
WORDS_PER_DIGEST = 8  # candidate words in each further digest (seeds 1, 2, ...)
