"""Keys and values on the command line and in files: ``--encoding text|hex|base64``.

* ``text``: the UTF-8 bytes of the string (an argument that is not valid UTF-8 keeps its raw
  bytes, as the OS gave them). Output that is not valid UTF-8 is an error, never a silent
  replacement character: use hex or base64 for binary data.
* ``hex``: ``6b6579`` (either case); output lower case.
* ``base64``: standard alphabet with padding; input is validated strictly.

Every decode failure raises ValueError with a user-facing message. Pure functions.

>>> decode("key", "text"), decode("6B6579", "hex"), decode("a2V5", "base64")
(b'key', b'key', b'key')
>>> encode(b"\\xff\\x00", "hex"), encode(b"\\xff\\x00", "base64")
('ff00', '/wA=')
"""

from __future__ import annotations

import base64
import binascii
import os

ENCODINGS = ("text", "hex", "base64")


def decode(s: str, encoding: str) -> bytes:
    """The bytes a user meant by ``s`` in ``encoding``."""
    if encoding == "text":
        return os.fsencode(s)  # UTF-8, with undecodable argv bytes given back as they were
    if encoding == "hex":
        try:
            return bytes.fromhex(s)
        except ValueError:
            raise ValueError(f"not valid hex: {_show(s)}") from None
    if encoding == "base64":
        try:
            return base64.b64decode(s.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            raise ValueError(f"not valid base64: {_show(s)}") from None
    raise ValueError(f"unknown encoding {encoding!r} (use one of {', '.join(ENCODINGS)})")


def encode(b: bytes, encoding: str) -> str:
    """``b`` as a string in ``encoding``; ValueError for non-UTF-8 bytes in text."""
    if encoding == "text":
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{_show_bytes(b)} is not UTF-8 text; use --encoding hex or "
                             f"base64") from None
    if encoding == "hex":
        return b.hex()
    if encoding == "base64":
        return base64.b64encode(b).decode("ascii")
    raise ValueError(f"unknown encoding {encoding!r} (use one of {', '.join(ENCODINGS)})")


def _show(s: str) -> str:
    return repr(s if len(s) <= 40 else s[:37] + "...")


def _show_bytes(b: bytes) -> str:
    return repr(b if len(b) <= 24 else b[:21] + b"...")
