"""torchtpu: a PyTorch device backend named ``tpu``, running on XLA through JAX.

``import torchtpu`` is all the set-up there is; afterwards ``tensor.to("tpu")``
works like ``tensor.to("cuda")``.  Importing registers the backend and does
nothing else: no device is opened and no program compiled until the first
tpu tensor exists.  The layers, from the bottom up, are described in
docs/architecture.md.
"""


def _autoload():
    """Entry point for ``torch.backends``: PyTorch imports us at ``import torch``.

    Defined before ``import torch`` because, when the user imports torchtpu
    first, that import runs the autoload while this module is half made.
    """


import torch  # noqa: E402

# The name must exist before any module of ours builds a torch.device("tpu").
torch.utils.rename_privateuse1_backend("tpu")

from . import api as _api  # noqa: E402
from . import config  # noqa: E402,F401  (torchtpu.config: the settings)
from .runtime import device as _device  # noqa: E402

_device.share_host_cores()  # before anything starts XLA's thread pool
_device.reuse_host_memory()  # before XLA's threads make malloc arenas of their own
from .dispatch import patches as _patches  # noqa: E402
from .dispatch import registration as _registration  # noqa: E402
from . import distributed as _distributed  # noqa: E402
from .eager import modes as _modes  # noqa: E402
from .runtime import compile_cache as _compile_cache  # noqa: E402

__version__ = "0.1.0"

_registration.register_device(_api.build_module())  # torch.tpu
_registration.register_kernels()
_patches.install()  # Module.to, torch.accelerator's memory functions, storage serialization
_modes.install()  # the eager mode the settings ask for
_compile_cache.install()  # the disk cache, if the settings name one
_distributed.register()  # the c10d backend "tpu" (no JAX work until a group is made)


def __getattr__(name):
    if name == "tune":  # torchtpu.tune: the performance tuner, loaded on first use (torchtpu/tools/tune)
        from .tools import tune

        return tune
    raise AttributeError(f"module 'torchtpu' has no attribute {name!r}")
