"""The strict eager executor: one op at a time, asynchronous, cached per shape.

For each call we describe the arguments as a hashable key: tensors by layout
and dtype, Python floats as runtime values (so a changing learning rate does
not recompile), everything else as constants.  The first call with a key runs
PyTorch's meta kernel for the op, which raises exactly CPU's shape and dtype
errors and tells us every output's size, stride and dtype, then compiles one
jax program: read the inputs through their views, apply the lowering, cast
to the meta dtypes, and write any in-place results back into their storages.
Later calls with the same key only call that program.  jax dispatch is
asynchronous, so nothing blocks until a host sync.

The other eager modes reuse all of this and differ only in how a program is
launched: ``_launch`` is None in strict mode (call it now), and otherwise the
debug launcher (call it, block, check) or the fused recorder (append it to the
pending graph and hand back Deferred values).
"""

from __future__ import annotations

import math
import sys
import warnings
from typing import NamedTuple

import jax
import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch.utils import _pytree as pytree

from .. import dtypes, tensor
from ..runtime import precision, rng, stats
from .plan import Plan, plan_for

_Tensor = torch.Tensor
aten = torch.ops.aten
_DYNAMIC_NUMBERS = (float, complex)


class Program:
    """One compiled op: the jitted function plus what is needed to wrap its outputs."""

    __slots__ = ("fn", "pure", "out_metas", "written_layouts", "written_dtypes", "fresh_outputs", "returns",
                 "checked_numbers")

    def __init__(self, fn, pure, out_metas, written_layouts, written_dtypes, fresh_outputs, returns):
        self.fn = fn
        self.pure = pure  # the same function un-jitted, for the fused executor to compose
        self.out_metas = out_metas  # (size, stride, torch dtype) of each fresh output
        self.written_layouts = written_layouts  # {storage slot: layout after the op}
        self.written_dtypes = written_dtypes  # {storage slot: array dtype after the op}
        self.fresh_outputs = fresh_outputs  # False for in-place and out= ops: they return no values
        self.returns = returns  # how to build the op's return value
        self.checked_numbers = set()  # tuples of Python numbers the meta kernel has accepted


class _Inputs:
    """The dynamic inputs of one call, gathered while describing its arguments."""

    __slots__ = ("tensors", "numbers", "storages", "slots")

    def __init__(self):
        self.tensors = []  # every tensor leaf, in order
        self.numbers = []  # every dynamic Python number, in order
        self.storages = []  # unique storages' buffers, by slot
        self.slots = {}  # storage id -> slot


class TensorRef(NamedTuple):
    """A tensor argument in a program key: its storage slot, view layout and dtype."""

    slot: int
    size: tuple
    stride: tuple
    offset: int
    dtype: torch.dtype
    # PyTorch's lazy conjugate and negative bits (complex views): (is_conj, is_neg).
    lazy: tuple = (False, False)

    @property
    def layout(self):
        return (self.size, self.stride, self.offset)


class NumberRef(NamedTuple):
    """A Python number passed to the program as a runtime value."""

    kind: type


class ConstRef(NamedTuple):
    """A bool or float constant: 1, 1.0 and True are equal keys, so the type is kept."""

    kind: type
    value: object


class GeneratorRef(NamedTuple):
    """A torch.Generator argument; the program draws from the tpu stream instead."""


def _device_error(op, t):
    return RuntimeError(
        "Expected all tensors to be on the same device, but found at least two devices, "
        f"tpu:0 and {t.device}! (when checking argument for {op._schema.name})"
    )


# Ops that, as on CUDA, accept CPU index tensors for a device tensor.
_HOST_INDEX_OPS = {"aten::index", "aten::_unsafe_index", "aten::index_put", "aten::index_put_",
                   "aten::_index_put_impl", "aten::_index_put_impl_"}


