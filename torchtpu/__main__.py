"""``python -m torchtpu``: the same as the ``torchtpu`` command."""

import sys

from .tools.cli import main

sys.exit(main())
