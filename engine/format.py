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
TABLE_FORMAT_VERSION = 3  # "SSTable", "Versions": tables with a compressed data block
TABLE_FORMAT_VERSION_HASHED = 2  # no compressed block, some data block has a hash index
TABLE_FORMAT_VERSION_PLAIN = 1  # what the writer writes when no data block has either
TABLE_FORMAT_VERSIONS_READ = (1, 2, 3)  # versions a reader accepts
TABLE_MAGIC = 0x5349455645545331  # b"SIEVETS1" read as a big-endian u64; "SSTable", "Footer"
# Footer: metaindex (u64 offset, u32 size), index (u64 offset, u32 size), u64 meta_start,
# u32 format version, u32 masked CRC32C of the 36 bytes before it, u64 magic ("Footer").
TABLE_FOOTER = struct.Struct("<QIQIQIIQ")
TABLE_FOOTER_SIZE = TABLE_FOOTER.size  # 48
# Block trailer: u8 block type, u32 masked CRC32C of contents + type byte ("Blocks").
BLOCK_TRAILER = struct.Struct("<BI")
BLOCK_TRAILER_SIZE = BLOCK_TRAILER.size  # 5
BLOCK_TYPE_DATA = 1  # "Blocks": the type byte names what the handle must point at
# The type byte's low 4 bits are the block kind (BLOCK_TYPE_*), its high 4 bits how the
# contents are stored ("Block compression", format version 3): 0 as built, else a compression
# code, RocksDB's CompressionType numbers. Only data blocks are ever compressed.
BLOCK_KIND_MASK = 0x0F
BLOCK_COMPRESSION_SHIFT = 4
COMPRESSION_NONE = 0
COMPRESSION_LZ4 = 4  # LZ4 block format, no frame (RocksDB kLZ4Compression)
COMPRESSION_ZSTD = 7  # one Zstandard frame, RFC 8878 (RocksDB kZSTD)
COMPRESSION_CODES = {"none": COMPRESSION_NONE, "lz4": COMPRESSION_LZ4, "zstd": COMPRESSION_ZSTD}
# A compressed block's stored contents: varint32 uncompressed length, then the stream. A
# writer compresses only blocks of at most this many bytes; a reader rejects a larger stated
# length as corruption before it allocates anything ("Block compression").
BLOCK_MAX_UNCOMPRESSED = 16 << 20
# The compressed form is kept only if it saves at least 1/8: stored < raw - raw // 8
# (RocksDB's GoodCompressionRatio); else the block is stored as built.
BLOCK_COMPRESSION_MIN_SAVING = 8
# Data block hash index ("Data block hash index", format version 2): bit 31 of a block's last
# u32 says the block ends with a hash index: slot u8 x B, then B as u16, before that u32.
BLOCK_HASH_FLAG = 1 << 31
BLOCK_HASH_SEED = 0x53484958  # b"SHIX": mmh3.hash(key, seed, signed=False) % B picks a slot
BLOCK_HASH_MAX_ENTRIES = 255  # a slot holds entry index + 1 in one byte; 0 = empty
BLOCK_HASH_SLOTS_PER_ENTRY = 2  # B = 2 x entries: load <= 1/2 for linear probing
BLOCK_TYPE_INDEX = 2
BLOCK_TYPE_FILTER_INDEX = 3
BLOCK_TYPE_PROPERTIES = 4
BLOCK_TYPE_METAINDEX = 5
# Data block entry value: u64 tag = sequence << 8 | kind, then the user value ("Data blocks").
ENTRY_TAG = struct.Struct("<Q")
MAX_SEQUENCE = (1 << 56) - 1
# The filter region starts at a multiple of this; every partition starts on one and occupies a
# whole number of them ("Filter partitions", "Placement").
FILTER_PAGE_SIZE = 4096
# Metaindex names ("SSTable", "Metaindex block").
META_PROPERTIES = b"sievekv.properties"
META_FILTER_INDEX = b"sievekv.filter_index"

# ---------------------------------------------------------------------------------------------
# Write-ahead log (docs/format.md, "Write-ahead log"). The manifest uses the same record framing.
# ---------------------------------------------------------------------------------------------
LOG_HEADER = struct.Struct("<IIB")  # masked crc32c, payload length, record type
LOG_HEADER_SIZE = LOG_HEADER.size  # 9
LOG_CRC_PREFIX = struct.Struct("<QIB")  # what the crc covers before the payload: offset, length, type
LOG_RECORD_FULL = 1  # a whole payload (0 is never valid)
LOG_RECORD_CLOSED = 2  # log format 2: empty; ends a log the DB finished with ("Record")
LOG_MAX_PAYLOAD = 0xFFFFFFFF  # the length field is a u32
BATCH_HEADER = struct.Struct("<QI")  # first sequence number, number of operations
BATCH_OP_HEADER = struct.Struct("<BII")  # kind, key length, value length

# ---------------------------------------------------------------------------------------------
# Manifest (docs/format.md, "Manifest"). Records are framed like the write-ahead log.
# ---------------------------------------------------------------------------------------------
NUM_LEVELS = 7  # levels 0..6; an edit naming another level is corrupt ("Version invariants")
COMPARATOR_NAME = "sievekv.bytewise"  # keys compare as unsigned bytes ("Version edit")
# Version edit tags ("Version edit"). A new field gets a new tag; an unknown tag is corruption.
EDIT_TAG_COMPARATOR = 1  # string
EDIT_TAG_LOG_NUMBER = 2  # varint
EDIT_TAG_NEXT_FILE_NUMBER = 3  # varint
EDIT_TAG_LAST_SEQUENCE = 4  # varint
EDIT_TAG_COMPACT_POINTER = 5  # varint level, string key
EDIT_TAG_DELETED_FILE = 6  # varint level, varint number
EDIT_TAG_NEW_FILE = 7  # varint level, then the FileMeta fields listed in "Version edit"
EDIT_FLOAT = struct.Struct("<d")  # filter_bits_per_key in a NEW_FILE entry
DEFAULT_MAX_MANIFEST_BYTES = 4 << 20  # rotate to a new manifest past this size ("Recovery and rotation")

# ---------------------------------------------------------------------------------------------
# Filter encodings (docs/format.md, "Filter partitions" / "Filter encodings"). Changing any of
# these values changes the stored format and needs a new versioned policy name (``...v2``),
# never an edit of a ``v1`` layout. Both encodings end with the same 4-byte trailer:
#   byte 0 num_probes k; bytes 1-2 length check, u16 LE; byte 3 encoding marker.
# ---------------------------------------------------------------------------------------------
# Shared trailer (docs/format.md, "Filter encodings", "Trailer")
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

_U32 = struct.Struct("<I")
