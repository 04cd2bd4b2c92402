"""scaled_dot_product_attention on tpu: the fused ops (and the Pallas flash kernel) against CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from oracle import check, check_grad

import torchtpu
from torchtpu.eager import executor
from torchtpu.ops import attention as attention_ops
from torchtpu.runtime import caches, metrics


def qkv(tq=8, tk=10, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 3, tq, d, generator=g), torch.randn(2, 3, tk, d, generator=g), torch.randn(2, 3, tk, d, generator=g)


@pytest.fixture(params=["one program", "head loops"])
def attention_path(request, monkeypatch):
    """Each test once as one program and once as XLA:CPU's loops over heads (``_looped_forward``),
    whose block is made a few heads small here; the loops must then really run."""
    if request.param == "one program":
        yield
        return
    traced = []
    for name in ("_looped_forward", "_looped_backward"):
        original = getattr(attention_ops, name)
        monkeypatch.setattr(attention_ops, name, lambda *a, _f=original, _n=name, **kw: traced.append(_n) or _f(*a, **kw))
    monkeypatch.setattr(attention_ops, "CPU_BLOCK_BYTES", 200)  # a few heads of these tests a step
    monkeypatch.setattr(executor, "PROGRAMS", caches.BoundedCache("eager programs"))  # no program of the other path
    yield
    assert "_looped_forward" in traced


@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, {"scale": 0.3}], ids=["plain", "causal", "scale"])
def test_sdpa_values_and_gradients(attention_path, kwargs):
    check_grad(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kwargs), *qkv())


def test_sdpa_runs_as_one_fused_op_each_way():
    q, k, v = (t.to("tpu").requires_grad_() for t in qkv(tq=5, tk=7, d=4))  # shapes no other test uses
    metrics.compiles.clear()
    F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    compiled = set(metrics.compiles)
    assert {"torchtpu.sdpa_forward.default", "torchtpu.sdpa_backward.default"} <= compiled
    assert not any("bmm" in op or "softmax" in op for op in compiled)


@pytest.mark.parametrize("mask", ["bool", "float", "broadcast-bool"])
def test_sdpa_masks_and_bias_gradient(attention_path, mask):
    q, k, v = qkv()
    g = torch.Generator().manual_seed(3)
    if mask == "bool":
        m = torch.rand(8, 10, generator=g) > 0.3
    elif mask == "float":
        m = torch.randn(3, 8, 10, generator=g)
    else:
        m = torch.rand(2, 1, 1, 10, generator=g) > 0.2
    if m.dtype == torch.bool:
        check_grad(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, m,
                   grad_args=(0, 1, 2))
    else:
        check_grad(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, m)


def test_fully_masked_row_gives_zeros_like_cpu(attention_path):
    q, k, v = qkv()
    mask = torch.ones(8, 10, dtype=torch.bool)
    mask[2] = False
    check_grad(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, mask,
               grad_args=(0, 1, 2))


def test_gqa_and_dropout_take_the_math_path():
    q, k, v = qkv()
    check_grad(lambda q, k, v: F.scaled_dot_product_attention(q, k[:, :1], v[:, :1], enable_gqa=True), q, k, v)
    x = torch.ones(1, 1, 16, 8, device="tpu")
    torch.manual_seed(0)
    a = F.scaled_dot_product_attention(x, x, x, dropout_p=0.5)
    torch.manual_seed(0)
    b = F.scaled_dot_product_attention(x, x, x, dropout_p=0.5)
    assert torch.equal(a.cpu(), b.cpu())


def test_bfloat16_attention_close_to_cpu(attention_path):
    q, k, v = (t.bfloat16() for t in qkv())
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("causal", [False, True])
def test_pallas_flash_kernel_matches_cpu(monkeypatch, causal):
    """The Pallas kernel, run in the interpreter on the CPU backend (it is the default on TPU)."""
    monkeypatch.setattr(torchtpu.config.current, "flash_attention", True)
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 256, 32, generator=g) for _ in range(3))
    if not causal:
        k, v = k[:, :, :128], v[:, :, :128]
    check_grad(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), q, k, v)


def test_compiled_attention_is_one_node(attention_path):
    torch._dynamo.reset()  # the other path's graph, compiled for the same code, would be reused
    q, k, v = (t.to("tpu") for t in qkv())
    compiled = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), backend="tpu")
    torch.testing.assert_close(compiled(q, k, v).cpu(),
                               F.scaled_dot_product_attention(*qkv(), is_causal=True), rtol=1e-5, atol=1e-6)


def _attention_gradients(device, dtype, q, k, v, grad_out, *, causal=False):
    leaves = [t.detach().to(device, dtype).requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*leaves, is_causal=causal).backward(grad_out.to(device, dtype))
    return [t.grad.cpu().double() for t in leaves]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("peak", [1.0, 4.0], ids=["spread", "peaked"])
def test_fused_backward_is_as_precise_as_cpus_against_float64(attention_path, causal, peak):
    """dq, dk, dv of the fused float32 backward against a float64 run: no further off than CPU's
    float32 (a peaked softmax, large scores, is where a flash-style backward loses digits)."""
    generator = torch.Generator().manual_seed(0)
    q, k, v, grad_out = (torch.randn(2, 2, 5, 16, dtype=torch.float64, generator=generator) for _ in range(4))
    q, k = q * peak, k * peak
    exact = _attention_gradients("cpu", torch.float64, q, k, v, grad_out, causal=causal)
    cpu = _attention_gradients("cpu", torch.float32, q, k, v, grad_out, causal=causal)
    tpu = _attention_gradients("tpu", torch.float32, q, k, v, grad_out, causal=causal)
    for name, c, t, e in zip("qkv", cpu, tpu, exact):
        cpu_error, tpu_error = (c - e).abs().max().item(), (t - e).abs().max().item()
        assert tpu_error <= 1.5 * cpu_error + 1e-7, f"d{name}: tpu error {tpu_error:.2e}, CPU's {cpu_error:.2e}"
