"""``python -m torchtpu``: the same as the ``torchtpu`` command."""

import sys

from .cli import main

sys.exit(main())
