"""An FX graph of ATen ops as one pure jax function, built from the lowering table.

``torch.compile(backend="tpu")`` compiles it, and in fused eager mode a
compiled graph joins the pending graph as one step: every node becomes its
lowering called on jax values, so one lowering serves eager and graph
execution alike.

View ops have no lowering of their own, because eager execution makes views
with PyTorch's metadata kernels.  In a graph a view is just a value: it is
computed by the lowering of the op's copying twin (``aten.t`` ->
``aten.t_copy``) where there is one, and otherwise read through the layout
the graph's metadata gives it, like any strided view of a storage.
"""

from __future__ import annotations

import math
import operator

import jax
import torch

from ..core import dtypes, tensor
from ..core.program import conform
from ..ops.registry import LOWERINGS
from ..runtime import rng
from . import spmd

aten = torch.ops.aten

# Size queries a graph makes about its tensors: answered from the traced value.
_SIZE_QUERIES = {
    aten.sym_size.int: lambda x, dim: x.shape[dim],
    aten.sym_numel.default: lambda x: math.prod(x.shape),
    aten.sym_storage_offset.default: lambda x: 0,
}


# Ops whose values are undefined (``empty``): a graph gives them zeros of the right shape.
_UNINITIALIZED = {aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
                  aten.new_empty.default, aten.new_empty_strided.default}


class UnsupportedGraph(NotImplementedError):
    """The graph holds ops that no lowering covers."""


# Higher-order ops (ops that take subgraphs, such as flex attention) -> their lowering, which
# receives each subgraph as a GraphModule (graph/flex_attention.py registers its two).
HIGHER_ORDER: dict = {}


def higher_order(op):
    """Register the decorated function as the lowering of the higher-order op ``op``."""
    def register(fn):
        HIGHER_ORDER[op] = fn
        return fn

    return register


# Copies into a graph input: AOTAutograd's in-place updates of inputs, and FSDP2's copy of the
# all-gathered parameters into the unsharded parameter (``torch.ops.fsdp.copy_``, defined by
# torch.distributed.fsdp, hence named here rather than looked up at import).
_COPIES = ("aten::copy_", "fsdp::copy_")


def _is_copy(op) -> bool:
    return isinstance(op, torch._ops.OpOverload) and op._schema.name in _COPIES and op._overloadname == "default"


def _copying_twin(op):
    """``aten.t.default`` -> ``aten.t_copy.default``, when that has a lowering."""
    packet = getattr(aten, op._schema.name.split("::")[1] + "_copy", None)
    twin = getattr(packet, op._overloadname, None) if packet is not None else None
    return twin if twin in LOWERINGS else None


def _is_view(op) -> bool:
    return isinstance(op, torch._ops.OpOverload) and op.is_view


def only_views(gm: torch.fx.GraphModule) -> bool:
    """Whether the graph computes nothing: its ops only make views (``loss.detach()``),
    which eager execution makes from metadata, with no program to run."""
    calls = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    return all(_is_view(op) or op is operator.getitem for op in calls)


def unsupported_ops(gm: torch.fx.GraphModule) -> list[str]:
    """The ops in ``gm`` that cannot be lowered, by name."""
    missing = set()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        op = node.target
        if not isinstance(op, torch._ops.OpOverload):
            if isinstance(op, torch._ops.HigherOrderOperator) and op not in HIGHER_ORDER:
                missing.add(str(op))
            continue
        if _is_copy(op):
            if node.args[0].op != "placeholder":
                missing.add(f"{op._schema.name} into an intermediate value")
        elif spmd.handler_of(op) is not None:
            continue  # lowered by its handler's plan (spmd_plan)
        elif op in LOWERINGS:
            if LOWERINGS[op].writes:  # functional graphs carry no in-place updates
                missing.add(str(op))
        elif not (_is_view(op) or op in _SIZE_QUERIES or op in _UNINITIALIZED):
            missing.add(str(op))
    return sorted(missing)


