"""``torch.nn.attention.flex_attention`` on tpu tensors.

PyTorch's flex attention checks its inputs' device against a fixed list
(cuda, cpu, xpu, hpu, mps; "TODO: remove once other devices are supported")
before it runs; on tpu it runs. Called eagerly, flex attention traces itself
with Dynamo and runs the graph with the "eager" backend, whose dense
composite implementation materialises every score and the whole mask; for a
graph on tpu it uses torchtpu's backend instead, so eager calls run the same
block-sparse lowering (graph/flex_attention.py) as compiled ones, forward
and backward. Graphs on other devices keep the eager backend.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.attention.flex_attention as flex

from .default_compiler import has_tpu_tensor


def _allowing_tpu(validate):
    @functools.wraps(validate)
    def call(query, key, value):
        if query.device.type != "tpu":
            validate(query, key, value)

    call.__torchtpu_original__ = validate
    return call


@functools.lru_cache(maxsize=None)
def _tpu_graphs_to_torchtpu(backend):
    """``backend``, except that a graph with tpu inputs compiles with torchtpu's backend.

    Cached: Dynamo guards on the backend's identity, so one object per backend
    keeps later calls from recompiling."""
    @functools.wraps(backend)
    def call(gm, example_inputs, **kwargs):
        if not has_tpu_tensor(example_inputs):
            return backend(gm, example_inputs, **kwargs)
        from ...compile import tpu_backend

        return tpu_backend(gm, example_inputs)

    return call


def _routing_compilation_env(setup):
    @contextlib.contextmanager
    def env():
        with setup() as backend:
            eager = torch._dynamo.backends.registry.lookup_backend("eager")
            yield _tpu_graphs_to_torchtpu(backend) if backend is eager else backend

    env.__torchtpu_original__ = setup
    return env


def install() -> None:
    if not hasattr(flex._validate_device, "__torchtpu_original__"):
        flex._validate_device = _allowing_tpu(flex._validate_device)
    if not hasattr(flex.setup_compilation_env, "__torchtpu_original__"):
        flex.setup_compilation_env = _routing_compilation_env(flex.setup_compilation_env)
