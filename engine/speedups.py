"""Optional compiled versions of the point read's hottest steps.

``engine/_speedups.pyx`` (Cython) holds C versions of ``find_hashed`` (a data block's hash
index lookup, engine/sstable/block.py) and of the blocked Bloom filter probe
(engine/filters/blocked_bloom.py): ~40% of a present-key get's CPU time in Python
(bench/get_parts.py; bench/results/db.md "Session 22"). They are leaves: pure functions of
bytes, with no lock, no state and no I/O, so the rest of the engine stays Python and does not
know which version runs. Each has the same contract, answers and errors as its Python
reference, which stays in the tree as the spec in code (one exception, engine/_speedups.pyx
says which); tests/test_speedups.py and tests/test_review_session22.py compare the two on
random, damaged and malformed inputs.

A third, ``read_verified``, does the common case of Table.get's checked read of a block
verified before (copy, checksum, lookup, decode: engine/sstable/reader.py) in one call and
hands every other case back to Table.get's Python path, so that path stays the reference;
tests/test_speedups.py compares Table.get with and without it, damaged tables included.

:data:`native` is the compiled module, or None when the engine runs its Python versions:
``pip install`` builds it where a C compiler and the Python headers are present (setup.py; a
failed build leaves it out, it does not fail the install); ``SIEVEKV_PURE_PYTHON=1`` in the
environment turns it off; and a build of other source (the ``.pyx`` edited or checked out
since it was built, or another checkout's build) is not used, with a logged warning.
``DB.stats()`` reports which runs (``native_speedups``).
"""

from __future__ import annotations

import logging
import os

PURE_PYTHON_ENV = "SIEVEKV_PURE_PYTHON"

_log = logging.getLogger(__name__)


def pure_python_requested(environ=os.environ) -> bool:
    """True if ``environ`` turns the compiled module off: SIEVEKV_PURE_PYTHON set to 1,
    true, yes or on (any case); any other value, or none, leaves it on."""
    return environ.get(PURE_PYTHON_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def is_stale(source: str, module) -> bool:
    """True if ``source`` (the .pyx beside the package) is not what ``module`` was compiled
    from (its ``SOURCE_SHA256``, setup.py); False when there is no source beside it (an
    installed wheel) or the build did not record one."""
    import hashlib

    built = getattr(module, "SOURCE_SHA256", "")
    try:
        with open(source, "rb") as f:
            return bool(built) and hashlib.sha256(f.read()).hexdigest() != built
    except OSError:
        return False


def _load():
    if pure_python_requested():
        return None
    try:
        from . import _speedups
    except ImportError:
        return None
    here = os.path.dirname(os.path.abspath(__file__))
    if os.path.dirname(os.path.abspath(_speedups.__file__)) != here:
        # Another tree's build (an editable install of another checkout can supply it to a
        # checkout that was never built): not this source's, and not what the table workers'
        # fingerprint covers.
        _log.warning("%s is not in %s: the engine runs its Python versions; build this tree "
                     "with `python3 -m pip install -e .`", _speedups.__file__, here)
        return None
    source = os.path.join(here, "_speedups.pyx")
    if is_stale(source, _speedups):
        _log.warning("%s was built from another version of %s: the engine runs its Python "
                     "versions; rebuild with `python3 -m pip install -e .`", _speedups.__file__,
                     source)
        return None
    return _speedups


native = _load()
"""The compiled module, or None (module docstring)."""
