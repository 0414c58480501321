"""``python -m router``: see :mod:`router.worker`."""

import sys

from .worker import main

if __name__ == "__main__":
    sys.exit(main())
