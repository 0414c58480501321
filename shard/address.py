"""HOST:PORT addresses as the processes' ``--listen`` options, the CLI's ``--router`` and the
client library take them: checked before gRPC sees them.

gRPC takes a port modulo 65536 without a word: a shard told to listen on port 65536 serves on
a random free port, one told 99999 serves on 34463, and a client given 50051 + 65536 talks to
whatever serves 50051 (session 20 review). IPv6 hosts must be in brackets (``[::1]:50051``):
without them the last colon is ambiguous.

Thread safety: pure functions.
"""

from __future__ import annotations

import argparse


def check_address(address, *, listen: bool = False) -> str:
    """``address`` if it is HOST:PORT with a port in 1..65535 (0..65535 when ``listen``: port
    0 asks the OS for a free one) and an IPv6 host in brackets. Raises TypeError if it is not a
    string, ValueError with a one-line message naming it otherwise."""
    if not isinstance(address, str):
        raise TypeError(f"address must be a 'host:port' string, got {type(address).__name__}")
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or host == "[]":
        raise ValueError(f"expected host:port, got {address!r}")
    if not port_text.isdigit() or not port_text.isascii():
        raise ValueError(f"port of {address!r} is not a number")
    least = 0 if listen else 1
    if not least <= int(port_text) <= 65535:
        raise ValueError(f"port of {address!r} must be in {least}..65535")
    bracketed = host.startswith("[") and host.endswith("]")
    inner = host[1:-1] if bracketed else host
    if "[" in inner or "]" in inner or (":" in inner and not bracketed):
        raise ValueError(f"expected host:port with an IPv6 host in brackets ([::1]:50051), "
                         f"got {address!r}")
    return address


def listen_address_arg(text: str) -> str:
    """argparse type of ``--listen``: :func:`check_address` with port 0 allowed."""
    try:
        return check_address(text, listen=True)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
