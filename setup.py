"""Builds the optional compiled speed-ups (engine/speedups.py says what they are).

Everything else about the package is in pyproject.toml. The extension is ``optional``: where
it cannot be compiled (no C compiler or Python headers), the install still succeeds and the
engine runs its Python versions of the same functions. The module is compiled with the
SHA-256 of its .pyx (``SOURCE_SHA256``), so engine/speedups.py can tell a build of other source.
"""

import hashlib
import os

from setuptools import Extension, setup

PYX = os.path.join("engine", "_speedups.pyx")
C = os.path.join("engine", "_speedups.c")


def _extension(source: str, sha: str) -> Extension:
    return Extension("engine._speedups", [source], optional=True,
                     define_macros=[("SIEVEKV_SPEEDUPS_SOURCE", f'"{sha}"')])


ext_modules = []
if os.path.exists(PYX):
    with open(PYX, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    try:
        from Cython.Build import cythonize
    except ImportError:  # built without the declared build requirements: Python only
        pass
    else:
        ext_modules = cythonize([_extension(PYX, sha)],
                                compiler_directives={"language_level": 3})
elif os.path.exists(C):  # a source tree shipped with the generated C only
    ext_modules = [_extension(C, "")]

setup(ext_modules=ext_modules)
