"""sievekv's storage engine: ``engine.DB`` and the errors it raises.

>>> import engine, tempfile
>>> with engine.DB.open(tempfile.mkdtemp()) as db:
...     db.put(b"k", b"v"); db.get(b"k")
b'v'
"""

from .db import DB
from .errors import (ClosedError, CorruptionError, InvalidArgumentError, LockedError, SieveError,
                     StorageIOError)
from .options import Options

__all__ = ["DB", "Options", "SieveError", "InvalidArgumentError", "CorruptionError",
           "StorageIOError", "ClosedError", "LockedError"]