def _layout(fake) -> tuple:
    return (tuple(fake.shape), tuple(fake.stride()), fake.storage_offset())


def _symbol_values(placeholders, inputs) -> dict:
    """The value of each size symbol of a dynamic-shape graph (Dynamo's ``s0``...) in this
    trace: read off the placeholders, a symbolic size input itself or a tensor's dimension."""
    values = {}
    for node, value in zip(placeholders, inputs):
        meta = node.meta.get("val")
        if isinstance(meta, torch.SymInt) and isinstance(value, int):
            values[meta.node.expr] = value
        elif isinstance(meta, torch.Tensor) and hasattr(value, "shape"):
            for size, actual in zip(meta.shape, value.shape):
                if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                    values[size.node.expr] = actual
    return values


def tensor_size_inputs(gm: torch.fx.GraphModule) -> set[int]:
    """The positions of the graph's integer inputs that are sizes of its tensor inputs (dynamic shapes)."""
    placeholders = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    sizes = {s.node.expr for m in placeholders if isinstance(m, torch.Tensor)
             for s in m.shape if isinstance(s, torch.SymInt)}
    return {i for i, m in enumerate(placeholders) if isinstance(m, torch.SymInt) and m.node.expr in sizes}


def _concrete(size, symbols) -> int:
    """A size of the graph's metadata as a number: symbolic ones from this trace's ``symbols``."""
    if type(size) is int:
        return size
    try:
        return int(size.node.expr.xreplace(symbols))
    except TypeError:  # a symbol with no value in this trace
        raise UnsupportedGraph(f"torchtpu: a view or an uninitialized tensor of symbolic size {size}") from None


def _concrete_layout(meta, symbols) -> tuple:
    return (tuple(_concrete(s, symbols) for s in meta.shape), tuple(_concrete(s, symbols) for s in meta.stride()),
            _concrete(meta.storage_offset(), symbols))


def _read_view(node, value, symbols):
    """A view with no copying twin: read the input's storage through the view's layout."""
    source, out = node.args[0].meta["val"], node.meta["val"]
    layout = _concrete_layout(source, symbols)
    if layout == _layout(source):
        nbytes = source.untyped_storage().nbytes()
    else:  # dynamic shapes: the fake storage keeps the size of the first trace; the view's extent instead
        shape, stride, offset = layout
        nbytes = (offset + sum((n - 1) * s for n, s in zip(shape, stride)) + 1) * source.element_size()
    return tensor.view_of(value, layout, _concrete_layout(out, symbols), dtypes.to_jax(out.dtype), nbytes)


def _conform(value, meta, op):
    """A lowering's result, cast to the dtype and shape the graph's metadata gives."""
    if not isinstance(meta, torch.Tensor):
        return value
    return conform(value, meta.shape, meta.dtype, op)


def _conform_all(result, meta, op):
    if isinstance(result, (list, tuple)):
        return type(result)(_conform_all(r, m, op) for r, m in zip(result, meta))
    return _conform(result, meta, op)


def _constant(value):
    """A tensor attribute of the graph module (a lifted constant) as a jax array."""
    if value.device.type == "tpu":
        return tensor.read(value)
    with tensor.x64():
        return jax.numpy.asarray(dtypes.torch_to_numpy(value))


