"""``torch.compile(model, backend="tpu")``.

Dynamo captures the Python program, AOTAutograd turns it into forward and
backward graphs of functional ATen ops, and each graph becomes one jax
function built from the lowering table (``graph/fx.py``) that
``jax.jit`` compiles into a single XLA program.  PyTorch finds this backend
through the ``torch_dynamo_backends`` entry point, so ``import torchtpu`` does
not pay for importing Dynamo.
"""

from .dynamo import tpu_backend

__all__ = ["tpu_backend"]
