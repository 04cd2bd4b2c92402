import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402

import torchtpu  # noqa: E402,F401
