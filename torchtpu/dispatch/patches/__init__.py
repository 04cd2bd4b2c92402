"""PyTorch functions a Python backend has to replace, each only for tpu and each undone for nothing else.

- ``module_to``: ``Module.to("tpu")`` keeps Parameter identity (tied weights stay tied).
- ``accelerator``: ``torch.accelerator``'s memory functions answer for tpu.
- ``serialization``: ``torch.load``, ``copy.deepcopy`` and ``pickle`` of tpu storages.
- ``flex_attention``: flex attention accepts tpu inputs (its device check lists the devices it knew).
- ``default_compiler``: ``torch.compile(model)`` (inductor, the default) compiles tpu graphs with ``backend="tpu"``.
- ``torchvision_ops``: ``import torchvision`` works when PyPI's CUDA torchvision sits beside a CPU torch.
- ``transformer_encoder``: ``nn.TransformerEncoder``'s padded-batch fast path runs dense on tpu (no nested tensors).
- ``torchtitan_kernels``: TorchTitan's one Triton kernel (expert parallelism's token regrouping) and its
  experts loop (grouped products instead: fixed shapes) on tpu.
"""

from . import (accelerator, default_compiler, flex_attention, module_to, serialization, torchtitan_kernels,
               torchvision_ops, transformer_encoder)


def install() -> None:
    module_to.install()
    accelerator.install()
    serialization.install()
    default_compiler.install()
    flex_attention.install()
    torchvision_ops.install()
    torchtitan_kernels.install()
    transformer_encoder.install()
