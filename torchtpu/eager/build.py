"""An eager op's program: read the inputs through their views, apply the lowering,
conform the results to PyTorch's metadata, and write in-place results back into
their storages, all as one pure jax function (``core.program.Program``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..core import dtypes, tensor
from ..core.program import Program, abstract_value, conform
from ..runtime import rng
from .key import ConstRef, GeneratorRef, MovableOffset, NumberRef, TensorRef, tensor_refs


def build(plan, call, metas, dynamic) -> Program:
    """The program for ``call`` (a ``key.Call``), given the meta kernel's results (None: no meta kernel)."""
    out_metas = [] if metas is None else [
        None if m is None else (tuple(m.shape), m.stride(), m.dtype) for m in metas]
    lowering = plan.lowering
    arg_key, kw_key, storage_key = call.arg_key, call.kw_key, call.storage_key
    call_kw_key = kw_key
    if plan.kind == "out":
        out_names = {name for _, name in plan.mutated}
        call_kw_key = tuple((k, v) for k, v in kw_key if k not in out_names)
    kw_dict = dict(kw_key)
    mutated = [arg_key[pos] if pos < len(arg_key) else kw_dict.get(name) for pos, name in plan.mutated]
    targets = [ref for desc in mutated for ref in tensor_refs(desc)]
    write_steps, written_layouts, written_dtypes = _plan_writes(targets, storage_key)
    fresh_outputs = plan.kind == "functional"
    n_storages, n_inputs = len(storage_key), len(storage_key) + len(call.offsets)

    def program(*dynamic):
        arrays, offsets, numbers = dynamic[:n_storages], dynamic[n_storages:n_inputs], list(dynamic[n_inputs:])
        if lowering.random:
            offset, seed = numbers.pop(), numbers.pop()
            key = rng.key(seed, offset)
        number_iter = iter(numbers)

        def read(desc):
            if type(desc) is TensorRef:
                layout, _, nbytes = storage_key[desc.slot]
                value = tensor.view_of(arrays[desc.slot], layout, desc.layout, dtypes.to_jax(desc.dtype), nbytes,
                                       _runtime_offset(desc, offsets))
                return _apply_lazy(value, desc.lazy)
            if type(desc) is NumberRef:
                return next(number_iter)
            if type(desc) is GeneratorRef:
                return None
            if type(desc) is ConstRef:
                return desc.value
            if type(desc) is tuple:
                return tuple(read(d) for d in desc)
            return desc

        call_args = [read(d) for d in arg_key]
        call_kwargs = {k: read(v) for k, v in call_kw_key}
        if lowering.random:
            call_kwargs["key"] = key
        result = lowering.fn(*call_args, **call_kwargs)
        if lowering.writes:
            result, updates = result
        values = flat_results(result)
        if metas is None and not out_metas:
            return values, {}
        if len(values) != len(out_metas):
            raise AssertionError(
                f"lowering of {plan.functional} returned {len(values)} values, expected {len(out_metas)}")
        values = [None if m is None else conform(v, m[0], m[2], plan.functional) for v, m in zip(values, out_metas)]
        if lowering.writes:
            updates = [u for u, desc in zip(updates, mutated) if desc is not None]
            written = [conform(u, t.size, t.dtype, plan.functional) for u, t in zip(updates, targets)]
        else:
            written = [] if fresh_outputs else values
        current = list(arrays)
        for (slot, layout, view_layout, nbytes), value, ref in zip(write_steps, written, targets):
            value = _apply_lazy(value, ref.lazy)  # the storage holds the un-conjugated values
            current[slot] = tensor.with_view_written(current[slot], layout, view_layout, value, nbytes,
                                                     _runtime_offset(ref, offsets))
        return (values if fresh_outputs else []), {slot: current[slot] for slot in written_layouts}

    if metas is None:  # no meta kernel: take shapes and dtypes from the lowering itself
        with tensor.x64():
            shapes = jax.eval_shape(program, *map(abstract_value, dynamic))[0]
        out_metas.extend(
            None if s is None else (s.shape, tensor.contiguous_strides(s.shape), dtypes.to_torch(s.dtype))
            for s in shapes
        )
    name = f"{plan.op._schema.name}.{plan.op._overloadname}"
    return Program(name, program, out_metas, written_layouts, written_dtypes, fresh_outputs)


def _runtime_offset(ref, offsets):
    """The traced storage offset of a view whose key leaves it to run time, else None (it is in the layout)."""
    return offsets[ref.offset.index] if type(ref.offset) is MovableOffset else None


def _apply_lazy(value, lazy):
    """What a view with PyTorch's conjugate/negative bits reads (the inverse is itself)."""
    is_conj, is_neg = lazy
    if is_conj:
        value = jnp.conj(value)
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


def flat_results(result):
    if isinstance(result, (list, tuple)):
        return [v for r in result for v in flat_results(r)]
    return [result]
