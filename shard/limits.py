"""Size limits of keys, values and gRPC messages, and the checks that enforce them.

Contract:
- a key is 1..``max_key_bytes`` bytes (64 KiB, the engine's ``max_key_size``);
- a value is 0..``max_value_bytes`` bytes (default 4 MiB, the engine's ``max_value_size``);
- a gRPC message (request or response) is at most ``max_message_bytes`` =
  ``max_value_bytes + MESSAGE_SLACK_BYTES`` (1 MiB), so a single maximal Put always fits and a
  larger batch fails with RESOURCE_EXHAUSTED rather than INVALID_ARGUMENT. Servers, the
  router's shard channels and the client library all use this value for both directions.

A violated limit raises :class:`engine.errors.InvalidArgumentError` whose message names the
limit; the guard in :mod:`shard.status` turns it into INVALID_ARGUMENT.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import InvalidArgumentError

KiB = 1024
MiB = 1024 * KiB
MAX_KEY_BYTES = 64 * KiB
DEFAULT_MAX_VALUE_BYTES = 4 * MiB
MESSAGE_SLACK_BYTES = 1 * MiB
GRPC_MAX_MESSAGE_BYTES = 2**31 - 1  # gRPC message limits are C ints
MAX_VALUE_BYTES_LIMIT = GRPC_MAX_MESSAGE_BYTES - MESSAGE_SLACK_BYTES
"""The largest ``max_value_bytes`` whose message limit gRPC can represent (2 GiB - 1 MiB - 1)."""


# What a MultiGetResponse adds to its values, at most (proto/sievekv.proto): per key a packed
# ``found`` byte, a value's tag byte and a varint length (5 bytes up to 32 GiB); once, the
# ``found`` field's tag and varint length.
_FRAMING_PER_KEY = 7
_FRAMING_BASE = 16

VALUE_LIMIT_SETTING = "(--max-value-bytes; max_value_size under [limits] in a cluster config)"
"""Where the value limit is set, as the messages about it say: a shard's or router's flag, or a
cluster config (router/config.py, which passes it on as the flag)."""


def max_value_bytes_arg(text: str) -> int:
    """argparse ``type=`` for ``--max-value-bytes`` (shard and router): an int in
    0..MAX_VALUE_BYTES_LIMIT, else a usage error naming the range."""
    import argparse

    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 0 <= n <= MAX_VALUE_BYTES_LIMIT:
        raise argparse.ArgumentTypeError(f"must be in 0..{MAX_VALUE_BYTES_LIMIT}, got {n}")
    return n


@dataclass(frozen=True)
class Limits:
    """Immutable limits shared by one server's handlers (thread-safe by immutability)."""

    max_key_bytes: int = MAX_KEY_BYTES
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES

    def __post_init__(self) -> None:
        # Past the cap, creating a channel or server raises OverflowError in gRPC's C core.
        if not 0 <= self.max_value_bytes <= MAX_VALUE_BYTES_LIMIT:
            raise InvalidArgumentError(
                f"max value size must be in 0..{MAX_VALUE_BYTES_LIMIT} bytes (gRPC messages are "
                f"limited to 2 GiB), got {self.max_value_bytes}")

    @property
    def max_message_bytes(self) -> int:
        return self.max_value_bytes + MESSAGE_SLACK_BYTES

    def check_key(self, key: bytes, what: str = "key") -> None:
        """Raise InvalidArgumentError unless 1 <= len(key) <= max_key_bytes."""
        n = len(key)
        if n == 0:
            raise InvalidArgumentError(f"{what} is empty: keys must be 1 to {self.max_key_bytes} bytes")
        if n > self.max_key_bytes:
            raise InvalidArgumentError(
                f"{what} is {n} bytes, over the key limit of {self.max_key_bytes} bytes")

    def check_value(self, value: bytes) -> None:
        """Raise InvalidArgumentError when len(value) > max_value_bytes."""
        if len(value) > self.max_value_bytes:
            raise InvalidArgumentError(
                f"value is {len(value)} bytes, over the value limit of {self.max_value_bytes} bytes"
                f" {VALUE_LIMIT_SETTING}")

    def check_bound(self, bound: bytes, what: str) -> None:
        """A scan bound may be empty (unbounded) but not longer than a key."""
        if len(bound) > self.max_key_bytes:
            raise InvalidArgumentError(
                f"{what} is {len(bound)} bytes, over the key limit of {self.max_key_bytes} bytes")

    def multi_get_answer_problem(self, response, values_bytes: int) -> str | None:
        """None if ``response`` (a MultiGetResponse whose values add up to ``values_bytes``)
        fits a message, else the refusal's message, in the words the CLI reads as a size
        limit ("values found exceed"; router/cli/exit_codes.py). The values alone may fit
        and their encoding not (a tag and a varint length per value, a ``found`` byte per
        key: review 21b), which gRPC would refuse to send as "Sent message larger than max".
        Cheap unless near the limit: only then is the exact size (``ByteSize``) computed."""
        limit = self.max_message_bytes
        n = len(response.values)
        if values_bytes + _FRAMING_PER_KEY * n + _FRAMING_BASE <= limit:
            return None
        size = response.ByteSize()
        if size <= limit:
            return None
        return (f"the values found exceed the message limit of {limit} bytes once encoded "
                f"({size} bytes for {n} keys); ask for fewer keys at a time")

    def grpc_options(self) -> list[tuple[str, int]]:
        """Channel/server options setting both message limits to ``max_message_bytes``."""
        n = self.max_message_bytes
        return [("grpc.max_receive_message_length", n), ("grpc.max_send_message_length", n)]