def _host_tensor_to_device(op, value):
    """A 0-dim CPU tensor may join a tpu op, as may CPU indices; any other device is an error."""
    if value.device.type == "cpu" and (value.dim() == 0 or op._schema.name in _HOST_INDEX_OPS):
        return tensor.from_host(value)
    raise _device_error(op, value)


def _describe(op, value, inputs, static_numbers):
    """A hashable description of one argument; records its dynamic parts."""
    if isinstance(value, _Tensor):
        storage = value.untyped_storage()
        buffer = getattr(storage, "_tpu_buffer", None)
        if buffer is None:
            if value.device.type == "tpu":  # a storage C++ re-wrapped around our address
                buffer = tensor.buffer_of(value)
            else:
                value = _host_tensor_to_device(op, value)
                storage = value.untyped_storage()
                buffer = storage._tpu_buffer
        slot = inputs.slots.get(storage._cdata)
        if slot is None:
            slot = inputs.slots[storage._cdata] = len(inputs.storages)
            inputs.storages.append((buffer, storage.nbytes()))
        inputs.tensors.append(value)
        lazy = (value.is_conj(), value.is_neg()) if value.dtype.is_complex else (False, False)
        return TensorRef(slot, value.shape, value.stride(), value.storage_offset(), value.dtype, lazy)
    if isinstance(value, (list, tuple)):
        return tuple(_describe(op, v, inputs, static_numbers) for v in value)
    if isinstance(value, _DYNAMIC_NUMBERS) and not static_numbers:
        inputs.numbers.append(value)
        return NumberRef(type(value))
    if isinstance(value, torch.Generator):
        return GeneratorRef()
    if type(value) in (bool, float):
        return ConstRef(type(value), value)
    return value


# How a program runs: None calls it now (strict); set by ``modes.set_eager_mode``.
_launch = None


def execute(op, args, kwargs):
    plan = plan_for(op)
    return run(plan, args, kwargs)


def run(plan: Plan, args, kwargs):
    lowering = plan.lowering
    if lowering.data_dependent:
        return _run_data_dependent(plan, args, kwargs)
    inputs = _Inputs()
    static = lowering.static_numbers
    arg_key = tuple(_describe(plan.op, a, inputs, static) for a in args)
    kw_key = tuple((k, _describe(plan.op, v, inputs, static)) for k, v in kwargs.items())
    storage_key = tuple(
        (buf.layout, None if buf._value is None else buf._value.dtype, nbytes)
        for buf, nbytes in inputs.storages
    )
    key = (plan.op, arg_key, kw_key, storage_key, precision.current)
    program = _PROGRAMS.get(key)
    if program is None and _resize_outs(plan, args, kwargs):
        return run(plan, args, kwargs)
    if program is None and plan.kind == "out":
        _check_out_overlap(plan, args, kwargs)
    if program is None and plan.op._schema.name in _RESIZING_INPLACE and _resizes_self(plan, args, kwargs):
        return _run_as_out(plan, args, kwargs)
    if program is not None and lowering.random:
        _check_numbers(plan, program, args, kwargs, inputs.numbers)
    dynamic = [buf._value for buf, _ in inputs.storages]  # arrays, or Deferreds in fused mode
    dynamic += inputs.numbers
    if lowering.random:
        dynamic += rng.next_seed_and_offset()
    if program is None:
        program = _PROGRAMS[key] = _compile(plan, args, kwargs, arg_key, kw_key, storage_key, dynamic)
        program.checked_numbers.add(tuple(inputs.numbers))
        stats.compiles[str(plan.op)] += 1
    if _launch is None:
        with tensor.x64():
            outs, written = program.fn(*dynamic)
    else:
        outs, written = _launch(plan, program, dynamic)
    for slot, array in written.items():
        inputs.storages[slot][0].set(array, program.written_layouts[slot])
    return _wrap(plan, program, outs, args, kwargs)


_PROGRAMS: dict = {}


def _mutated_values(plan, args, kwargs):
    for pos, name in plan.mutated:
        yield args[pos] if pos < len(args) else kwargs[name]


