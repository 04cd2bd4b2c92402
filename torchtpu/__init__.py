"""torchtpu: a PyTorch device backend named ``tpu``, running on XLA through JAX.

``import torchtpu`` is all the set-up there is; afterwards ``tensor.to("tpu")``
works like ``tensor.to("cuda")``.
"""

import torch

from . import device as _device_module
from .backend import register_device, register_kernels

__version__ = "0.1.0"

register_device(_device_module)
register_kernels()


def _autoload():
    """Entry point for ``torch.backends``: PyTorch imports us at ``import torch``."""
