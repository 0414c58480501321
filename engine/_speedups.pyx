# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled versions of the two hottest leaf functions of a point read (engine/speedups.py
says how they are chosen, and why these two).

- :func:`find_hashed`: engine/sstable/block.py ``find_hashed``, the block hash-index lookup.
- :func:`blocked_may_match`: engine/filters/blocked_bloom.py ``probe_reference``, the blocked
  Bloom probe of docs/format.md "Filter encodings", "Blocked Bloom", for any k.
- :func:`read_verified`: the common case of Table.get's checked read of a block verified
  before (copy, CRC-32C against the known checksum, lookup, entry decode) in one call; it
  answers only when the Python path would answer the same and hands every other case back
  (:data:`SLOW`) to that path.

Each returns what its Python reference returns and raises what it raises, on any input:
well-formed or damaged blocks and filters, closed mappings, released views, odd bounds; what
it does not read in C (other buffer types or shapes, non-int bounds) it hands to the reference
(tests/test_speedups.py and tests/test_review_session22.py compare them). One exception: the
probe raises TypeError for a key that is not bytes-like, as the specialised Python probes it
replaced did, where the reference answers True. Both keep MurmurHash3
in mmh3: they call it, they do not reimplement it.

Buffers: each call takes a simple buffer of its argument (bytes, mmap, memoryview) and
releases it before returning. No Python code runs while it is held (the hashes are computed
before it is taken), so no other thread can run in between and a concurrent mmap.close()
never finds an export. Every read is checked against the buffer's length or the block's
bounds below, as the Python versions' slicing and struct errors check them.
"""

from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_FORMAT, PyBUF_ND, PyBUF_SIMPLE
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.string cimport memcmp, memcpy

import mmap

import google_crc32c
import mmh3

from .errors import CorruptionError
from . import format as _format

cdef object _uhash32 = mmh3.mmh3_32_uintdigest  # the block hash index's slot hash
cdef object _digest = mmh3.mmh3_x64_128_digest  # the filters' digest (engine/filters/hashing.py)
cdef object _crc_value = google_crc32c.value  # the blocks' checksum (engine/sstable/reader.py)

# docs/format.md "Data blocks" (the hash index) and "Filter encodings"; engine/format.py.
cdef long long HASH_FLAG = _format.BLOCK_HASH_FLAG
cdef object HASH_SEED = _format.BLOCK_HASH_SEED
cdef Py_ssize_t LINE_BYTES = _format.LINE_BYTES
cdef int LINE_SHIFT = _format.LINE_SHIFT
cdef unsigned int LINE_MASK = _format.LINE_BITS - 1
cdef unsigned int LAST_LINE_BITS = _format.LAST_LINE_BITS
cdef int MAX_PROBES = _format.BLOCKED_MAX_PROBES
cdef int MARKER_BLOCKED = _format.MARKER_BLOCKED
cdef int LENGTH_CHECK_MOD = _format.LENGTH_CHECK_MOD
cdef int TRAILER_SIZE = _format.TRAILER_SIZE
cdef int TRAILER_PROBES = _format.TRAILER_PROBES
cdef int TRAILER_MARKER = _format.TRAILER_MARKER
cdef int WORDS_FIRST = _format.WORDS_FIRST_DIGEST
cdef int WORDS_PER = _format.WORDS_PER_DIGEST
cdef int KIND_VALUE = _format.KIND_VALUE
cdef int KIND_DELETE = _format.KIND_DELETE

# Larger than any buffer: a varint at least this large compares and bounds-checks as the
# Python int would (no sum below overflows a 64-bit signed integer).
cdef long long HUGE = 1LL << 60

cdef object _fallback_find_hashed = None
cdef object _fallback_probe = None

# The buffer types read in C: their items are bytes, indexed and sliced as bytes are (a
# memoryview only when 1-D with items "B", checked per call). Any other type (array.array, a
# numpy array: their slices compare and compute differently) is the reference's.
cdef tuple _FAST_TYPES = (bytes, memoryview, mmap.mmap, bytearray)

cdef extern from *:
    """
    #ifndef SIEVEKV_SPEEDUPS_SOURCE
    #define SIEVEKV_SPEEDUPS_SOURCE ""
    #endif
    """
    const char* SIEVEKV_SPEEDUPS_SOURCE

SOURCE_SHA256 = (<bytes>SIEVEKV_SPEEDUPS_SOURCE).decode()
"""SHA-256 (hex) of the .pyx this module was compiled from, as setup.py passed it ("" if
built without it): engine/speedups.py does not use a build of another source."""

if LINE_BYTES != 64 or TRAILER_SIZE != 4 or MAX_PROBES > 64:
    raise ImportError("engine._speedups: format constants changed; rebuild and review it")


def register(find_hashed=None, probe_reference=None):
    """Give the Python reference of a function here (engine/sstable/block.py and
    engine/filters/blocked_bloom.py do, on import): it answers arguments outside the fast
    path's contract (a key that is not bytes, bounds outside the buffer, a buffer whose items
    are not bytes), so every answer is the reference's."""
    global _fallback_find_hashed, _fallback_probe
    if find_hashed is not None:
        _fallback_find_hashed = find_hashed
    if probe_reference is not None:
        _fallback_probe = probe_reference


