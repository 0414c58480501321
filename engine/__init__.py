"""sievekv's storage engine: ``engine.DB`` and the errors it raises.

>>> import engine, tempfile
>>> with engine.DB.open(tempfile.mkdtemp()) as db:
...     db.put(b"k", b"v"); db.get(b"k")
b'v'
"""

from .errors import (ClosedError, CorruptionError, InvalidArgumentError, LockedError,
                     ResultTooLargeError, SieveError, StorageIOError, WriteStalledError)


def __getattr__(name: str):
    # DB and Options import the whole engine (numpy, the SSTable code): load them on first use,
    # so that tools importing only engine.errors or engine.vfs (the CLI) start fast.
    if name == "DB":
        from .db import DB
        return DB
    if name == "Options":
        from .options import Options
        return Options
    raise AttributeError(f"module 'engine' has no attribute {name!r}")

__all__ = ["DB", "Options", "SieveError", "InvalidArgumentError", "CorruptionError",
           "StorageIOError", "ClosedError", "LockedError", "ResultTooLargeError",
           "WriteStalledError"]
