"""``python -m polydist.bench [ARGS]``: the same as ``polydist bench [ARGS]``."""

import sys

from polydist.bench.cli import main  # the importable module, so that spawn can pickle its functions

sys.exit(main())
