"""``python -m shard``: see :mod:`shard.worker`."""

import sys

from .worker import main

if __name__ == "__main__":
    sys.exit(main())
