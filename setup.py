"""Builds the optional compiled speed-ups (engine/speedups.py says what they are).

Everything else about the package is in pyproject.toml. The extension is ``optional``: where
it cannot be compiled (no C compiler or Python headers), the install still succeeds and the
engine runs its Python versions of the same functions.
"""

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # building without the declared build requirements: Python only
    ext_modules = []
else:
    ext_modules = cythonize(
        [Extension("engine._speedups", ["engine/_speedups.pyx"], optional=True)],
        compiler_directives={"language_level": 3},
    )

setup(ext_modules=ext_modules)
