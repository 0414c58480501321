"""The SSTable: an immutable sorted file of entries with a partitioned, lazily mapped filter.

docs/format.md, "SSTable" and "Filter partitions", is the spec of the bytes; each module here
is one concept of it (builder beside reader):

=====================  ==============================================================
block_builder, block   data/meta blocks with prefix compression and restart points
index                  index block: separator key -> data block handle
handle, footer         block handles and trailers (CRC32C), the fixed-size footer
compression            data block compression (LZ4, Zstandard): seal and unseal data blocks
properties             the properties block (counts, key and sequence ranges, sizes)
filter_builder/reader  filter partitions on whole pages, the filter index, lazy mmap
residency              OS-measured resident bytes of mappings (/proc/self/smaps)
builder, reader        TableBuilder, Table
=====================  ==============================================================
"""

from .builder import TableBuilder
from .options import TableOptions
from .properties import TableProperties
from .reader import Table

__all__ = ["TableBuilder", "Table", "TableOptions", "TableProperties"]
