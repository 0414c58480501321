"""The benchmark-only dependencies (pyproject.toml's ``bench`` extra): check them up front.

A benchmark that compares against RocksDB or LevelDB imports rocksdict or plyvel somewhere
deep (a child process, a server started for it); on a machine without the extra that used to
end in a traceback or in "rocks0 did not start". :func:`require` says what is missing and how
to install it in one line, exit code 2, before anything starts.
"""

from __future__ import annotations

import importlib.util
import sys

INSTALL = "pip install -e '.[bench]'"


def missing(modules) -> list[str]:
    """The names in ``modules`` that cannot be imported here."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def require(modules, script: str) -> None:
    """Exit 2 with one line on stderr unless every module in ``modules`` can be imported."""
    gone = missing(modules)
    if gone:
        print(f"{script}: needs {', '.join(gone)} (the benchmark extras): {INSTALL}",
              file=sys.stderr)
        sys.exit(2)