cdef object _find_hashed_py():
    if _fallback_find_hashed is None:  # called before engine/sstable/block.py registered
        from .sstable import block  # noqa: F401 (it registers on import)
    return _fallback_find_hashed


cdef object _probe_py():
    if _fallback_probe is None:
        from .filters import blocked_bloom  # noqa: F401 (it registers on import)
    return _fallback_probe


cdef inline bint _not_bytes(Py_buffer* view) noexcept:
    """The buffer is not a flat run of unsigned bytes (a memoryview cast to another format or
    shape): indexing it in Python reads other values, so the reference answers."""
    return view.ndim != 1 or view.itemsize != 1 or (
        view.format != NULL and (view.format[0] != b'B' or view.format[1] != 0))


cdef inline unsigned int _u32(const unsigned char* b, Py_ssize_t p) noexcept:
    return b[p] | (b[p + 1] << 8) | (b[p + 2] << 16) | (<unsigned int>b[p + 3] << 24)


cdef inline Py_ssize_t _varint(const unsigned char* b, Py_ssize_t* pos, Py_ssize_t limit,
                               long long* out) noexcept:
    """engine/sstable/coding.py get_varint: 0, or -1 where it raises ValueError. A value of
    HUGE or more is stored as HUGE (see HUGE)."""
    cdef Py_ssize_t p = pos[0]
    cdef unsigned long long result = 0
    cdef int shift = 0
    cdef bint huge = False
    cdef unsigned char c
    while p < limit and shift <= 63:
        c = b[p]
        p += 1
        if shift < 56:
            result |= (<unsigned long long>(c & 0x7F)) << shift
        elif c & 0x7F:
            huge = True
        if c < 0x80:
            pos[0] = p
            out[0] = HUGE if huge or result >= <unsigned long long>HUGE else <long long>result
            return 0
        shift += 7
    return -1


def find_hashed(buf, start_, end_, target, path=None, offset=None):
    """engine/sstable/block.py ``find_hashed``: same contract, same answers, same errors."""
    if (type(target) is not bytes or type(start_) is not int or type(end_) is not int
            or type(buf) not in _FAST_TYPES or not 0 <= start_ <= end_ < HUGE or end_ < 6):
        return _find_hashed_py()(buf, start_, end_, target, path, offset)
    cdef Py_ssize_t start = start_, end = end_
    cdef unsigned long long h = _uhash32(target, HASH_SEED)
    cdef Py_buffer view
    try:
        PyObject_GetBuffer(buf, &view, PyBUF_FORMAT | PyBUF_ND)
    except ValueError:  # a closed mapping: as indexing it raises in the Python version
        raise CorruptionError("block: bad hash index or entry", path=path,
                              offset=offset) from None
    except (TypeError, BufferError):
        return _find_hashed_py()(buf, start, end, target, path, offset)
    cdef const unsigned char* b = <const unsigned char*>view.buf
    cdef Py_ssize_t n = view.len
    cdef long long vs = 0, ve = 0
    cdef int status
    if end > n or _not_bytes(&view):
        PyBuffer_Release(&view)
        return _find_hashed_py()(buf, start, end, target, path, offset)
    status = _find_core(<const unsigned char*>view.buf, n, start, end, h, target, &vs, &ve)
    PyBuffer_Release(&view)
    if status < 0:
        raise CorruptionError("block: bad hash index or entry", path=path, offset=offset)
    if status:
        return vs, ve
    return None


