"""Custom JAX and Pallas kernels as torch ops on tpu tensors (``torch.tpu.pallas``).

``jax_op(name, fn)`` turns a JAX function of arrays into the torch op
``torch.ops.torchtpu_jax.<name>``, which takes and returns a list of tensors:

- it is a real ``torch.library`` op, with a fake (meta) implementation from
  ``jax.eval_shape``, so ``torch.compile`` traces it like any ATen op;
- its lowering is ``fn`` itself, in the one lowering table, so eager mode
  compiles it once per shape and compiled graphs inline it into their program;
- its gradient comes from ``jax.vjp`` of ``fn``, or from a ``backward(primals,
  cotangents)`` JAX function the user gives, through a second op
  ``<name>_vjp`` that is built the same way.

A Pallas kernel is a JAX function, so it goes through the same door; on the
CPU backend, pass ``interpret=torchtpu.pallas.interpret_mode()`` to
``pallas_call``, which runs the kernel in Pallas' interpreter.
"""

from __future__ import annotations

import operator

import jax
import torch

from ..core import dtypes
from ..dispatch.registration import lowered_kernel
from ..ops import registry

NAMESPACE = "torchtpu_jax"
_library = torch.library.Library(NAMESPACE, "FRAGMENT")
_ops: dict[str, torch._ops.OpOverload] = {}


def interpret_mode() -> bool:
    """True where Pallas kernels must run in the interpreter (no TPU or GPU)."""
    return jax.default_backend() == "cpu"


def _as_list(result):
    return list(result) if isinstance(result, (list, tuple)) else [result]


class _SymbolicSizes:
    """Dynamic shapes through a JAX op's fake kernel: a size Dynamo made symbolic (a token
    count, say) becomes a JAX symbolic dimension of the same name, so ``jax.eval_shape``
    computes the outputs' sizes as expressions of it instead of specialising the graph
    to one value. A size that is an expression of symbols is specialised to its value."""

    def __init__(self):
        self.scope = jax.export.SymbolicScope()
        self.by_name: dict[str, torch.SymInt] = {}

    def to_jax(self, shape) -> tuple:
        names = [self._name(size) for size in shape]
        if not any(names):
            return tuple(int(size) for size in shape)
        spec = ", ".join(name or str(int(size)) for name, size in zip(names, shape))
        return jax.export.symbolic_shape(spec, scope=self.scope)

    def _name(self, size) -> str | None:
        if not isinstance(size, torch.SymInt) or not size.node.expr.is_Symbol:
            return None
        name = str(size.node.expr)
        self.by_name[name] = size
        return name

    def to_torch(self, shape) -> tuple:
        return tuple(size if isinstance(size, int) else self._evaluate(size) for size in shape)

    def _evaluate(self, size) -> torch.SymInt:
        """A JAX size expression (``2*s0``, ``floordiv(s0, 4) + 1``) in the torch symbols:
        its printed form is Python over the operations below."""
        return eval(str(size), {"__builtins__": {}, **_JAX_SIZE_OPERATIONS}, dict(self.by_name))


_JAX_SIZE_OPERATIONS = {"floordiv": operator.floordiv, "mod": operator.mod, "max": torch.sym_max,
                        "min": torch.sym_min, "non_negative": lambda size: torch.sym_max(size, 0)}


def _define(name: str, schema: str, array_fn, shape_fn) -> torch._ops.OpOverload:
    """One op: ``array_fn(arrays) -> arrays`` is its lowering, ``shape_fn`` its fake kernel."""
    if name in _ops:
        raise ValueError(f"torchtpu: a JAX op named {name!r} already exists")
    _library.define(name + schema)
    op = getattr(getattr(torch.ops, NAMESPACE), name).default

    def fake(*tensor_lists):
        symbols = _SymbolicSizes()
        specs = [[jax.ShapeDtypeStruct(symbols.to_jax(t.shape), dtypes.to_jax(t.dtype)) for t in ts]
                 for ts in tensor_lists]
        device = tensor_lists[0][0].device
        return [torch.empty(symbols.to_torch(s.shape), dtype=dtypes.to_torch(s.dtype), device=device)
                for s in shape_fn(*specs)]

    torch.library.register_fake(op, fake, lib=_library)
    registry.register(op, registry.Lowering(array_fn))
    _library.impl(name, lowered_kernel(op), "PrivateUse1")
    _ops[name] = op
    return op


def jax_op(name: str, fn, backward=None, shapes=None):
    """``fn(*arrays) -> array or tuple of arrays`` as a torch op; returns a callable on tensors.

    ``backward(primals, cotangents) -> gradients`` (lists of arrays) replaces
    ``jax.vjp`` of ``fn`` when given; a gradient may be None.
    ``shapes(*specs) -> spec or tuple of specs`` (``jax.ShapeDtypeStruct``s) gives
    the outputs' shapes instead of ``jax.eval_shape`` of ``fn``: for a function
    whose Python code cannot run on symbolic sizes (a kernel that picks its
    block sizes from its input's size) inside a graph with dynamic shapes.
    """
    def forward_arrays(inputs):
        return _as_list(fn(*inputs))

    def forward_shapes(inputs):
        return _as_list(shapes(*inputs) if shapes is not None else jax.eval_shape(fn, *inputs))

    def vjp_arrays(primals, cotangents):
        if backward is not None:
            grads = _as_list(backward(list(primals), list(cotangents)))
        else:
            outputs, pullback = jax.vjp(lambda *xs: tuple(_as_list(fn(*xs))), *primals)
            grads = pullback(tuple(c.astype(o.dtype) for c, o in zip(cotangents, outputs)))
        return [jax.numpy.zeros(p.shape, p.dtype) if g is None else g.astype(p.dtype) for g, p in zip(grads, primals)]

    op = _define(name, "(Tensor[] inputs) -> Tensor[]", forward_arrays, forward_shapes)
    vjp_op = _define(name + "_vjp", "(Tensor[] primals, Tensor[] cotangents) -> Tensor[]", vjp_arrays,
                     lambda primals, cotangents: list(primals))

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[0])
        ctx.outputs = [(o.shape, o.dtype, o.device) for o in output]

    def backward_kernel(ctx, grads):
        cotangents = [torch.zeros(*meta[:1], dtype=meta[1], device=meta[2]) if g is None else g
                      for g, meta in zip(grads, ctx.outputs)]
        return (list(vjp_op(list(ctx.saved_tensors), cotangents)),)

    torch.library.register_autograd(op, backward_kernel, setup_context=setup_context, lib=_library)

    def call(*tensors):
        results = op(list(tensors))
        return results[0] if len(results) == 1 else tuple(results)

    call.op = op
    return call


def custom_jax_kernel(name: str | None = None, backward=None):
    """Decorator form of ``jax_op``: ``@custom_jax_kernel()`` over a JAX function."""
    def wrap(fn):
        return jax_op(name or fn.__name__, fn, backward=backward)

    return wrap
