"""On-disk format constants and struct layouts.

Every constant here points at the section of docs/format.md that defines it; docs/format.md is
the spec, this module is its transcription. Changing a layout means bumping the matching
version number and documenting what the new version adds.
"""

from __future__ import annotations

import struct

# ---------------------------------------------------------------------------------------------
# Entry kinds (docs/format.md, "Entries"). Shared by the SSTable, the WAL and the memtable.
# ---------------------------------------------------------------------------------------------
KIND_DELETE = 0  # a tombstone: the key was deleted at this sequence number
KIND_VALUE = 1  # a live value

# ---------------------------------------------------------------------------------------------
# SSTable (docs/format.md, "SSTable")
# ---------------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------
# Write-ahead log (docs/format.md, "Write-ahead log"). The manifest uses the same record framing.
# ---------------------------------------------------------------------------------------------
LOG_HEADER = struct.Struct("<IIB")  # masked crc32c, payload length, record type
LOG_HEADER_SIZE = LOG_HEADER.size  # 9
LOG_CRC_PREFIX = struct.Struct("<QIB")  # what the crc covers before the payload: offset, length, type
LOG_RECORD_FULL = 1  # format version 1 has one record type: a whole payload (0 is never valid)
LOG_MAX_PAYLOAD = 0xFFFFFFFF  # the length field is a u32
BATCH_HEADER = struct.Struct("<QI")  # first sequence number, number of operations
BATCH_OP_HEADER = struct.Struct("<BII")  # kind, key length, value length

# ---------------------------------------------------------------------------------------------
# Manifest (docs/format.md, "Manifest")
# ---------------------------------------------------------------------------------------------

_U32 = struct.Struct("<I")