cdef int _find_core(const unsigned char* b, Py_ssize_t n, Py_ssize_t start, Py_ssize_t end,
                    unsigned long long h, bytes target, long long* vs,
                    long long* ve) noexcept:
    """find_hashed's lookup in ``b[start:end]`` (``n`` bytes readable at ``b``; REQUIRES
    6 <= end <= n, 0 <= start, the slot hash ``h`` of ``target``): 1 and the value's bounds
    in ``vs``/``ve``, 0 if absent, -1 where the Python version raises CorruptionError."""
    cdef const unsigned char* t = target
    cdef Py_ssize_t tl = len(target)
    cdef long long nb, num, hs, limit, s, first, r, kl, vl, shared, kend, got
    cdef Py_ssize_t p
    nb = b[end - 6] | (b[end - 5] << 8)
    num = <long long>_u32(b, end - 4) - HASH_FLAG
    hs = end - 6 - nb
    limit = hs - 4 * num
    if num < 1 or nb <= num or limit <= start:
        return -1
    s = first = <long long>(h % <unsigned long long>nb)
    r = b[hs + s]
    while r:
        if r > num:
            return -1
        p = start + _u32(b, limit + 4 * r - 4)
        if p >= limit:
            return -1
        kl = b[p + 1]
        vl = b[p + 2]
        if (b[p] | kl | vl) < 0x80:
            if b[p]:
                return -1
            p += 3
        else:
            if (_varint(b, &p, limit, &shared) or _varint(b, &p, limit, &kl) or
                    _varint(b, &p, limit, &vl) or shared):
                return -1
        kend = p + kl
        got = (kend if kend < n else n) - p  # buf[p:kend] stops at the buffer's end
        if got == tl and memcmp(b + p, t, tl) == 0:
            if kend + vl > limit:
                return -1
            vs[0] = kend
            ve[0] = kend + vl
            return 1
        s += 1
        if s == nb:
            s = 0
        if s == first:
            return -1  # every slot full: not what a writer makes
        r = b[hs + s]
    return 0


SLOW = object()
"""What :func:`read_verified` returns when it cannot answer alone (module docstring)."""


def read_verified(m, Py_ssize_t off, Py_ssize_t end, key, long long known_crc):
    """engine/sstable/reader.py Table.get's checked read of a hash-indexed data block that
    an earlier read verified, for the common case only: copies the block's contents and type
    byte (``m[off:end + 1]``, ``m`` the table's mapping), and if their CRC-32C is
    ``known_crc`` (the checksum that verification found) looks ``key`` up in the copy.
    Returns ``(seq, kind, value)``, or None if the block does not hold the key: exactly
    what Table.get's Python path returns then. Anything else returns :data:`SLOW` and
    Table.get runs its Python path, which answers it as before: a block not verified yet
    (``known_crc`` -1) or whose bytes changed since, one without a hash index, a mapping
    that is closed or shorter, any entry or index the lookup finds malformed. The copy is
    made with no Python code running, and the checksum (google-crc32c, which may release
    the GIL) is computed on the copy, never on the mapping."""
    if type(key) is not bytes or type(m) is not mmap.mmap or known_crc < 0 or off < 0 \
            or end - off < 6:
        return SLOW
    cdef Py_buffer view
    try:
        PyObject_GetBuffer(m, &view, PyBUF_SIMPLE)
    except Exception:  # closed: the Python path says so
        return SLOW
    # The restart count's top byte flags a hash index: without one, hand back before copying
    # (the Python path copies and checks the block itself; no work is done twice).
    if end >= view.len or not (<const unsigned char*>view.buf)[end - 1] & (HASH_FLAG >> 24):
        PyBuffer_Release(&view)
        return SLOW
    data = PyBytes_FromStringAndSize(<const char*>view.buf + off, end + 1 - off)
    PyBuffer_Release(&view)
    if _crc_value(data) != known_crc:
        return SLOW
    cdef unsigned long long h = _uhash32(key, HASH_SEED)
    cdef const unsigned char* b = data
    cdef Py_ssize_t n = end - off  # the contents, before the type byte
    cdef long long vs = 0, ve = 0
    cdef unsigned long long tag
    cdef int kind
    if not b[n - 1] & (HASH_FLAG >> 24):  # (the checked copy: the same byte)
        return SLOW
    cdef int status = _find_core(b, n + 1, 0, n, h, key, &vs, &ve)
    if status == 0:
        return None
    if status < 0:  # malformed: the Python path raises the CorruptionError
        return SLOW
    if ve - vs < 8:
        return SLOW
    tag = (<unsigned long long>_u32(b, vs)) | (<unsigned long long>_u32(b, vs + 4)) << 32
    kind = tag & 0xFF
    if kind != KIND_VALUE and kind != KIND_DELETE:
        return SLOW
    return tag >> 8, kind, PyBytes_FromStringAndSize(<const char*>b + vs + 8, ve - vs - 8)


