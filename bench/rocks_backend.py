"""RocksDB (rocksdict) behind engine.DB's API, so the shard server can serve it unchanged.

Used by bench/grpc_bench.py ("RocksDB behind the same two hops") and as a development backend.
Not a product component: the product shard serves engine.DB.

PITFALLS.md: rocksdict drops table options (the Bloom filter) on reopen unless they are given
through ``column_families``; we always pass them that way.
"""

from __future__ import annotations

import os
import threading

from rocksdict import BlockBasedOptions, DBCompressionType, Options, Rdict, WriteBatch, WriteOptions

from engine.errors import ClosedError, InvalidArgumentError, ResultTooLargeError


class RocksBackend:
    """engine.DB's API over a rocksdict ``Rdict`` (raw bytes mode, 10-bit Bloom filters, no
    compression)."""

    def __init__(self, path: str, *, max_key_size: int = 64 * 1024,
                 max_value_size: int = 4 << 20, sync: bool = False, **_ignored):
        os.makedirs(path, exist_ok=True)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        # Off, as bench/grpc_bench.py sets engine.DB's shards (compression "none"; the
        # engine's default is lz4) and db_bench both engines; RocksDB's default here is
        # Snappy (no effect on grpc_bench's random values, but like for like)
        opts.set_compression_type(DBCompressionType.none())
        table = BlockBasedOptions()
        table.set_bloom_filter(10, False)
        opts.set_block_based_table_factory(table)
        self._db = Rdict(path, options=opts, column_families={"default": opts})
        self._max_key, self._max_value = max_key_size, max_value_size
        self._sync_default = sync
        self._wo = {False: WriteOptions(), True: WriteOptions()}
        self._wo[True].sync = True
        self._closed = False
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: str, **options) -> "RocksBackend":
        return cls(path, **options)

    def _check(self, key: bytes, value: bytes | None = None) -> None:
        if self._closed:
            raise ClosedError("db is closed")
        if not 0 < len(key) <= self._max_key:
            raise InvalidArgumentError(f"key must be 1 to {self._max_key} bytes")
        if value is not None and len(value) > self._max_value:
            raise InvalidArgumentError(f"value over the limit of {self._max_value} bytes")

    def _write_options(self, sync):
        return self._wo[self._sync_default if sync is None else bool(sync)]

    def put(self, key, value, sync=None, timeout=None):  # timeout: not bounded here
        self._check(key, value)
        self._db.put(key, value, self._write_options(sync))

    def get(self, key):
        self._check(key)
        return self._db.get(key)

    def delete(self, key, sync=None, timeout=None):
        self._check(key)
        self._db.delete(key, self._write_options(sync))

    def write(self, batch, sync=None, timeout=None):
        wb = WriteBatch(raw_mode=True)
        for key, value in batch:
            self._check(key, value)
            if value is None:
                wb.delete(key)
            else:
                wb.put(key, value)
        self._db.write(wb, self._write_options(sync))

    def multi_get(self, keys, max_bytes=None):
        for key in keys:
            self._check(key)
        values = self._db.get(list(keys))
        if max_bytes is not None and sum(len(v) for v in values if v is not None) > max_bytes:
            raise ResultTooLargeError(f"the values of these keys exceed {max_bytes} bytes")
        return values

    def scan(self, start=None, end=None, limit=None):
        if self._closed:
            raise ClosedError("db is closed")
        it = self._db.iter()
        if start is None:
            it.seek_to_first()
        else:
            it.seek(start)
        n = 0
        while it.valid():
            key = it.key()
            if end is not None and key >= end:
                return
            if limit is not None and n >= limit:
                return
            yield key, it.value()
            n += 1
            it.next()

    def flush(self):
        self._db.flush(True)

    def compact(self):
        self._db.compact_range(None, None)

    def stats(self):
        return {"backend": "rocksdb",
                "estimate_num_keys": int(self._db.property_int_value("rocksdb.estimate-num-keys") or 0)}

    def filter_report(self):
        return {"backend": "rocksdb"}

    def close(self):
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()
