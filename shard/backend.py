"""The seam between the shard server and the storage it serves.

The shard serves any object with engine.DB's API (the product serves :class:`engine.DB`;
bench/rocks_backend.py serves RocksDB through the same server to compare like with like):

- ``put(key, value, sync=None, timeout=None)``, ``delete(key, sync=None, timeout=None)``,
  ``get(key) -> bytes | None``
- ``write(batch, sync=None, timeout=None)``: atomic; ``batch`` is an iterable of
  ``(key, value)`` pairs, value ``None`` = delete. ``timeout``: seconds a write may wait for
  room while writes are held (engine.DB: WriteStalledError, nothing applied, past it; the
  shard passes what is left of the call's deadline); a backend may ignore it
- ``multi_get(keys, max_bytes=None) -> list[bytes | None]``: ResultTooLargeError once the
  values found exceed ``max_bytes``
- ``scan(start=None, end=None, limit=None)``: iterator of ``(key, value)`` in key order,
  ``end`` exclusive
- ``flush()``, ``compact()``, ``stats() -> dict``, ``filter_report() -> dict`` (JSON-able),
  ``close()``

Errors are :mod:`engine.errors` classes; :mod:`shard.status` maps them to status codes.
The backend must be safe to call from several threads at once (the server's thread pool).
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Protocol


class Backend(Protocol):
    def put(self, key: bytes, value: bytes, sync: bool | None = None,
            timeout: float | None = None) -> None: ...
    def get(self, key: bytes) -> bytes | None: ...
    def delete(self, key: bytes, sync: bool | None = None,
               timeout: float | None = None) -> None: ...
    def write(self, batch: Iterable[tuple[bytes, bytes | None]], sync: bool | None = None,
              timeout: float | None = None) -> None: ...
    def multi_get(self, keys: list[bytes], max_bytes: int | None = None) -> list[bytes | None]: ...
    def scan(self, start: bytes | None = None, end: bytes | None = None,
             limit: int | None = None) -> Iterator[tuple[bytes, bytes]]: ...
    def flush(self) -> None: ...
    def compact(self) -> None: ...
    # Optional: ``verify() -> dict`` (engine.DB.verify); a backend without it answers
    # Admin.Verify with UNIMPLEMENTED. The same for ``checkpoint(dir) -> dict``
    # (engine.DB.checkpoint) and Admin.Checkpoint.
    def stats(self) -> dict[str, Any]: ...
    def filter_report(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


def open_engine(path: str, **options) -> Backend:
    """Open sievekv's engine at ``path`` (the product backend). Raises LockedError when another
    process holds the directory, InvalidArgumentError for a bad option."""
    from engine import DB  # imported here so the server modules load without the engine

    return DB.open(path, **options)