def blocked_may_match(data, key):
    """engine/filters/blocked_bloom.py ``probe_reference``: the blocked Bloom filter's answer
    for ``key`` (bytes) on the filter ``data``, whatever its k; True for a malformed filter
    or one that cannot be read (a released view), never a false "absent".

    Stops at the first unset bit: any distinct candidate is one of the key's k probes, so
    the answer is the reference's, which tests all k. One difference, kept from the
    specialised Python probes it replaces: a key that is not bytes-like raises TypeError
    (the reference answers True); the engine's keys are always bytes."""
    if type(data) not in _FAST_TYPES:
        return _probe_py()(data, key)
    cdef bytes d = _digest(key)
    cdef const unsigned char* db = d
    cdef Py_buffer view
    try:
        PyObject_GetBuffer(data, &view, PyBUF_FORMAT | PyBUF_ND)
    except ValueError:  # a released view or closed mapping: the reference's except answers
        return True
    except Exception:  # not a contiguous buffer of bytes (or none): the reference answers
        return _probe_py()(data, key)
    cdef const unsigned char* b = <const unsigned char*>view.buf
    cdef Py_ssize_t n = view.len
    cdef unsigned char line_bytes[64]
    cdef unsigned long long num_lines, line
    cdef int k, length_check
    cdef bint last
    if _not_bytes(&view):
        PyBuffer_Release(&view)
        return _probe_py()(data, key)
    if n < LINE_BYTES or n % LINE_BYTES:
        PyBuffer_Release(&view)
        return True
    k = b[n - TRAILER_SIZE + TRAILER_PROBES]
    length_check = b[n - TRAILER_SIZE + 1] | (b[n - TRAILER_SIZE + 2] << 8)
    num_lines = <unsigned long long>(n >> LINE_SHIFT)
    if (b[n - TRAILER_SIZE + TRAILER_MARKER] != MARKER_BLOCKED
            or length_check != <int>(num_lines % LENGTH_CHECK_MOD)
            or not 1 <= k <= MAX_PROBES):
        PyBuffer_Release(&view)
        return True
    if num_lines >> 32:  # 256 GiB or more: never written; u32 * lines would overflow here
        PyBuffer_Release(&view)
        return _probe_py()(data, key)
    line = <unsigned long long>_u32(db, 0) * num_lines >> 32
    memcpy(line_bytes, b + (line << LINE_SHIFT), LINE_BYTES)
    PyBuffer_Release(&view)
    last = line == num_lines - 1
    cdef unsigned int chosen[64]
    cdef int count = 0, i, j, words = WORDS_FIRST, at = 4
    cdef unsigned int w, pos
    cdef int seed = 0
    while True:
        for i in range(words):
            w = db[at + 2 * i] | (db[at + 2 * i + 1] << 8)
            pos = w % LAST_LINE_BITS if last else w & LINE_MASK
            for j in range(count):
                if chosen[j] == pos:
                    break
            else:
                if not (line_bytes[pos >> 3] >> (pos & 7)) & 1:
                    return False
                chosen[count] = pos
                count += 1
                if count == k:
                    return True
        seed += 1
        d = _digest(key, seed)
        db = d
        words = WORDS_PER
        at = 0