def _flat_tensors(value):
    """Tensors in a (nested) result, keeping None for undefined outputs."""
    if value is None or isinstance(value, _Tensor):
        return [value]
    return [t for v in value for t in _flat_tensors(v)]


def _resize_outs(plan, args, kwargs) -> bool:
    """Resize out= tensors to the result shape, as PyTorch's out= ops do. True if any changed."""
    if plan.kind != "out":
        return False
    metas = _run_meta(plan, args, kwargs)
    changed = False
    targets = [t for v in _mutated_values(plan, args, kwargs) for t in _flat_tensors(v)]
    for target, meta in zip(targets, metas):
        if target.shape != meta.shape:
            target.resize_(meta.shape)
            changed = True
    return changed


# In-place ops that CPU computes as their out= variant with ``self`` as the out
# tensor, so that ``self`` takes the result's shape: ``ones(1).addbmm_(b1, b2)`` is 2-d.
_RESIZING_INPLACE = {"aten::addbmm_"}


def _functional_meta(plan, args, kwargs):
    return plan.functional(*[_to_meta(a) for a in args], **{k: _to_meta(v) for k, v in kwargs.items()})


def _resizes_self(plan, args, kwargs) -> bool:
    return args[0].shape != _functional_meta(plan, args, kwargs).shape


def _run_as_out(plan, args, kwargs):
    """``self.op_(*rest)`` as CPU runs it: ``op.out(self as it was, *rest, out=self)``."""
    self = args[0]
    before = self.clone()
    self.resize_(_functional_meta(plan, args, kwargs).shape)
    out_variant = getattr(aten, plan.functional._schema.name.split("::")[1]).out
    out_variant(before, *args[1:], **kwargs, out=self)
    return self


def _check_numbers(plan, program, args, kwargs, numbers):
    """Run the meta kernel's checks of parameter values again for numbers this
    program has not seen: a program is compiled once for every value of a float,
    but ``exponential_(-1.0)`` must still raise.  Only for random ops, whose
    distribution parameters are checked and rarely change from call to call."""
    numbers = tuple(numbers)
    if numbers in program.checked_numbers:
        return
    _run_meta(plan, args, kwargs)
    if len(program.checked_numbers) >= _MAX_CHECKED_NUMBERS:
        program.checked_numbers.clear()
    program.checked_numbers.add(numbers)


_MAX_CHECKED_NUMBERS = 64


def _check_out_overlap(plan, args, kwargs):
    """CPU's memory-overlap checks of out= tensors (as TensorIterator makes them):
    an out tensor may not repeat an element, nor share only some elements with an
    input.  The values would be well defined here, but CPU raises."""
    outs = [t for t in _mutated_values(plan, args, kwargs) for t in _flat_tensors(t) if t is not None]
    out_names = {name for _, name in plan.mutated}
    sources = pytree.tree_leaves((args, {k: v for k, v in kwargs.items() if k not in out_names}))
    for out in outs:
        if _has_internal_overlap(out):
            raise RuntimeError(
                "unsupported operation: more than one element of the written-to tensor refers to a single "
                "memory location. Please clone() the tensor before performing the operation.")
        if any(isinstance(t, _Tensor) and _overlaps_partly(out, t) for t in sources):
            raise RuntimeError(
                "unsupported operation: some elements of the input tensor and the written-to tensor refer to "
                "a single memory location. Please clone() the tensor before performing the operation.")


def _has_internal_overlap(t) -> bool:
    return any(size > 1 and stride == 0 for size, stride in zip(t.shape, t.stride()))


def _overlaps_partly(a, b) -> bool:
    """Whether two dense tensors in one storage share some bytes but not all (CPU's test)."""
    if a is b or a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    if not (is_non_overlapping_and_dense_or_false(a) and is_non_overlapping_and_dense_or_false(b)):
        return False  # too hard to tell, as on CPU
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    a_begin, b_begin = a.data_ptr(), b.data_ptr()
    a_end, b_end = a_begin + a.numel() * a.element_size(), b_begin + b.numel() * b.element_size()
    return (a_begin, a_end) != (b_begin, b_end) and a_begin < b_end and b_begin < a_end


