"""``python -m router.cli``: the same as the ``sievekv`` console script."""

import sys

from .app import main

sys.exit(main())
