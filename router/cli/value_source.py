"""Where ``sievekv put`` takes its value from, and the check that it can be sent at all.

* ``put KEY VALUE``: the argument, decoded by ``--encoding`` like the key.
* ``put KEY -``: standard input, raw bytes (``sys.stdin.buffer``): no decoding whatever
  ``--encoding`` says, no newline stripped. So ``printf %s - | sievekv put KEY -`` stores the
  one-character value ``-``.
* ``put KEY --value-file PATH``: the file's raw bytes (``-`` is standard input again).

A stream is read in chunks and at most ``limits.max_message_bytes`` of it is kept: past that the
Put could not be sent, so the rest is only counted (memory stays bounded whatever is piped in)
and the value is refused with the servers' own words (sizes.value_over_limit), exit 2. A value
over the value limit that still fits a message is sent, and the server's INVALID_ARGUMENT is
what the operator sees. Raises CliError (USAGE) for every problem.
"""

from __future__ import annotations

import sys
from typing import BinaryIO

from engine.errors import InvalidArgumentError
from shard.limits import Limits

from .codec import decode
from .exit_codes import USAGE, CliError
from ..wire_sizes import put_request_bytes
from .sizes import value_over_limit

STDIN = "-"
CHUNK = 1 << 20


def read_value(args, key: bytes, limits: Limits) -> bytes:
    """The value ``put`` sends for ``key``; CliError if none was given, it cannot be read or it
    is too large to send (see the module docstring)."""
    given, path = getattr(args, "value", None), getattr(args, "value_file", None)
    if given is not None and path is not None:
        raise CliError("give VALUE or --value-file PATH, not both", USAGE)
    if given is None and path is None:
        raise CliError("missing VALUE (or - to read it from standard input, or --value-file "
                       "PATH)", USAGE)
    if path is None and given != STDIN:
        try:
            value = decode(given, args.encoding)
        except ValueError as exc:
            raise CliError(f"value: {exc}", USAGE) from None
        total = len(value)
    elif (path or STDIN) == STDIN:
        value, total = _read(_stdin(), "standard input", limits.max_message_bytes)
    else:
        try:
            with open(path, "rb") as f:
                value, total = _read(f, path, limits.max_message_bytes)
        except OSError as exc:
            raise CliError(f"--value-file: cannot read {path}: {exc.strerror or exc}",
                           USAGE) from None
    sync = True if getattr(args, "sync", False) else None
    if total > len(value) or put_request_bytes(len(key), total, sync) > limits.max_message_bytes:
        # Unsendable (the channel would refuse it with a raw RESOURCE_EXHAUSTED), so the value
        # is over the limit: a key of at most 64 KiB and a value within the limit always fit.
        try:
            limits.check_key(key)
        except InvalidArgumentError as exc:
            raise CliError(f"put: INVALID_ARGUMENT: {exc}", USAGE) from None
        raise CliError(f"put: INVALID_ARGUMENT: {value_over_limit(total, limits)}", USAGE)
    return value


def _stdin() -> BinaryIO:
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:
        raise CliError("cannot read the value: there is no standard input", USAGE)
    if stream.isatty():
        print("sievekv: reading the value from standard input (end it with Ctrl-D)",
              file=sys.stderr, flush=True)
    return stream


def _read(stream: BinaryIO, what: str, keep: int) -> tuple[bytes, int]:
    """``(first keep bytes, total bytes)`` of ``stream`` read to its end."""
    buf = bytearray()
    total = 0
    try:
        while chunk := stream.read(CHUNK):
            total += len(chunk)
            if len(buf) < keep:
                buf += chunk[:keep - len(buf)]
    except OSError as exc:
        raise CliError(f"cannot read {what}: {exc.strerror or exc}", USAGE) from None
    return bytes(buf), total
