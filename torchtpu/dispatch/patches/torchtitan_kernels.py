"""TorchTitan 0.2.2 on tpu: the one kernel it launches with Triton, in torch ops.

Expert parallelism (``--parallelism.expert_parallel_degree``) regroups the
tokens each process receives by local expert with
``torchtitan.models.moe.kernels.fill_indices_wrapper``, a Triton kernel
(Triton has no driver for tpu: "0 active drivers"). For tpu tensors it is
replaced by :func:`fill_indices`, the same indices from a few vectorised
ops on the device (no host round trip); other devices keep the kernel.
The replacement is made when TorchTitan imports that module
(``install()`` adds an import hook at ``import torchtpu``, as ``torchvision_ops``
does), so TorchTitan is never imported on torchtpu's account.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys

import torch

KERNELS = "torchtitan.models.moe.kernels"


def fill_indices(tokens_per_expert_group: torch.Tensor, start_index_values: torch.Tensor,
                 write_offsets: torch.Tensor, experts_per_rank: int, num_ranks: int, max_len: int) -> torch.Tensor:
    """TorchTitan's ``fill_indices`` (its reference ``fill_indices_cpu``) in vectorised torch ops.

    The received tokens come grouped by (rank, expert); the result lists them
    grouped by (expert, rank): expert e's groups are written from
    ``write_offsets[e]`` one rank after another, each group the source
    positions ``start_index_values[i] + 0, 1, ...``; every other position of
    the ``max_len`` result is -1 (the alignment padding)."""
    device = tokens_per_expert_group.device
    lengths = tokens_per_expert_group.view(num_ranks, experts_per_rank).t().long()  # [expert, rank]
    sources = start_index_values.view(num_ranks, experts_per_rank).t().long()
    starts = write_offsets.long()[:, None] + lengths.cumsum(1) - lengths  # where each group is written
    starts, lengths, sources = starts.reshape(-1), lengths.reshape(-1), sources.reshape(-1)
    position = torch.arange(max_len, device=device)
    # Groups are in increasing write order: a position belongs to the last group starting at or before it.
    group = (torch.searchsorted(starts, position, right=True) - 1).clamp(min=0)
    offset = position - starts[group]
    inside = (offset >= 0) & (offset < lengths[group])
    return torch.where(inside, sources[group] + offset, -1).to(torch.int32)


def _on_tpu_or_kernel(kernel):
    @functools.wraps(kernel)
    def fill_indices_wrapper(tokens_per_expert_group, start_index_values, write_offsets, experts_per_rank,
                             num_ranks, max_len, *args, **kwargs):
        if tokens_per_expert_group.device.type != "tpu":
            return kernel(tokens_per_expert_group, start_index_values, write_offsets, experts_per_rank, num_ranks,
                          max_len, *args, **kwargs)
        return fill_indices(tokens_per_expert_group, start_index_values, write_offsets, experts_per_rank,
                            num_ranks, max_len)

    fill_indices_wrapper.__torchtpu_original__ = kernel
    return fill_indices_wrapper


def patch_kernels(module) -> None:
    """Point ``module.fill_indices_wrapper`` (TorchTitan's kernels module) at the tpu-aware version."""
    if not hasattr(module.fill_indices_wrapper, "__torchtpu_original__"):
        module.fill_indices_wrapper = _on_tpu_or_kernel(module.fill_indices_wrapper)


class _PatchAfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds TorchTitan's kernels module through the other finders and patches it once it has run."""

    def find_spec(self, name, path=None, target=None):
        if name != KERNELS:
            return None
        sys.meta_path.remove(self)  # let the regular finders find it
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        patch_kernels(module)


def install() -> None:
    if KERNELS in sys.modules:
        patch_kernels(sys.modules[KERNELS])
    elif not any(isinstance(finder, _PatchAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport())