def _to_meta(value):
    if isinstance(value, _Tensor):
        if value.device.type != "tpu":
            return value.to("meta")
        meta = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
        if value.storage_offset():
            meta = meta.as_strided(value.shape, value.stride(), value.storage_offset())
        return meta
    if isinstance(value, (list, tuple)):
        return type(value)(_to_meta(v) for v in value)
    if isinstance(value, torch.Generator):
        return None
    if isinstance(value, torch.device) and value.type == "tpu":
        return torch.device("meta")
    return value


def _run_meta(plan, args, kwargs):
    """The op's results on meta tensors: PyTorch's own shape and dtype checks."""
    meta_args = [_to_meta(a) for a in args]
    meta_kwargs = {k: _to_meta(v) for k, v in kwargs.items()}
    if plan.lowering.check is not None:
        plan.lowering.check(*meta_args, **meta_kwargs)
    if plan.kind == "inplace":
        return _run_inplace_meta(plan, meta_args, meta_kwargs)
    result = plan.op(*meta_args, **meta_kwargs)
    if plan.kind == "out":
        return [t for v in _mutated_values(plan, meta_args, meta_kwargs) for t in _flat_tensors(v)]
    return _flat_tensors(result) if not isinstance(result, _Tensor) else [result]


def _run_inplace_meta(plan, meta_args, meta_kwargs):
    """The written arguments after the in-place op's meta kernel.

    CPU never resizes ``self`` in place: ``ones(5, 1).add_(ones(5, 5))`` raises.
    Some of PyTorch's meta kernels are its references run as ``op(self, out=self)``,
    which resize ``self`` (with a warning) instead; such a resize is CPU's error."""
    targets = [t for pos, _ in plan.mutated for t in _flat_tensors(meta_args[pos])]
    shapes = [None if t is None else t.shape for t in targets]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan.op(*meta_args, **meta_kwargs)
    for target, shape in zip(targets, shapes):
        if target is not None and target.shape != shape:
            raise RuntimeError(f"output with shape {list(shape)} doesn't match the broadcast shape {list(target.shape)}")
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return targets


