"""torchtpu: a PyTorch device backend named ``tpu``, running on XLA through JAX.

``import torchtpu`` is all the set-up there is; afterwards ``tensor.to("tpu")``
works like ``tensor.to("cuda")``.
"""



def _autoload():
    """Entry point for ``torch.backends``: PyTorch imports us at ``import torch``.

    Defined before ``import torch`` because, when the user imports torchtpu
    first, that import runs the autoload while this module is half made.
    """


import torch  # noqa: E402

# The name must exist before any module of ours builds a torch.device("tpu").
torch.utils.rename_privateuse1_backend("tpu")

from . import device as _device_module  # noqa: E402
from . import modules as _modules  # noqa: E402
from .backend import register_device, register_kernels  # noqa: E402

__version__ = "0.1.0"

register_device(_device_module)
register_kernels()
_modules.install()
from . import accelerator as _accelerator  # noqa: E402

_accelerator.install()  # torch.accelerator's memory functions, for device-generic libraries
from . import serialization as _serialization  # noqa: E402,F401  (torch.load/deepcopy of tpu storages)
from .runtime import compile_cache as _compile_cache  # noqa: E402

_compile_cache.configure_from_env()  # TORCHTPU_CACHE_DIR: compiled programs kept on disk
from . import pallas as _pallas  # noqa: E402

_device_module.pallas = _pallas  # torch.tpu.pallas.jax_op / custom_jax_kernel
from .bucketing import bucket_size as _bucket_size  # noqa: E402
from .bucketing import pad_to_bucket as _pad_to_bucket  # noqa: E402

_device_module.bucket_size, _device_module.pad_to_bucket = _bucket_size, _pad_to_bucket
