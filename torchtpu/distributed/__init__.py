"""Many chips through ``torch.distributed``: the c10d backend "tpu".

``register()`` (run by ``import torchtpu``) makes "tpu" a c10d backend, so
``dist.init_process_group("tpu")``, ``"cpu:gloo,tpu:tpu"``, ``DeviceMesh("tpu", ...)``
and ``init_process_group()`` with tpu as the default device all reach it.
Registering costs nothing: JAX's runtime starts in the world group's creator.

- ``collectives``: collectives as jax functions of one rank's block (any shard_map).
- ``runtime``: starting ``jax.distributed``, group meshes, the program cache.
- ``process_group``: ``TpuProcessGroup``, the c10d ``ProcessGroup``.
- ``compiled``: functional collectives in ``torch.compile`` graphs, one program per graph.

It sits above ``eager`` and ``compile`` (collectives are programs like any
other) and below ``api``.  docs/distributed.md is the user's guide.
"""

from __future__ import annotations

import torch.distributed as dist

BACKEND = "tpu"


def _create(opts, backend_options=None):
    from . import process_group  # JAX-side code, loaded by the first tpu group

    return process_group.create(opts, backend_options)


def register() -> None:
    """Make "tpu" a c10d backend for tpu tensors (idempotent)."""
    if not dist.is_available() or BACKEND in dist.Backend.backend_type_map:
        return
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=[BACKEND])
    from . import compiled  # functional collectives inside compiled graphs (no JAX work)

    compiled.register()
