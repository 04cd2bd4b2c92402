"""``torch.compile(model)`` with its default backend, on tpu tensors.

The default backend, inductor, has no code generator for torchtpu's device:
to inductor the device type "tpu" means Google's torch_tpu, whose Pallas
code it generates and then fails to import. So a graph whose inputs are on
tpu is compiled by torchtpu's own backend, as if the user had written
``backend="tpu"`` (said once in the log); graphs on any other device go to
inductor unchanged. Inductor's options (``mode=``, ``options=``) do not
apply to the tpu backend.
"""

from __future__ import annotations

import functools
import logging

import torch

log = logging.getLogger("torchtpu")


def has_tpu_tensor(example_inputs) -> bool:
    return any(isinstance(value, torch.Tensor) and value.device.type == "tpu" for value in example_inputs)


@functools.lru_cache(maxsize=None)
def _say_once() -> None:
    log.info("torchtpu: torch.compile's default backend (inductor) cannot generate code for tpu; "
             "graphs on tpu compile with backend='tpu'")


def _routed(inductor_call):
    @functools.wraps(inductor_call)
    def call(self, model, example_inputs, **kwargs):
        if not has_tpu_tensor(example_inputs):
            return inductor_call(self, model, example_inputs, **kwargs)
        from ...compile import tpu_backend

        _say_once()
        return tpu_backend(model, example_inputs)

    call.__torchtpu_original__ = inductor_call
    return call


def install() -> None:
    wrapper = torch._TorchCompileInductorWrapper
    if not hasattr(wrapper.__call__, "__torchtpu_original__"):
        wrapper.__call__ = _routed(wrapper.__call__)