def _call(node, args, kwargs, key, plan, symbols):
    op = node.target
    if op in HIGHER_ORDER:
        return _conform_all(HIGHER_ORDER[op](*args, **kwargs), node.meta.get("val"), op)
    if op is operator.getitem or not isinstance(op, torch._ops.OpOverload):
        return op(*args, **kwargs)  # getitem, and Python arithmetic on sizes
    if plan is not None and spmd.handler_of(op) is not None:
        return _conform_all(plan.lower(node, args, kwargs), node.meta.get("val"), op)
    if op in _SIZE_QUERIES:
        return _SIZE_QUERIES[op](*args, **kwargs)
    if op in _UNINITIALIZED:
        meta = node.meta["val"]
        return jax.numpy.zeros(_concrete_layout(meta, symbols)[0], dtypes.to_jax(meta.dtype))
    lowering = LOWERINGS.get(op)
    if lowering is None and _is_view(op):
        twin = _copying_twin(op)
        if twin is None:
            return _read_view(node, args[0], symbols)
        lowering = LOWERINGS[twin]
    if lowering is None:
        raise UnsupportedGraph(f"torchtpu: no lowering for {op} in a compiled graph")
    if lowering.random:
        kwargs = {**kwargs, "key": jax.random.fold_in(key, node.meta["torchtpu_index"])}
    return _conform_all(lowering.fn(*args, **kwargs), node.meta.get("val"), op)


def mutated_inputs(gm: torch.fx.GraphModule) -> list[int]:
    """Positions of the placeholders the graph overwrites (``copy_`` into an input:
    AOTAutograd's in-place updates, such as an optimizer's parameters)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    written = {n.args[0] for n in gm.graph.nodes if n.op == "call_function" and _is_copy(n.target)}
    return [i for i, n in enumerate(placeholders) if n in written]


def spmd_plan(gm: torch.fx.GraphModule) -> spmd.Plan | None:
    """The plan of the graph's process-spanning ops (collectives), from the handler
    registered for their namespace (``graph/spmd.py``); None when it has none."""
    handlers = spmd.handlers_in(gm)
    if not handlers:
        return None
    if len(handlers) > 1:
        raise UnsupportedGraph("torchtpu: a graph mixing ops of several SPMD handlers")
    return handlers[0].plan(gm)


def to_jax_function(gm: torch.fx.GraphModule, plan: spmd.Plan | None = None):
    """``fn(inputs, seed, offset) -> (outputs, new values)``: the graph on jax values (pure, jittable).

    ``inputs`` holds a jax array for each tensor placeholder and the Python
    value for every other one (sizes); ``outputs`` mirrors the graph's output,
    and ``new values`` holds the final value of each input that
    ``mutated_inputs(gm)`` names, in that order.  Collectives are lowered by
    ``plan`` (``spmd_plan(gm)``): the function is then one process's block of
    an SPMD program, to be traced inside the plan's ``shard``.
    """
    missing = unsupported_ops(gm)
    if missing:
        raise UnsupportedGraph("torchtpu: no lowering for " + ", ".join(missing))
    if plan is None and spmd.handlers_in(gm):
        raise UnsupportedGraph("torchtpu: a graph with collectives needs its SPMD plan (fx.spmd_plan)")
    for index, node in enumerate(gm.graph.nodes):
        node.meta["torchtpu_index"] = index
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    mutated = [placeholders[i] for i in mutated_inputs(gm)]

    def fn(inputs, seed, offset):
        key = rng.key(seed, offset)
        env = dict(zip(placeholders, inputs))
        symbols = _symbol_values(placeholders, inputs)

        def value(arg):
            return torch.fx.node.map_arg(arg, lambda n: env[n])

        for node in nodes:
            if node.op == "get_attr":  # a lifted constant, or the subgraph of a higher-order op
                attribute = operator.attrgetter(node.target)(gm)
                env[node] = attribute if isinstance(attribute, torch.fx.GraphModule) else _constant(attribute)
            elif node.op == "call_function" and _is_copy(node.target):
                target, source = node.args[0], value(node.args[1])
                env[target] = _conform(source, target.meta["val"], node.target)
                env[node] = env[target] if node.target is aten.copy_.default else None  # fsdp.copy_ returns ()
            elif node.op == "call_function":
                args, kwargs = (node.args, node.kwargs) if plan is None else plan.arguments(node)
                env[node] = _call(node, value(args), value(kwargs), key, plan, symbols)
            elif node.op == "output":
                return value(node.args[0]), [env[n] for n in mutated]
        raise AssertionError("graph without an output node")

    return fn
