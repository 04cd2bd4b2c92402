"""CPU's checks, for the eager executor: PyTorch's meta kernels plus what they leave out.

On a program-cache miss the executor asks ``checked_metas`` for the op's
results on meta tensors (CPU's shape and dtype errors, and every output's
size, stride and dtype), then for out= and in-place ops the checks that meta
kernels skip: out= tensors resized to the result as CPU resizes them, their
memory-overlap errors, and results that cannot be cast into the written
tensor.  A program-cache hit runs none of this, because none of it depends
on more than the key, except the parameter checks of random ops
(``check_numbers``), whose values are not part of the key.
"""

from __future__ import annotations

import sys
import warnings

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch.utils import _pytree as pytree

from ..core import dtypes

_Tensor = torch.Tensor
aten = torch.ops.aten


def mutated_values(plan, args, kwargs):
    for pos, name in plan.mutated:
        yield args[pos] if pos < len(args) else kwargs[name]


def flat_tensors(value):
    """Tensors in a (nested) result, keeping None for undefined outputs."""
    if value is None or isinstance(value, _Tensor):
        return [value]
    return [t for v in value for t in flat_tensors(v)]


def written_tensors(plan, args, kwargs) -> list:
    return [t for v in mutated_values(plan, args, kwargs) for t in flat_tensors(v)]


# ---- meta kernels ---------------------------------------------------------------------


def to_meta(value):
    if isinstance(value, _Tensor):
        if value.device.type != "tpu":
            return value.to("meta")
        meta = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
        if value.storage_offset():
            meta = meta.as_strided(value.shape, value.stride(), value.storage_offset())
        return meta
    if isinstance(value, (list, tuple)):
        return type(value)(to_meta(v) for v in value)
    if isinstance(value, torch.Generator):
        return None
    if isinstance(value, torch.device) and value.type == "tpu":
        return torch.device("meta")
    return value


def run_meta(plan, args, kwargs) -> list:
    """The op's results on meta tensors (the written tensors, for in-place and out= ops)."""
    meta_args = [to_meta(a) for a in args]
    meta_kwargs = {k: to_meta(v) for k, v in kwargs.items()}
    if plan.lowering.check is not None:
        plan.lowering.check(*meta_args, **meta_kwargs)
    if plan.kind == "inplace":
        return _run_inplace_meta(plan, meta_args, meta_kwargs)
    meta_kernel = plan.lowering.meta if plan.kind == "functional" and plan.lowering.meta else plan.op
    result = meta_kernel(*meta_args, **meta_kwargs)
    if plan.kind == "out":
        return written_tensors(plan, meta_args, meta_kwargs)
    return flat_tensors(result) if not isinstance(result, _Tensor) else [result]


def checked_metas(plan, args, kwargs) -> list | None:
    """``run_meta``, or None for a functional op with no meta kernel (its lowering gives the shapes)."""
    try:
        return run_meta(plan, args, kwargs)
    except NotImplementedError:
        if plan.kind != "functional" or "Meta" not in str(sys.exc_info()[1]):
            raise
        return None


def _run_inplace_meta(plan, meta_args, meta_kwargs):
    """The written arguments after the in-place op's meta kernel.

    CPU never resizes ``self`` in place: ``ones(5, 1).add_(ones(5, 5))`` raises.
    Some of PyTorch's meta kernels are its references run as ``op(self, out=self)``,
    which resize ``self`` (with a warning) instead; such a resize is CPU's error."""
    targets = [t for pos, _ in plan.mutated for t in flat_tensors(meta_args[pos])]
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


def _functional_meta(plan, args, kwargs, drop=()):
    return plan.functional(*[to_meta(a) for a in args], **{k: to_meta(v) for k, v in kwargs.items() if k not in drop})


# ---- out= tensors -----------------------------------------------------------------------


def resize_outs(plan, args, kwargs, metas) -> bool:
    """Resize out= tensors to the result shape, as PyTorch's out= ops do. True if any changed."""
    changed = False
    for target, meta in zip(written_tensors(plan, args, kwargs), metas):
        if target.shape != meta.shape:
            target.resize_(meta.shape)
            changed = True
    return changed


def check_out_overlap(plan, args, kwargs):
    """CPU's memory-overlap checks of out= tensors (as TensorIterator makes them):
    an out tensor may not repeat an element, nor share only some elements with an
    input.  The values would be well defined here, but CPU raises."""
    outs = [t for t in written_tensors(plan, args, kwargs) if t is not None]
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


# ---- in-place ops -------------------------------------------------------------------------

# In-place ops that CPU computes as their out= variant with ``self`` as the out
# tensor, so that ``self`` takes the result's shape: ``ones(1).addbmm_(b1, b2)`` is 2-d.
_RESIZING_INPLACE = {"aten::addbmm_"}


def resizes_self(plan, args, kwargs) -> bool:
    return plan.op._schema.name in _RESIZING_INPLACE and args[0].shape != _functional_meta(plan, args, kwargs).shape


def run_as_out(plan, args, kwargs):
    """``self.op_(*rest)`` as CPU runs it: ``op.out(self as it was, *rest, out=self)``."""
    self = args[0]
    before = self.clone()
    self.resize_(_functional_meta(plan, args, kwargs).shape)
    out_variant = getattr(aten, plan.functional._schema.name.split("::")[1]).out
    out_variant(before, *args[1:], **kwargs, out=self)
    return self


def check_castable(plan, args, kwargs, targets):
    """CPU refuses to write a result into a tensor whose dtype cannot hold it
    (``int_tensor.mul_(1.5)``); some meta kernels skip that check."""
    op_args = {a.name for a in plan.op._schema.arguments}
    if "dtype" in set(plan.arg_names) - op_args:
        return  # a factory's out= variant: the out tensor itself picks the dtype
    out_names = {name for _, name in plan.mutated} if plan.kind == "out" else set()
    try:
        results = _functional_meta(plan, args, kwargs, drop=out_names)
    except Exception:  # no meta kernel for the functional form: nothing to compare
        return
    for result, target in zip(flat_tensors(results), targets):
        if result is not None and target is not None and not torch.can_cast(result.dtype, target.dtype):
            raise RuntimeError(
                f"result type {dtypes.scalar_type_name(result.dtype)} can't be cast to the desired output type "
                f"{dtypes.scalar_type_name(target.dtype)}")


# ---- random ops -----------------------------------------------------------------------------

_MAX_CHECKED_NUMBERS = 64


def check_numbers(plan, program, args, kwargs, numbers):
    """Run the meta kernel's checks of parameter values again for numbers this
    program has not seen: a program is compiled once for every value of a float,
    but ``exponential_(-1.0)`` must still raise.  Only for random ops, whose
    distribution parameters are checked and rarely change from call to call."""
    numbers = tuple(numbers)
    if numbers in program.checked_numbers:
        return
    run_meta(plan, args, kwargs)
    if len(program.checked_numbers) >= _MAX_CHECKED_NUMBERS:
        program.checked_numbers.clear()
    program.checked_numbers.add(numbers)
