"""What one manifest record changes: :class:`FileMeta` and :class:`VersionEdit`
(docs/format.md, "Manifest", "Version edit").

Like LevelDB's ``version_edit.cc``: an edit is a list of tagged fields, each optional, so a new
field is a new tag and old files stay readable; a tag this code does not know is corruption
(the file comes from a newer format, and skipping it could hide a change to the file set).
Pure data and pure functions: thread safe as long as an edit is not mutated concurrently.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import CorruptionError, InvalidArgumentError
from .format import (
    EDIT_FLOAT,
    EDIT_TAG_COMPACT_POINTER,
    EDIT_TAG_COMPARATOR,
    EDIT_TAG_DELETED_FILE,
    EDIT_TAG_LAST_SEQUENCE,
    EDIT_TAG_LOG_NUMBER,
    EDIT_TAG_NEW_FILE,
    EDIT_TAG_NEXT_FILE_NUMBER,
    NUM_LEVELS,
)

_U64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class FileMeta:
    """One table file as the manifest records it. Keys are user keys, inclusive bounds."""

    number: int
    size: int
    smallest: bytes
    largest: bytes
    num_entries: int = 0
    num_deletions: int = 0
    smallest_seq: int = 0
    largest_seq: int = 0
    filter_bits_per_key: float = 0.0  # for reports: the filter budget this table got
    filter_bytes: int = 0  # for reports: bytes of filter partitions in this table


@dataclass
class VersionEdit:
    """A change to the DB state. Fields left ``None`` / empty are not recorded.

    ``new_files`` and ``deleted_files`` hold ``(level, FileMeta)`` and ``(level, number)``;
    deletions apply before additions (so a file may move between levels in one edit).
    """

    comparator: str | None = None
    log_number: int | None = None
    next_file_number: int | None = None
    last_sequence: int | None = None
    compact_pointers: list[tuple[int, bytes]] = field(default_factory=list)
    deleted_files: list[tuple[int, int]] = field(default_factory=list)
    new_files: list[tuple[int, FileMeta]] = field(default_factory=list)

    def add_file(self, level: int, meta: FileMeta) -> None:
        self.new_files.append((level, meta))

    def delete_file(self, level: int, number: int) -> None:
        self.deleted_files.append((level, number))

    def set_compact_pointer(self, level: int, key: bytes) -> None:
        self.compact_pointers.append((level, key))

    # -- encoding ------------------------------------------------------------------------
    def encode(self) -> bytes:
        """The record payload. O(size of the edit).

        Raises InvalidArgumentError for a number outside 0..2^64-1, TypeError for a key or
        comparator of the wrong type."""
        out = bytearray()
        if self.comparator is not None:
            _put_varint(out, EDIT_TAG_COMPARATOR)
            _put_bytes(out, self.comparator.encode())
        for tag, value in (
            (EDIT_TAG_LOG_NUMBER, self.log_number),
            (EDIT_TAG_NEXT_FILE_NUMBER, self.next_file_number),
            (EDIT_TAG_LAST_SEQUENCE, self.last_sequence),
        ):
            if value is not None:
                _put_varint(out, tag)
                _put_varint(out, value)
        for level, key in self.compact_pointers:
            _put_varint(out, EDIT_TAG_COMPACT_POINTER)
            _put_varint(out, level)
            _put_bytes(out, key)
        for level, number in self.deleted_files:
            _put_varint(out, EDIT_TAG_DELETED_FILE)
            _put_varint(out, level)
            _put_varint(out, number)
        for level, f in self.new_files:
            _put_varint(out, EDIT_TAG_NEW_FILE)
            _put_varint(out, level)
            _put_varint(out, f.number)
            _put_varint(out, f.size)
            _put_bytes(out, f.smallest)
            _put_bytes(out, f.largest)
            _put_varint(out, f.num_entries)
            _put_varint(out, f.num_deletions)
            _put_varint(out, f.smallest_seq)
            _put_varint(out, f.largest_seq)
            out += EDIT_FLOAT.pack(f.filter_bits_per_key)
            _put_varint(out, f.filter_bytes)
        return bytes(out)

    @classmethod
    def decode(cls, data: bytes, *, path: str | None = None, offset: int | None = None) -> "VersionEdit":
        """Inverse of :meth:`encode`. Raises CorruptionError (naming ``path``/``offset``) for
        an unknown tag, a truncated field or a level outside 0..NUM_LEVELS-1."""
        r = _Reader(bytes(data), path, offset)
        edit = cls()
        while not r.done():
            tag = r.varint()
            if tag == EDIT_TAG_COMPARATOR:
                try:
                    edit.comparator = r.bytes().decode()
                except UnicodeDecodeError:
                    r.fail("comparator name is not UTF-8")
            elif tag == EDIT_TAG_LOG_NUMBER:
                edit.log_number = r.varint()
            elif tag == EDIT_TAG_NEXT_FILE_NUMBER:
                edit.next_file_number = r.varint()
            elif tag == EDIT_TAG_LAST_SEQUENCE:
                edit.last_sequence = r.varint()
            elif tag == EDIT_TAG_COMPACT_POINTER:
                edit.compact_pointers.append((r.level(), r.bytes()))
            elif tag == EDIT_TAG_DELETED_FILE:
                edit.deleted_files.append((r.level(), r.varint()))
            elif tag == EDIT_TAG_NEW_FILE:
                level = r.level()
                meta = FileMeta(
                    number=r.varint(),
                    size=r.varint(),
                    smallest=r.bytes(),
                    largest=r.bytes(),
                    num_entries=r.varint(),
                    num_deletions=r.varint(),
                    smallest_seq=r.varint(),
                    largest_seq=r.varint(),
                    filter_bits_per_key=r.float(),
                    filter_bytes=r.varint(),
                )
                edit.new_files.append((level, meta))
            else:
                r.fail(f"unknown version edit tag {tag}")
        return edit


def _put_varint(out: bytearray, value: int) -> None:
    if value < 0 or value > _U64:
        raise InvalidArgumentError(f"{value} does not fit an unsigned 64-bit varint")
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _put_bytes(out: bytearray, value: bytes) -> None:
    _put_varint(out, len(value))
    out += value


class _Reader:
    __slots__ = ("data", "pos", "path", "offset")

    def __init__(self, data: bytes, path, offset):
        self.data = data
        self.pos = 0
        self.path = path
        self.offset = offset

    def fail(self, message: str):
        raise CorruptionError(f"version edit: {message} (at byte {self.pos} of the edit)",
                              path=self.path, offset=self.offset)

    def done(self) -> bool:
        return self.pos >= len(self.data)

    def varint(self) -> int:
        data, pos, result, shift = self.data, self.pos, 0, 0
        while True:
            if pos >= len(data):
                self.fail("truncated varint")
            b = data[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
            if shift > 63:
                self.fail("varint longer than 10 bytes")
        if result > _U64:
            self.fail("varint over 64 bits")
        self.pos = pos
        return result

    def bytes(self) -> bytes:
        n = self.varint()
        end = self.pos + n
        if end > len(self.data):
            self.fail("string past the end")
        value = self.data[self.pos:end]
        self.pos = end
        return value

    def float(self) -> float:
        end = self.pos + EDIT_FLOAT.size
        if end > len(self.data):
            self.fail("float past the end")
        (value,) = EDIT_FLOAT.unpack_from(self.data, self.pos)
        self.pos = end
        return value

    def level(self) -> int:
        level = self.varint()
        if level >= NUM_LEVELS:
            self.fail(f"level {level} is not below {NUM_LEVELS}")
        return level
