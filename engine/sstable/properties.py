"""The properties block: what a table holds, for planners and reports
(docs/format.md, "SSTable", "Properties block").

A block (restart interval 1) of ``name -> value`` entries sorted by name. Each name has one
encoding: ``int`` is a varint64, ``float`` an IEEE-754 little-endian double, ``str`` UTF-8,
``bytes`` raw, ``json`` a UTF-8 JSON object. Readers ignore names they do not know (so a later
version may add some) and report a missing or malformed known name as corruption.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field, fields

from ..errors import CorruptionError
from .block import Block
from .block_builder import BlockBuilder
from .coding import encode_varint, get_varint

_F64 = struct.Struct("<d")


@dataclass
class TableProperties:
    """Facts about one table, written by the builder and read at open. Plain data."""

    num_entries: int = 0
    num_tombstones: int = 0
    smallest_key: bytes = b""
    largest_key: bytes = b""
    smallest_seq: int = 0
    largest_seq: int = 0
    raw_key_bytes: int = 0
    raw_value_bytes: int = 0
    data_bytes: int = 0  # data blocks with trailers; they start at offset 0
    index_bytes: int = 0  # index block contents
    num_data_blocks: int = 0
    filter_policy: str = ""  # the policy's stored (versioned) name; "" = no filter
    filter_params: dict = field(default_factory=dict)
    bits_per_key: float = 0.0  # configured
    effective_bits_per_key: float = 0.0  # 8 * filter_bytes / num_entries
    filter_bytes: int = 0  # the filter region: whole pages, partitions and their padding
    filter_index_bytes: int = 0  # top-level filter index block contents
    num_filter_partitions: int = 0
    block_size: int = 0
    restart_interval: int = 0
    partition_bytes: int = 0
    format_version: int = 0
    creation_time: int = 0  # seconds since the Unix epoch
    # Block compression (format 3; written by every writer since, absent from older tables,
    # whose readers take the defaults below: see _OPTIONAL).
    compression: str = "none"  # the builder's setting: "none", "lz4" or "zstd"
    compressed_data_blocks: int = 0  # data blocks stored compressed
    uncompressed_data_bytes: int = 0  # data_bytes if every data block were stored raw

    def to_dict(self) -> dict:
        return asdict(self)


_KINDS = {f.name: f.type for f in fields(TableProperties)}
# Names added after format 2 that tables written before them lack; a missing one takes this
# value (uncompressed_data_bytes: None = the table's data_bytes). Any other missing name is
# corruption.
_OPTIONAL = {"compression": "none", "compressed_data_blocks": 0, "uncompressed_data_bytes": None}
_BY_KEY = {name.encode(): (name, kind) for name, kind in _KINDS.items()}


def encode_properties(props: TableProperties) -> bytes:
    """Block contents holding every field of ``props``."""
    b = BlockBuilder(1)
    for name in sorted(_KINDS):
        value = getattr(props, name)
        kind = _KINDS[name]
        if kind == "int":
            raw = encode_varint(value)
        elif kind == "float":
            raw = _F64.pack(value)
        elif kind == "str":
            raw = value.encode()
        elif kind == "bytes":
            raw = value
        else:
            raw = json.dumps(value, sort_keys=True).encode()
        b.add(name.encode(), raw)
    return b.finish()


def decode_properties(block: Block) -> TableProperties:
    """Parse a properties block; CorruptionError if a known field is missing or malformed."""
    data = block.data
    values = {}
    try:
        for key, vstart, vend in block.whole_entries():
            known = _BY_KEY.get(key)
            if known is None:
                continue
            name, kind = known
            if kind == "int":
                value, end = get_varint(data, vstart, vend)
                if end != vend:
                    raise ValueError(f"trailing bytes after {name}")
                values[name] = value
                continue
            raw = data[vstart:vend]
            if kind == "float":
                (value,) = _F64.unpack(raw)
            elif kind == "str":
                value = raw.decode()
            elif kind == "bytes":
                value = raw
            else:
                value = json.loads(raw)
                if not isinstance(value, dict):
                    raise ValueError(f"{name} is not a JSON object")
            values[name] = value
        missing = _KINDS.keys() - values.keys() - _OPTIONAL.keys()
        if missing:
            raise ValueError(f"missing {sorted(missing)}")
        for name, default in _OPTIONAL.items():
            if name not in values:
                values[name] = values["data_bytes"] if default is None else default
    except (ValueError, struct.error) as exc:  # UnicodeDecodeError is a ValueError
        raise CorruptionError(f"properties block: {exc}", path=block.path,
                              offset=block.offset) from None
    return TableProperties(**values)
