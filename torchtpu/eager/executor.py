"""The eager executor: one ATen op call, run as a program compiled once per key.

For each call, ``key.Call`` describes the arguments as a hashable key.  The
first call with a key runs CPU's checks and PyTorch's meta kernel for the op
(``parity``), which give every output's size, stride and dtype, then builds
the op's program (``build``).  Later calls with the same key only run that
program.  How it runs is the launcher's business (``runtime.context``):
strict mode calls it at once (jax dispatch is asynchronous, so nothing blocks
until a host sync), debug mode waits for it and checks it, and fused mode
records it into a pending graph and hands back Deferred values.  Whatever the
launcher, the executor then stores written storages and wraps the outputs.
"""

from __future__ import annotations

import jax
import torch

from ..core import dtypes, tensor
from ..runtime import caches, context, metrics, rng
from ..runtime import device as runtime_device
from . import host_tier, parity
from .build import build, flat_results
from .key import HOST_INDEX_OPS, Call
from .plan import Plan, plan_for

_Tensor = torch.Tensor

# Every eager op's program, by key.
PROGRAMS = caches.BoundedCache("eager programs")
# The entry of an in-place op on an empty tensor: checked like any call, then
# nothing to run (vLLM fills empty padding slices every step).
WRITES_NOTHING = object()


def _writes_nothing(plan: Plan, args) -> bool:
    return (plan.kind == "inplace" and not plan.lowering.random and isinstance(args[0], _Tensor)
            and args[0].numel() == 0)


def execute(op, args, kwargs):
    return run(plan_for(op), args, kwargs)


def run(plan: Plan, args, kwargs):
    if metrics.listener is not None:  # torchtpu tune analyze: an op run outside a compiled graph
        metrics.listener("eager_op", (plan.op, args, kwargs))
    lowering = plan.lowering
    if lowering.data_dependent:
        return _run_data_dependent(plan, args, kwargs)
    call = Call(plan, args, kwargs)
    program = PROGRAMS.get(call.key)
    if program is WRITES_NOTHING:
        return args[0]
    if program is None:
        if isinstance(kwargs.get("device"), torch.device) and kwargs["device"].type == "tpu":
            runtime_device.index_of(kwargs["device"])  # a factory: this process's chip, not another's
        if plan.kind == "inplace" and parity.resizes_self(plan, args, kwargs):
            return parity.run_as_out(plan, args, kwargs)
        metas = parity.checked_metas(plan, args, kwargs)
        if plan.kind == "out":
            if parity.resize_outs(plan, args, kwargs, metas):
                return run(plan, args, kwargs)  # the out tensors' new shapes are a new key
            parity.check_out_overlap(plan, args, kwargs)
        if plan.kind != "functional":
            parity.check_castable(plan, args, kwargs, metas)
        if _writes_nothing(plan, args):
            PROGRAMS[call.key] = WRITES_NOTHING
            return args[0]
        if host_tier.runs_on_host(plan, call.key, args, kwargs, metas):
            result = host_tier.run(plan, call.key, args, kwargs)
            if result is not host_tier.NO_CPU_KERNEL:
                return result
    elif lowering.random:
        parity.check_numbers(plan, program, args, kwargs, call.numbers)
    dynamic = [buf.value for buf, _ in call.storages]  # arrays, or Deferreds in fused mode
    dynamic += call.offsets
    dynamic += call.numbers
    if lowering.random:
        dynamic += rng.next_seed_and_offset(kwargs.get("generator"))
    if program is None:
        program = PROGRAMS[call.key] = build(plan, call, metas, dynamic)
        program.checked_numbers.add(tuple(call.numbers))
        metrics.compiles[str(plan.op)] += 1
    outs, written = context.current().launcher.launch(program, dynamic)
    for slot, array in written.items():
        call.storages[slot][0].set(array, program.written_layouts[slot])
    return _wrap(plan, program, outs, args, kwargs)


def _wrap(plan, program, outs, args, kwargs):
    if plan.returns == "none":  # in-place foreach ops return nothing
        return None
    if plan.kind == "inplace":
        return args[0]
    if plan.kind == "out":
        results = list(parity.mutated_values(plan, args, kwargs))
        return results[0] if len(results) == 1 else tuple(results)
    tensors = [_new_tensor(array, meta) for array, meta in zip(outs, program.out_metas)]
    if plan.returns == "tensor":
        return tensors[0]
    return tensors if plan.returns == "list" else tuple(tensors)


def _new_tensor(array, meta):
    if meta is None:
        return None
    size, stride, dtype = meta
    return tensor.empty(size, dtype, stride, array=array)


def _run_data_dependent(plan, args, kwargs):
    """Ops whose output shape depends on values: run eagerly on concrete arrays."""
    tensor.materialize(f"data-dependent op {plan.op._schema.name}")
    name = plan.op._schema.name

    def unwrap(v):
        if isinstance(v, _Tensor):
            return tensor.read(tensor.device_operand(v, name, name in HOST_INDEX_OPS))
        if isinstance(v, (list, tuple)):
            return type(v)(unwrap(x) for x in v)
        return v

    out_names = {name for _, name in plan.mutated} if plan.kind == "out" else set()
    call_kwargs = {k: unwrap(v) for k, v in kwargs.items() if k not in out_names}
    with tensor.x64():
        result = plan.lowering.fn(*[unwrap(a) for a in args], **call_kwargs)
    if plan.kind == "functional":
        return _wrap_eager(result)
    targets = parity.written_tensors(plan, args, kwargs)
    values = flat_results(result)
    for target, value in zip(targets, values):
        if target.shape != value.shape:
            target.resize_(value.shape)
    if plan.kind == "out":
        parity.check_out_overlap(plan, args, kwargs)
    for target, value in zip(targets, values):
        tensor.write(target, value.astype(dtypes.to_jax(target.dtype)))
    return _wrap(plan, None, [], args, kwargs)


def _wrap_eager(result):
    if isinstance(result, jax.Array):
        return tensor.from_array(result)
    if isinstance(result, (list, tuple)):
        return type(result)(_wrap_eager(r) for r in result)
    return result
