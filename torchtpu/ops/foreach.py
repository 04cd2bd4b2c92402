"""Lowerings: the ``_foreach_*`` ops that optimizers use, from the per-tensor lowerings.

``_foreach_add.List(xs, ys)`` is ``add.Tensor`` applied pairwise, so each
foreach overload maps onto one per-tensor op and reuses its lowering; one
program then updates every parameter at once, in eager and in graphs.
List arguments are zipped; every other argument is passed to each call as it
is.  The ``.Tensor`` overloads of addcdiv/addcmul are left out: their 1-d
``scalars`` must stay on the host, as on CUDA.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from .registry import LOWERINGS, aten, lower

# foreach overload name -> the per-tensor overload names to try, in order.
_TARGET_OVERLOADS = {
    "default": ("default",),
    "Scalar": ("Scalar", "Tensor_Scalar", "default"),
    "ScalarList": ("Scalar", "Tensor_Scalar", "default"),
    "List": ("Tensor", "Tensor_Tensor", "default"),
    "Tensor": ("Tensor", "default"),
    "ScalarAndTensor": ("Scalar",),
}
# Ops whose scalar forms are another op: maximum(x, 2.0) is clamp_min(x, 2.0).
_RENAMED_FOR_SCALARS = {"maximum": "clamp_min", "minimum": "clamp_max"}


def _target(name: str, overload: str):
    if overload in ("Scalar", "ScalarList"):
        name = _RENAMED_FOR_SCALARS.get(name, name)
    packet = getattr(aten, name, None)
    if packet is None:
        return None
    for candidate in _TARGET_OVERLOADS.get(overload, ()):
        op = getattr(packet, candidate, None) if candidate in packet.overloads() else None
        if op in LOWERINGS:
            return op
    return None


def _zipped_positions(op) -> tuple:
    """Positions of the arguments that hold one entry per tensor."""
    return tuple(i for i, a in enumerate(op._schema.arguments) if str(a.type).startswith("List["))


def _foreach_lowering(target, zipped):
    """Call ``target``'s lowering once per entry; trailing arguments the target
    takes by keyword only (addcdiv's ``value``) are passed by keyword."""
    fn = LOWERINGS[target].fn
    params = target._schema.arguments
    n_positional = sum(not a.kwarg_only for a in params)

    def lowering(*args, **kwargs):
        calls = []
        for i in range(len(args[zipped[0]])):
            entry = [a[i] if pos in zipped else a for pos, a in enumerate(args)]
            by_name = {params[k].name: v for k, v in enumerate(entry[n_positional:], n_positional)}
            calls.append(fn(*entry[:n_positional], **by_name, **kwargs))
        return calls

    return lowering


@lower(aten._foreach_norm.Scalar, static_numbers=True)  # the norm's order picks the formula
def foreach_norm(self, ord=2, dtype=None):
    norm = LOWERINGS[aten.linalg_vector_norm.default].fn
    return [norm(x, ord, dtype=dtype) for x in self]


def _adam_update(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, *, lr, beta1, beta2, weight_decay, eps,
                 amsgrad, maximize, decoupled, grad_scale, found_inf):
    """One parameter's Adam(W) step, as PyTorch's fused kernels compute it."""
    if grad_scale is not None:
        grad = grad / grad_scale.astype(grad.dtype)
    stored_grad = grad  # the fused kernels leave the grads unscaled
    grad = -grad if maximize else grad
    if decoupled:
        new_param = param * (1 - lr * weight_decay)
    else:
        new_param, grad = param, grad + weight_decay * param
    exp_avg = exp_avg + (grad - exp_avg) * (1 - beta1)
    exp_avg_sq = exp_avg_sq * beta2 + (1 - beta2) * grad * grad
    step = step.astype(jnp.float32)
    bias_correction2_sqrt = jnp.sqrt(1 - beta2 ** step)
    if amsgrad:
        max_exp_avg_sq = jnp.maximum(max_exp_avg_sq, exp_avg_sq)
    second = max_exp_avg_sq if amsgrad else exp_avg_sq
    denom = jnp.sqrt(second) / bias_correction2_sqrt + eps
    new_param = new_param - (lr / (1 - beta1 ** step)) * exp_avg / denom
    new = (new_param, stored_grad, exp_avg, exp_avg_sq, max_exp_avg_sq)
    old = (param, stored_grad, exp_avg, exp_avg_sq, max_exp_avg_sq)
    if found_inf is not None:  # a GradScaler found inf/NaN: the step is skipped
        new = tuple(o if n is None else jnp.where(found_inf.reshape(()) != 0, o, n) for n, o in zip(new, old))
    return new


def _fused_adam_lowering(decoupled):
    def lowering(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1, beta2,
                 weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
        maxes = max_exp_avg_sqs if amsgrad else [None] * len(self)
        updates = [
            _adam_update(*group, lr=lr, beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps,
                         amsgrad=amsgrad, maximize=maximize, decoupled=decoupled, grad_scale=grad_scale,
                         found_inf=found_inf)
            for group in zip(self, grads, exp_avgs, exp_avg_sqs, maxes, state_steps)
        ]
        columns = [list(column) for column in zip(*updates)] or [[]] * 5
        columns[4] = columns[4] if amsgrad else []
        return tuple(columns)

    return lowering


lower(aten._fused_adamw.default, aten._fused_adamw.tensor_lr)(_fused_adam_lowering(decoupled=True))
lower(aten._fused_adam.default, aten._fused_adam.tensor_lr)(_fused_adam_lowering(decoupled=False))


def _register_all() -> None:
    for qualified in torch._C._dispatch_get_all_op_names():
        name, _, overload = qualified.removeprefix("aten::").partition(".")
        if not qualified.startswith("aten::_foreach_") or name.endswith("_") or overload.endswith("out"):
            continue
        op = getattr(getattr(aten, name), overload or "default")
        target = _target(name.removeprefix("_foreach_"), overload or "default")
        zipped = _zipped_positions(op)
        host_scalars = any(a.name == "scalars" and str(a.type) == "Tensor" for a in op._schema.arguments)
        if target is not None and zipped and not host_scalars and op not in LOWERINGS:
            lower(op)(_foreach_lowering(target, zipped))


_register_all()
