"""TorchTitan's Triton kernel (expert parallelism's token regrouping) on tpu.

``torchtpu.dispatch.patches.torchtitan_kernels`` replaces it for tpu tensors;
the oracle is TorchTitan's own reference, ``fill_indices_cpu``.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchtitan", reason="the TorchTitan extra is not installed (pip install -e '.[titan]')")
from torchtitan.models.moe import kernels  # noqa: E402


def regrouping_inputs(generator: torch.Generator, num_ranks: int, experts_per_rank: int, alignment: int):
    """Token counts per (rank, expert) as the all-to-all delivers them, with the offsets TorchTitan derives."""
    tokens = torch.randint(0, 9, (num_ranks * experts_per_rank,), generator=generator, dtype=torch.int32)
    tokens[torch.rand(tokens.shape, generator=generator) < 0.25] = 0  # some groups empty
    starts = tokens.cumsum(0) - tokens
    per_expert = tokens.view(num_ranks, -1).sum(0).clamp_min(alignment)
    sizes = (per_expert + alignment - 1) // alignment * alignment
    write_offsets = (sizes.cumsum(0) - sizes).to(torch.int32)
    return tokens, starts.to(torch.int32), write_offsets, int(sizes.sum())


@pytest.mark.parametrize("seed", range(40))
def test_regrouped_token_indices_equal_torchtitans_reference(seed):
    generator = torch.Generator().manual_seed(seed)
    num_ranks = 1 + seed % 4
    experts_per_rank = 1 + (seed // 4) % 5
    tokens, starts, offsets, total = regrouping_inputs(generator, num_ranks, experts_per_rank, alignment=4)
    # TorchTitan may cut the list short; its reference needs every group to start inside the list.
    last_group_start = int(offsets[-1]) + int(tokens.view(num_ranks, -1)[:-1, -1].sum())
    max_len = total if seed % 3 else max(last_group_start, total - 5)
    expected = kernels.fill_indices_cpu(tokens, starts, offsets, experts_per_rank, num_ranks, max_len)
    on_tpu = kernels.fill_indices_wrapper(tokens.to("tpu"), starts.to("tpu"), offsets.to("tpu"),
                                          experts_per_rank, num_ranks, max_len)
    assert on_tpu.device.type == "tpu"
    assert torch.equal(on_tpu.cpu(), expected)


def test_the_replacement_is_still_needed():
    """TorchTitan's own wrapper launches Triton, which has no driver for tpu: when this stops
    failing, the replacement can go."""
    original = kernels.fill_indices_wrapper.__torchtpu_original__
    tokens, starts, offsets, total = regrouping_inputs(torch.Generator().manual_seed(0), 2, 2, alignment=4)
    with pytest.raises(RuntimeError, match="active drivers"):
        original(tokens.to("tpu"), starts.to("tpu"), offsets.to("tpu"), 2, 2, total)


# ---- the experts loop ----------------------------------------------------------------------

from torchtitan.models.moe import moe  # noqa: E402


def experts_inputs(seed: int, counts: list[int], padding: int, dim: int = 16, hidden: int = 32):
    generator = torch.Generator().manual_seed(seed)
    weights = [torch.randn(len(counts), *shape, generator=generator) / 4
               for shape in ((hidden, dim), (dim, hidden), (hidden, dim))]
    tokens = torch.randn(sum(counts) + padding, dim, generator=generator)
    return [*weights, tokens, torch.tensor(counts)]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("counts, padding", [([3, 0, 5, 4], 0), ([1, 7, 0, 0], 5), ([0, 0, 0, 6], 2)])
def test_the_experts_loop_on_tpu_gives_the_loops_results_and_gradients(counts, padding, compiled):
    loop = moe._run_experts_for_loop.__torchtpu_original__
    cpu = [t.requires_grad_(t.is_floating_point()) for t in experts_inputs(0, counts, padding)]
    tpu = [t.detach().to("tpu").requires_grad_(t.is_floating_point()) for t in cpu]
    replacement = torch.compile(moe._run_experts_for_loop, backend="tpu", fullgraph=True) if compiled else \
        moe._run_experts_for_loop
    expected, actual = loop(*cpu), replacement(*tpu)
    torch.testing.assert_close(actual.cpu(), expected, atol=1e-5, rtol=1e-5)
    grad = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1))
    expected.backward(grad)
    actual.backward(grad.to("tpu"))
    for c, t in zip(cpu[:4], tpu[:4]):
        torch.testing.assert_close(t.grad.cpu(), c.grad, atol=1e-5, rtol=1e-5)


def test_the_experts_loop_on_tpu_compiles_nothing_new_when_the_counts_change():
    """TorchTitan's loop runs each expert in the shape of its token count: with new counts at every
    step, every step compiled new programs. The replacement's shapes are the tokens' own."""
    def step(seed, counts):
        inputs = [t.to("tpu").requires_grad_(t.is_floating_point()) for t in experts_inputs(seed, counts, 0)]
        moe._run_experts_for_loop(*inputs).sum().backward()
        return inputs[3].grad.cpu()

    for seed in range(3):  # small integer ops (the counts' sum) compile at their third meeting with a shape
        step(seed, [3, 0, 5, 4])
    before = sum(torch.tpu.compile_stats().values())
    step(3, [6, 2, 2, 2])
    step(4, [0, 12, 0, 0])
    assert sum(torch.tpu.compile_stats().values()) == before
