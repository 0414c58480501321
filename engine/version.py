"""An immutable snapshot of which table files make up the DB (docs/format.md, "Manifest",
"Version invariants").

``levels[0]`` holds L0 files newest first (number descending); their key ranges may overlap.
``levels[1..6]`` are each sorted by smallest key with disjoint ranges: ``a.largest < b.smallest``
for neighbours, compared as unsigned bytes. A user key therefore lives in at most one file per
level L1+, and compaction must not split one user key's entries across two files of a level.

A Version never changes after construction, so any number of threads may read it without a
lock; :meth:`apply` returns a new one.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

from .errors import CorruptionError, InvalidArgumentError
from .format import NUM_LEVELS
from .version_edit import FileMeta, VersionEdit

__all__ = ["Version", "NUM_LEVELS"]


class Version:
    """The files of each level. Construct with :meth:`empty` and :meth:`apply`.

    >>> v = Version.empty().apply(VersionEdit(new_files=[(1, FileMeta(7, 10, b"a", b"c"))]))
    >>> v.find_file(1, b"b").number, v.find_file(1, b"d")
    (7, None)
    """

    __slots__ = ("levels", "_largest", "_bytes")

    def __init__(self, levels: tuple[tuple[FileMeta, ...], ...]):
        """REQUIRES: ``levels`` already ordered as the module docstring says (``apply`` does
        this); call :meth:`check` to verify."""
        self.levels = levels
        # Per level L1+: the largest keys, for bisect. O(files) once.
        self._largest = tuple([f.largest for f in files] for files in levels)
        self._bytes = tuple(sum(f.size for f in files) for files in levels)

    @classmethod
    def empty(cls) -> "Version":
        return cls(tuple(() for _ in range(NUM_LEVELS)))

    # -- building ------------------------------------------------------------------------
    def apply(self, edit: VersionEdit) -> "Version":
        """A new Version with ``edit``'s deletions, then its additions, applied.

        Raises CorruptionError if the edit deletes a file that is not in the named level, adds
        a number already present, names a bad level, or leaves a level L1+ overlapping.
        O(total files + added * log).
        """
        levels = [list(files) for files in self.levels]
        for level, number in edit.deleted_files:
            files = levels[_edit_level(level)]
            for i, f in enumerate(files):
                if f.number == number:
                    del files[i]
                    break
            else:
                raise CorruptionError(f"edit deletes file {number}, which is not in level {level}")
        present = {f.number for files in levels for f in files}
        for level, meta in edit.new_files:
            if meta.number in present:
                raise CorruptionError(f"edit adds file {meta.number}, which is already live")
            present.add(meta.number)
            levels[_edit_level(level)].append(meta)
        levels[0].sort(key=_by_number_desc)
        for files in levels[1:]:
            files.sort(key=_by_smallest)
        version = Version(tuple(tuple(files) for files in levels))
        version.check()
        return version

    def check(self) -> None:
        """Verify every invariant; raise CorruptionError naming the first violated one.

        O(total files). Cheap enough to run after every apply.
        """
        if len(self.levels) != NUM_LEVELS:
            raise CorruptionError(f"version has {len(self.levels)} levels, not {NUM_LEVELS}")
        seen: set[int] = set()
        for level, files in enumerate(self.levels):
            for f in files:
                if f.number in seen:
                    raise CorruptionError(f"file {f.number} appears twice")
                seen.add(f.number)
                if f.smallest > f.largest:
                    raise CorruptionError(f"file {f.number}: smallest key > largest key")
                if f.smallest_seq > f.largest_seq:
                    raise CorruptionError(f"file {f.number}: smallest_seq > largest_seq")
                if min(f.number, f.size, f.num_entries, f.num_deletions, f.smallest_seq, f.filter_bytes) < 0:
                    raise CorruptionError(f"file {f.number}: a negative count, size or number")
                if type(f.smallest) is not bytes or type(f.largest) is not bytes:
                    raise CorruptionError(f"file {f.number}: keys must be bytes")
            for a, b in zip(files, files[1:]):
                if level == 0:
                    if a.number <= b.number:
                        raise CorruptionError(f"L0 files {a.number}, {b.number} not newest first")
                elif a.largest >= b.smallest:
                    raise CorruptionError(
                        f"L{level} files {a.number} [{a.smallest!r}..{a.largest!r}] and {b.number} "
                        f"[{b.smallest!r}..{b.largest!r}] overlap or are out of order"
                    )

    # -- queries -------------------------------------------------------------------------
    def files_overlapping(self, level: int, lo: bytes | None, hi: bytes | None) -> list[FileMeta]:
        """Files of ``level`` whose range meets ``[lo, hi]`` (inclusive; ``None`` = unbounded),
        in level order (L0: newest first; L1+: by key). O(log n + k) for L1+, O(n) for L0."""
        files = self.levels[_level(level)]
        if level == 0:
            return [
                f for f in files
                if (lo is None or f.largest >= lo) and (hi is None or f.smallest <= hi)
            ]
        i = 0 if lo is None else bisect_left(self._largest[level], lo)
        out = []
        while i < len(files) and (hi is None or files[i].smallest <= hi):
            out.append(files[i])
            i += 1
        return out

    def find_file(self, level: int, key: bytes) -> FileMeta | None:
        """The one file of ``level`` (1..6) whose range holds ``key``, or None. O(log n).

        Raises InvalidArgumentError for level 0 (several L0 files may hold a key; use
        :meth:`files_for_key` or :meth:`files_overlapping`).
        """
        if level == 0:
            raise InvalidArgumentError("find_file needs a level >= 1; L0 ranges overlap")
        files = self.levels[_level(level)]
        i = bisect_left(self._largest[level], key)
        if i < len(files) and files[i].smallest <= key:
            return files[i]
        return None

    def files_for_key(self, key: bytes) -> list[FileMeta]:
        """Every file that may hold ``key``, in the order a read must consult them (newest data
        first): L0 files newest first, then at most one file per level. O(L0 + levels * log n).
        """
        out = [f for f in self.levels[0] if f.smallest <= key <= f.largest]
        largest = self._largest
        for level in range(1, NUM_LEVELS):
            files = self.levels[level]
            if files:
                i = bisect_left(largest[level], key)
                if i < len(files) and files[i].smallest <= key:
                    out.append(files[i])
        return out

    def level_bytes(self, level: int) -> int:
        """Sum of the sizes of ``level``'s files. O(1)."""
        return self._bytes[_level(level)]

    def num_files(self, level: int) -> int:
        return len(self.levels[_level(level)])

    def total_files(self) -> int:
        return sum(len(files) for files in self.levels)

    def all_files(self) -> Iterator[tuple[int, FileMeta]]:
        """``(level, meta)`` for every file, level by level."""
        for level, files in enumerate(self.levels):
            for f in files:
                yield level, f

    def live_numbers(self) -> set[int]:
        """Numbers of every table file this version references."""
        return {f.number for files in self.levels for f in files}

    def snapshot_edit(self) -> VersionEdit:
        """An edit that, applied to an empty Version, rebuilds this one."""
        return VersionEdit(new_files=list(self.all_files()))

    def __eq__(self, other) -> bool:
        return isinstance(other, Version) and self.levels == other.levels

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        counts = ", ".join(f"L{i}:{len(files)}" for i, files in enumerate(self.levels) if files)
        return f"Version({counts or 'empty'})"


def _level(level: int) -> int:
    if not 0 <= level < NUM_LEVELS:
        raise InvalidArgumentError(f"level {level} is not in 0..{NUM_LEVELS - 1}")
    return level


def _edit_level(level: int) -> int:
    if not 0 <= level < NUM_LEVELS:
        raise CorruptionError(f"edit names level {level}, not in 0..{NUM_LEVELS - 1}")
    return level


def _by_number_desc(f: FileMeta) -> int:
    return -f.number


def _by_smallest(f: FileMeta) -> bytes:
    return f.smallest
