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
# Write-ahead log (docs/format.md, "Write-ahead log")
# ---------------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------
# Manifest (docs/format.md, "Manifest")
# ---------------------------------------------------------------------------------------------

_U32 = struct.Struct("<I")
