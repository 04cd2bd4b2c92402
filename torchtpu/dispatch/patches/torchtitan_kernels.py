"""TorchTitan 0.2.2's mixture-of-experts layers on tpu: its Triton kernel, and its experts loop.

Expert parallelism (``--parallelism.expert_parallel_degree``) regroups the
tokens each process receives by local expert with
``torchtitan.models.moe.kernels.fill_indices_wrapper``, a Triton kernel
(Triton has no driver for tpu: "0 active drivers"). For tpu tensors it is
replaced by :func:`fill_indices`, the same indices from a few vectorised
ops on the device (no host round trip); other devices keep the kernel.

Off CUDA's sm90, TorchTitan runs the experts as a Python loop
(``torchtitan.models.moe.moe._run_experts_for_loop``): the token counts
copied to the host every layer, and each expert's products in the shapes of
its count, new shapes at every step, each one a new program to compile for
XLA (and graph breaks under ``torch.compile``). For tpu tensors it is replaced by
:func:`run_experts`, the same products as three grouped matrix products
(``torch._grouped_mm``) in the tokens' dtype: fixed shapes, no host sync.

Each replacement is made when TorchTitan imports its module (``install()``
adds an import hook at ``import torchtpu``, as ``torchvision_ops`` does), so
TorchTitan is never imported on torchtpu's account.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys

import torch
import torch.nn.functional as F

KERNELS = "torchtitan.models.moe.kernels"
EXPERTS = "torchtitan.models.moe.moe"


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


def run_experts(w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor, x: torch.Tensor,
                num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
    """TorchTitan's experts loop (SwiGLU feed-forward per expert over its run of the sorted tokens)
    as grouped products; the rows past the last expert's (alignment padding) come out zero, as
    the loop pads them."""
    ends = torch.cumsum(num_tokens_per_expert, dim=0, dtype=torch.int32)
    h = F.silu(torch._grouped_mm(x, w1.transpose(-2, -1), offs=ends))
    h = h * torch._grouped_mm(x, w3.transpose(-2, -1), offs=ends)
    return torch._grouped_mm(h, w2.transpose(-2, -1), offs=ends)


def _on_tpu_or_loop(loop):
    @functools.wraps(loop)
    def _run_experts_for_loop(w1, w2, w3, x, num_tokens_per_expert):
        if x.device.type != "tpu":
            return loop(w1, w2, w3, x, num_tokens_per_expert)
        return run_experts(w1, w2, w3, x, num_tokens_per_expert)

    _run_experts_for_loop.__torchtpu_original__ = loop
    return _run_experts_for_loop


def patch_kernels(module) -> None:
    """Point ``module.fill_indices_wrapper`` (TorchTitan's kernels module) at the tpu-aware version."""
    if not hasattr(module.fill_indices_wrapper, "__torchtpu_original__"):
        module.fill_indices_wrapper = _on_tpu_or_kernel(module.fill_indices_wrapper)


def patch_experts(module) -> None:
    """Point ``module._run_experts_for_loop`` (TorchTitan's MoE module) at the tpu-aware version."""
    if not hasattr(module._run_experts_for_loop, "__torchtpu_original__"):
        module._run_experts_for_loop = _on_tpu_or_loop(module._run_experts_for_loop)


PATCHES = {KERNELS: patch_kernels, EXPERTS: patch_experts}


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds TorchTitan's patched modules through the other finders; each one's loader patches it once it has run."""

    def find_spec(self, name, path=None, target=None):
        if name not in PATCHES:
            return None
        sys.meta_path.remove(self)  # let the regular finders find it
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader, PATCHES[name])
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, patch):
        self._loader, self._patch = loader, patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._patch(module)


def install() -> None:
    for name, patch in PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    if not all(name in sys.modules for name in PATCHES) and not any(
            isinstance(finder, _PatchAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport())
