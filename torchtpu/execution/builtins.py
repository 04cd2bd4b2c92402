"""Kernels that are not lowerings: allocation, metadata, transfers and host reads."""

from __future__ import annotations

import math

import torch
from torch._C import DispatchKey, DispatchKeySet

from .. import tensor
from ..ops import attention
from ..runtime import stats
from . import strict

aten = torch.ops.aten
_CPU_KEYS = DispatchKeySet(DispatchKey.CPU)

# Ops whose CPU kernel only touches sizes, strides and offsets.  Running them
# on CPU gives PyTorch's own views of our storages (the addresses are fake, and
# these kernels never read them).
METADATA_OPS = [
    aten.as_strided.default,
    aten.view.default,
    aten._reshape_alias.default,
    aten.unfold.default,
    aten.view_as_real.default,
    aten.view_as_complex.default,
    aten.set_.source_Storage,
    aten.set_.source_Storage_storage_offset,
]


def metadata_kernel(op):
    def kernel(*args, **kwargs):
        return op.redispatch(_CPU_KEYS, *args, **kwargs)

    return kernel


def _check_tpu_device(device):
    if device is not None and torch.device(device).type not in ("tpu", "privateuseone"):
        raise RuntimeError(f"torchtpu: expected a tpu device, got {device}")


def empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    _check_tpu_device(device)
    dtype = dtype or torch.get_default_dtype()
    t = tensor.empty(size, dtype)
    if memory_format not in (None, torch.contiguous_format, torch.preserve_format):
        return t.as_strided(size, torch.empty(size, device="meta", memory_format=memory_format).stride())
    return t


def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    _check_tpu_device(device)
    return tensor.empty(size, dtype or torch.get_default_dtype(), stride)


def resize_(self, size, memory_format=None):
    """Resize in place, keeping the old elements, like CPU's resize_."""
    size = tuple(size)
    stride = tensor.contiguous_strides(size)
    if memory_format not in (None, torch.contiguous_format, torch.preserve_format):
        stride = torch.empty(size, device="meta", memory_format=memory_format).stride()
    needed = (self.storage_offset() + sum((s - 1) * st for s, st in zip(size, stride)) + 1) * self.element_size()
    if all(size) and needed > self.untyped_storage().nbytes():
        old = self.detach().clone() if self.numel() else None
        fresh = tensor.empty((needed // self.element_size(),), self.dtype)
        if old is not None:
            fresh[self.storage_offset(): self.storage_offset() + old.numel()].copy_(old.reshape(-1))
        self.set_(fresh.untyped_storage(), self.storage_offset(), size, stride)
    else:
        self.set_(self.untyped_storage(), self.storage_offset(), size, stride)
    return self


def set_source_tensor(self, source):
    return self.set_(source.untyped_storage(), source.storage_offset(), source.shape, source.stride())


def set_empty(self):
    return self.set_(tensor.empty((0,), self.dtype).untyped_storage(), 0, (0,), (1,))


def copy_(self, src, non_blocking=False):
    """copy_ across devices; tpu to tpu goes through the lowering of aten.copy."""
    if self.device.type == "tpu" and src.device.type == "tpu":
        return strict.execute(aten.copy_.default, (self, src), {})
    if self.device.type == "tpu":
        src_tpu = tensor.from_host(src.to(self.dtype))
        if src.shape == self.shape and not (self.is_conj() or self.is_neg()):
            tensor.write(self, tensor.read(src_tpu))  # no program to compile for a plain upload
            return self
        return strict.execute(aten.copy_.default, (self, src_tpu), {})
    stats.host_syncs["copy to cpu"] += 1
    host = tensor.to_host(src)
    # The storage holds un-conjugated values; CPU's copy_ resolves the bits.
    if src.is_conj():
        host = host.conj()
    if src.is_neg():
        host = host._neg_view()
    self.copy_(host)
    return self


def to_copy(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None):
    """``.to(...)`` from tpu: allocate like CPU's _to_copy would, then copy.

    PyTorch's generic version asks for pinned host memory when
    ``non_blocking=True``, which a Python backend cannot provide; our copies to
    the host are blocking anyway.
    """
    like = torch.empty_strided(self.shape, self.stride(), dtype=self.dtype, device="meta")
    meta = aten._to_copy.default(like, dtype=dtype, memory_format=memory_format)
    target = self.device if device is None else torch.device(device)
    if target.type == "tpu":
        target = tensor.DEVICE
    out = torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype, device=target)
    return copy_(out, self)


def copy_from(self, dst, non_blocking=False):
    return copy_(dst, self, non_blocking)


def copy_from_and_resize(self, dst):
    if dst.shape != self.shape:
        dst.resize_(self.shape)
    return copy_(dst, self)


def local_scalar_dense(self):
    stats.host_syncs["item"] += 1
    return tensor.to_host(self).item()


def equal(self, other):
    stats.host_syncs["equal"] += 1
    return bool(self.shape == other.shape and torch.equal(tensor.to_host(self), tensor.to_host(other)))


class _FusedAttention(torch.autograd.Function):
    """Attention as two ops (ops/attention.py): one program forward, one backward."""

    @staticmethod
    def forward(ctx, query, key, value, bias, is_causal, scale):
        out, logsumexp = attention.sdpa_forward_op(query, key, value, bias, is_causal, scale)
        ctx.save_for_backward(query, key, value, bias, out, logsumexp)
        ctx.is_causal, ctx.scale = is_causal, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, bias, out, logsumexp = ctx.saved_tensors
        grads = attention.sdpa_backward_op(grad_out, query, key, value, bias, out, logsumexp, ctx.is_causal, ctx.scale)
        grad_bias = grads[3] if bias is not None and ctx.needs_input_grad[3] else None
        return grads[0], grads[1], grads[2], grad_bias, None, None


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
                                 enable_gqa=False):
    """``F.scaled_dot_product_attention`` on tpu, above autograd: one fused op each way.

    Dropout, grouped-query heads and unusual ranks take PyTorch's math path,
    which runs on the lowered ops.  (PyTorch picks fused SDPA backends for a
    PrivateUse1 device in C++ only, so this is where a Python backend can.)"""
    if dropout_p != 0.0 or enable_gqa or query.dim() != 4 or key.shape[:-2] != query.shape[:-2]:
        return aten._scaled_dot_product_attention_math(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)[0]
    if attn_mask is not None and attn_mask.dtype == torch.bool:  # True means "attend"
        attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill(~attn_mask, float("-inf"))
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    return _FusedAttention.apply(query, key, value, attn_mask, is_causal, scale)


AUTOGRAD_KERNELS = {
    aten.scaled_dot_product_attention.default: scaled_dot_product_attention,
}


KERNELS = {
    aten.empty.memory_format: empty_memory_format,
    aten.empty_strided.default: empty_strided,
    aten.resize_.default: resize_,
    aten.set_.source_Tensor: set_source_tensor,
    aten.set_.default: set_empty,
    aten.copy_.default: copy_,
    aten._to_copy.default: to_copy,
    aten._copy_from.default: copy_from,
    aten._copy_from_and_resize.default: copy_from_and_resize,
    aten._local_scalar_dense.default: local_scalar_dense,
    aten.equal.default: equal,
}