def _compile(plan: Plan, args, kwargs, arg_key, kw_key, storage_key, dynamic) -> Program:
    try:
        metas = _run_meta(plan, args, kwargs)
    except NotImplementedError:
        if plan.kind != "functional" or "Meta" not in str(sys.exc_info()[1]):
            raise
        metas = None  # no meta kernel: take shapes and dtypes from the lowering itself
    if plan.kind != "functional":
        _check_castable(plan, args, kwargs, metas)
    out_metas = [] if metas is None else [
        None if m is None else (tuple(m.shape), m.stride(), m.dtype) for m in metas]
    lowering = plan.lowering
    call_kw_key = kw_key
    if plan.kind == "out":
        out_names = {name for _, name in plan.mutated}
        call_kw_key = tuple((k, v) for k, v in kw_key if k not in out_names)
    kw_dict = dict(kw_key)
    mutated = [arg_key[pos] if pos < len(arg_key) else kw_dict.get(name) for pos, name in plan.mutated]
    targets = [ref for desc in mutated for ref in _tensor_refs(desc)]
    write_steps, written_layouts, written_dtypes = _plan_writes(targets, storage_key)
    fresh_outputs = plan.kind == "functional"

    n_storages = len(storage_key)

    def program(*dynamic):
        arrays, numbers = dynamic[:n_storages], list(dynamic[n_storages:])
        if lowering.random:
            offset, seed = numbers.pop(), numbers.pop()
            key = jax.random.fold_in(jax.random.key(seed.astype("uint32")), offset)
        number_iter = iter(numbers)

        def build(desc):
            if type(desc) is TensorRef:
                layout, _, nbytes = storage_key[desc.slot]
                value = tensor.view_of(arrays[desc.slot], layout, desc.layout, dtypes.to_jax(desc.dtype), nbytes)
                return _apply_lazy(value, desc.lazy)
            if type(desc) is NumberRef:
                return next(number_iter)
            if type(desc) is GeneratorRef:
                return None
            if type(desc) is ConstRef:
                return desc.value
            if type(desc) is tuple:
                return tuple(build(d) for d in desc)
            return desc

        call_args = [build(d) for d in arg_key]
        call_kwargs = {k: build(v) for k, v in call_kw_key}
        if lowering.random:
            call_kwargs["key"] = key
        result = lowering.fn(*call_args, **call_kwargs)
        if lowering.writes:
            result, updates = result
        values = _flat_results(result)
        if metas is None and not out_metas:
            return values, {}
        if len(values) != len(out_metas):
            raise AssertionError(
                f"lowering of {plan.functional} returned {len(values)} values, expected {len(out_metas)}")
        values = [_conform(v, m, plan) for v, m in zip(values, out_metas)]
        if lowering.writes:
            updates = [u for u, desc in zip(updates, mutated) if desc is not None]
            written = [_conform(u, (t.size, t.stride, t.dtype), plan) for u, t in zip(updates, targets)]
        else:
            written = [] if fresh_outputs else values
        current = list(arrays)
        for (slot, layout, view_layout, nbytes), value, ref in zip(write_steps, written, targets):
            value = _apply_lazy(value, ref.lazy)  # the storage holds the un-conjugated values
            current[slot] = tensor.with_view_written(current[slot], layout, view_layout, value, nbytes)
        return (values if fresh_outputs else []), {slot: current[slot] for slot in written_layouts}

    if metas is None:
        with tensor.x64():
            shapes = jax.eval_shape(program, *map(abstract_value, dynamic))[0]
        out_metas.extend(
            None if s is None else (s.shape, tensor.contiguous_strides(s.shape), dtypes.to_torch(s.dtype))
            for s in shapes
        )
    return Program(jax.jit(program), program, out_metas, written_layouts, written_dtypes, fresh_outputs, None)


def abstract_value(value):
    """A Deferred as jax sees it when tracing: a shape and a dtype."""
    if type(value) is tensor.Deferred:
        return jax.ShapeDtypeStruct(value.shape, value.dtype)
    return value


def _type_name(dtype) -> str:
    return torch.empty(0, dtype=dtype).type().split(".")[-1].removesuffix("Tensor")


def _check_castable(plan, args, kwargs, targets):
    """CPU refuses to write a result into a tensor whose dtype cannot hold it
    (``int_tensor.mul_(1.5)``); some meta kernels skip that check."""
    op_args = {a.name for a in plan.op._schema.arguments}
    if "dtype" in set(plan.arg_names) - op_args:
        return  # a factory's out= variant: the out tensor itself picks the dtype
    out_names = {name for _, name in plan.mutated} if plan.kind == "out" else set()
    try:
        results = plan.functional(*[_to_meta(a) for a in args],
                                  **{k: _to_meta(v) for k, v in kwargs.items() if k not in out_names})
    except Exception:  # no meta kernel for the functional form: nothing to compare
        return
    for result, target in zip(_flat_tensors(results), targets):
        if result is not None and target is not None and not torch.can_cast(result.dtype, target.dtype):
            raise RuntimeError(
                f"result type {_type_name(result.dtype)} can't be cast to the desired output type "
                f"{_type_name(target.dtype)}")


def _apply_lazy(value, lazy):
    """What a view with PyTorch's conjugate/negative bits reads (the inverse is itself)."""
    is_conj, is_neg = lazy
    if is_conj:
        value = jax.numpy.conj(value)
    return -value if is_neg else value


