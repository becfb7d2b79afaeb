"""``python -m polydist``: the same as the ``polydist`` command."""

import sys

from .cli import main

sys.exit(main())
