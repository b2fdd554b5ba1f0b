"""``python -m rwfs.cli``: the ``rwfs`` command."""

import sys

from .commands import main

sys.exit(main())