def _plan_writes(targets, storage_key):
    """Each write in order, as (slot, storage layout before, view layout, nbytes),
    and every written storage's layout and array dtype afterwards."""
    steps, layouts = [], {}
    for ref in targets:
        dtype = dtypes.to_jax(ref.dtype)
        layout, old_dtype, nbytes = storage_key[ref.slot]
        if ref.slot in layouts:
            layout, old_dtype = layouts[ref.slot]
        steps.append((ref.slot, layout, ref.layout, nbytes))
        layouts[ref.slot] = tensor.written_layout(old_dtype, layout, ref.layout, dtype, nbytes)
    return (steps, {slot: layout for slot, (layout, _) in layouts.items()},
            {slot: dtype for slot, (_, dtype) in layouts.items()})


def _tensor_refs(desc):
    if type(desc) is TensorRef:
        return [desc]
    if type(desc) is tuple:
        return [ref for sub in desc for ref in _tensor_refs(sub)]
    return []


def _flat_results(result):
    if isinstance(result, (list, tuple)):
        return [v for r in result for v in _flat_results(r)]
    return [result]


def _conform(value, meta, plan):
    """Cast a lowering's result to the dtype and shape PyTorch's meta kernel gave."""
    if meta is None:
        return None
    size, _, dtype = meta
    value = jax.numpy.asarray(value)
    jdtype = dtypes.to_jax(dtype)
    value = dtypes.cast(value, jdtype)
    if value.shape != size:
        if math.prod(value.shape) == math.prod(size):
            raise AssertionError(f"lowering of {plan.functional} returned shape {value.shape}, meta says {size}")
        value = jax.numpy.broadcast_to(value, size)
    return value


def _wrap(plan, program, outs, args, kwargs):
    if plan.returns == "none":  # in-place foreach ops return nothing
        return None
    if plan.kind == "inplace":
        return args[0]
    if plan.kind == "out":
        results = list(_mutated_values(plan, args, kwargs))
        return results[0] if len(results) == 1 else tuple(results)
    tensors = [
        _new_tensor(array, meta) for array, meta in zip(outs, program.out_metas)
    ]
    if plan.returns == "tensor":
        return tensors[0]
    return tensors if plan.returns == "list" else tuple(tensors)


def _new_tensor(array, meta):
    if meta is None:
        return None
    size, stride, dtype = meta
    t = tensor.empty(size, dtype, stride)
    tensor.attach(t, array, (size, stride, 0))
    return t


def _run_data_dependent(plan, args, kwargs):
    """Ops whose output shape depends on values: run eagerly on concrete arrays."""
    tensor.materialize(f"data-dependent op {plan.op._schema.name}")

    def unwrap(v):
        if isinstance(v, _Tensor):
            if v.device.type != "tpu":
                v = _host_tensor_to_device(plan.op, v)
            return tensor.read(v)
        if isinstance(v, (list, tuple)):
            return type(v)(unwrap(x) for x in v)
        return v

    out_names = {name for _, name in plan.mutated} if plan.kind == "out" else set()
    call_kwargs = {k: unwrap(v) for k, v in kwargs.items() if k not in out_names}
    with tensor.x64():
        result = plan.lowering.fn(*[unwrap(a) for a in args], **call_kwargs)
    if plan.kind == "functional":
        return _wrap_eager(result)
    targets = [t for v in _mutated_values(plan, args, kwargs) for t in _flat_tensors(v)]
    values = _flat_results(result)
    for target, value in zip(targets, values):
        if target.shape != value.shape:
            target.resize_(value.shape)
    if plan.kind == "out":
        _check_out_overlap(plan, args, kwargs)
    for target, value in zip(targets, values):
        tensor.write(target, value.astype(dtypes.to_jax(target.dtype)))
    return _wrap(plan, None, [], args, kwargs)


def _wrap_eager(result):
    if isinstance(result, jax.Array):
        return tensor.from_array(result)
    if isinstance(result, (list, tuple)):
        return type(result)(_wrap_eager(r) for r in result)
    return result
