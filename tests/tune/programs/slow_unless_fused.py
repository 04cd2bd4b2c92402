"""Planted problem: a step that pays 0.2 s of host work unless fused eager mode is on.

The sleep stands in for a per-op dispatch cost that fused mode removes; it is
many times the step itself, so the search must find TORCHTPU_DEFER_AND_FUSE=1.
"""

import time

import torch

import torchtpu  # noqa: F401
from torchtpu.tools.tune.search import steps

fused = torch.tpu.get_eager_mode() == torch.tpu.EagerMode.DEFER_AND_FUSE
x = torch.ones(8, device="tpu")
for _ in steps(3):
    x = x * 0.5 + 1.0
    if not fused:
        time.sleep(0.2)
