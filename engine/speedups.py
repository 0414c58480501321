"""Optional compiled versions of the point read's two hottest leaf functions.

``engine/_speedups.pyx`` (Cython) holds C versions of ``find_hashed`` (a data block's hash
index lookup, engine/sstable/block.py) and of the blocked Bloom filter probe
(engine/filters/blocked_bloom.py). They were ~40% of a present-key get's CPU time in Python
(bench/get_parts.py; bench/results/db.md "Session 22"), and they are leaves: pure functions of
bytes, with no lock, no state and no I/O, so the rest of the engine stays Python and does not
know which version runs.

Each has the same contract, answers and errors as its Python reference, which stays in the
tree as the spec in code; tests/test_speedups.py compares the two on random, damaged and
malformed inputs.

:data:`native` is the compiled module, or None when the engine runs its Python versions:
``pip install`` builds it where a C compiler and the Python headers are present (setup.py; a
failed build leaves it out, it does not fail the install); ``SIEVEKV_PURE_PYTHON=1`` in the
environment turns it off; and a build older than its source (``.pyx`` edited, not rebuilt) is
not used, with a warning. ``DB.stats()`` reports which runs (``native_speedups``).
"""

from __future__ import annotations

import os
import warnings

PURE_PYTHON_ENV = "SIEVEKV_PURE_PYTHON"


def is_stale(source: str, built: str) -> bool:
    """True if the file ``source`` was changed after ``built`` was made from it; False when
    there is no source beside it (an installed wheel)."""
    try:
        return os.stat(source).st_mtime > os.stat(built).st_mtime
    except OSError:
        return False


def _load():
    if os.environ.get(PURE_PYTHON_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        return None
    try:
        from . import _speedups
    except ImportError:
        return None
    source = os.path.join(os.path.dirname(__file__), "_speedups.pyx")
    if is_stale(source, _speedups.__file__):
        warnings.warn(f"{_speedups.__file__} is older than {source}: using the Python "
                      "versions; rebuild with `python3 -m pip install -e .`", RuntimeWarning,
                      stacklevel=2)
        return None
    return _speedups


native = _load()
"""The compiled module, or None (module docstring)."""
