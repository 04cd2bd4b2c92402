"""Custom JAX and Pallas kernels as torch ops (torch.tpu.pallas): values and gradients against CPU."""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import pytest
import torch
import torch._dynamo.testing
from jax.experimental import pallas as pl
from oracle import assert_same

_names = itertools.count()


def fresh_name(stem):
    return f"{stem}_{next(_names)}"  # each test defines its own op: names are global to the process


def scaled_tanh(x, w):
    return jnp.tanh(x) * w, (x * w).sum()


def reference(x, w):
    return torch.tanh(x) * w, (x * w).sum()


def leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_jax_op_values_and_vjp_gradients_match_cpu(compiled):
    op = torch.tpu.pallas.jax_op(fresh_name("scaled_tanh"), scaled_tanh)
    x, w = leaves(torch.randn(4, 3), torch.randn(3))
    xt, wt = leaves(x.to("tpu"), w.to("tpu"))

    def loss(fn, x, w):
        a, b = fn(x, w)
        return (a * a).sum() + 3 * b

    run = torch.compile(loss, backend="tpu") if compiled else loss
    actual, expected = run(op, xt, wt), loss(reference, x, w)
    assert_same(actual, expected.detach(), rtol=1e-5, atol=1e-6)
    actual.backward()
    expected.backward()
    assert_same(xt.grad, x.grad, rtol=1e-5, atol=1e-6)
    assert_same(wt.grad, w.grad, rtol=1e-5, atol=1e-6)


def test_user_backward_replaces_jax_vjp():
    def straight_through(primals, cotangents):  # pretend round() has gradient 1
        return [cotangents[0]]

    op = torch.tpu.pallas.jax_op(fresh_name("round_st"), jnp.round, backward=straight_through)
    x = torch.tensor([0.4, 1.6, -2.2], device="tpu", requires_grad=True)
    y = op(x)
    assert_same(y.detach(), torch.tensor([0.0, 2.0, -2.0]))
    (y * torch.tensor([1.0, 2.0, 3.0], device="tpu")).sum().backward()
    assert_same(x.grad, torch.tensor([1.0, 2.0, 3.0]))


def test_decorator_and_pallas_kernel_in_interpret_mode():
    @torch.tpu.pallas.custom_jax_kernel(fresh_name("pallas_axpy"))
    def axpy(x, y):
        def kernel(x_ref, y_ref, o_ref):
            o_ref[...] = 2.0 * x_ref[...] + y_ref[...]

        spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
        return pl.pallas_call(kernel, out_shape=spec, interpret=torch.tpu.pallas.interpret_mode())(x, y)

    u, v = torch.randn(8, 128), torch.randn(8, 128)
    assert_same(axpy(u.to("tpu"), v.to("tpu")), 2 * u + v)
    assert_same(torch.compile(axpy, backend="tpu")(u.to("tpu"), v.to("tpu")), 2 * u + v)
    assert torch.tpu.pallas.interpret_mode() == (jax.default_backend() == "cpu")


def test_fake_kernel_gives_shapes_and_dtypes_without_running():
    op = torch.tpu.pallas.jax_op(fresh_name("split_halves"), lambda x: (x[: x.shape[0] // 2].astype(jnp.int32), x.T))
    with torch._subclasses.FakeTensorMode():
        x = torch.empty(6, 4, device="tpu")
        first, second = op(x)
    assert (first.shape, first.dtype) == ((3, 4), torch.int32)
    assert second.shape == (4, 6)


def test_duplicate_name_is_refused():
    name = fresh_name("twice")
    torch.tpu.pallas.jax_op(name, jnp.sin)
    with pytest.raises(ValueError, match="already exists"):
        torch.tpu.pallas.jax_op(name, jnp.cos)


def test_dynamic_sizes_pass_through_the_fake_kernel():
    """Under a dynamic dimension the op's output sizes are expressions of the input's symbolic
    size (through JAX's shape polymorphism): one trace serves every size, values equal CPU's."""
    op = torch.tpu.pallas.jax_op(fresh_name("halves_and_pairs"),
                                 lambda x, rows: (x[rows][: x.shape[0] // 2] * 2, jnp.concatenate([x, x]) + 1))

    def f(x, rows):
        half, doubled = op(x, rows)
        return half.sum(0), doubled[-3:]

    counter = torch._dynamo.testing.CompileCounterWithBackend("tpu")
    compiled = torch.compile(f, backend=counter, fullgraph=True)
    for n in (16, 32, 64):
        x, rows = torch.randn(n, 8), torch.randperm(n)
        on_tpu = x.to("tpu"), rows.to("tpu")
        for t in on_tpu:
            torch._dynamo.mark_dynamic(t, 0)
        half, doubled = compiled(*on_tpu)
        assert_same(half, (x[rows][: n // 2] * 2).sum(0))
        assert_same(doubled, (torch.cat([x, x]) + 1)[-3:])
    assert counter.frame_count == 1, "one trace serves every size"


def test_given_output_shapes_let_size_dependent_python_run_under_dynamic_sizes():
    """A function whose Python branches on its input's size (a kernel picking its block size) cannot run on a
    symbolic size; ``shapes=`` gives the fake kernel the outputs' shapes instead, and the function itself runs
    only on concrete sizes (each compiled size, and eager)."""
    def blocked_double(x):
        block = min(8, x.shape[0])  # a Python decision on the size: fails on a symbolic one
        return (x.reshape(-1, block, *x.shape[1:]) * 2).reshape(x.shape)

    def f(op, x):
        return op(x).sum(0)

    x = torch.randn(16, 4)
    on_tpu = x.to("tpu")
    torch._dynamo.mark_dynamic(on_tpu, 0)
    plain = torch.tpu.pallas.jax_op(fresh_name("blocked_double"), blocked_double)
    with pytest.raises(Exception, match="inconclusive"):
        torch.compile(functools.partial(f, plain), backend="tpu", fullgraph=True)(on_tpu)

    shaped = torch.tpu.pallas.jax_op(fresh_name("blocked_double_shaped"), blocked_double,
                                     shapes=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype))
    counter = torch._dynamo.testing.CompileCounterWithBackend("tpu")
    compiled = torch.compile(functools.partial(f, shaped), backend=counter, fullgraph=True)
    for n in (16, 24, 40):
        x = torch.randn(n, 4)
        on_tpu = x.to("tpu")
        torch._dynamo.mark_dynamic(on_tpu, 0)
        assert_same(compiled(on_tpu), (x * 2).sum(0))
    assert counter.frame_count == 1
    y = torch.randn(3, 4)
    assert_same(shaped(y.to("tpu")), y * 2)  # eager
