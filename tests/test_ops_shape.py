"""Shape lowerings (cat, flip, roll, repeat, triangles, padding, *_scatter, *_copy,
im2col/col2im) against CPU, plus tensor printing."""

import pytest
import torch
import torch.nn.functional as F
from oracle import check

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.bool,
          torch.complex64]


def make(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype) if not dtype.is_complex else \
            torch.randn(shape, generator=g, dtype=dtype)
    return torch.randint(-50, 50, shape, generator=g, dtype=dtype)


# ---- cat / stack ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_cat(dtype):
    check(lambda a, b: torch.cat([a, b], -1), make((2, 3), dtype), make((2, 1), dtype, 1))


@pytest.mark.parametrize("dim", [0, 1])
def test_cat_dims(dim):
    check(lambda a, b, c: torch.cat([a, b, c], dim), make((2, 3)), make((2, 3), seed=1), make((2, 3), seed=2))


def test_cat_mixed_dtypes_promote():
    check(lambda a, b, c: torch.cat([a, b, c]), make((2,), torch.int32), make((3,), torch.float16),
          make((1,), torch.bool))
    check(lambda a, b: torch.cat([a, b], 1), make((2, 1), torch.int64), make((2, 2), torch.float32))


def test_cat_legacy_empty_and_zero_size():
    # 1-d empty tensors are skipped whatever the other inputs' shape.
    check(lambda a, b: torch.cat([a, b, a], 1), torch.empty(0), make((2, 3)))
    check(lambda a, b: torch.cat([a, b]), make((0, 3)), make((2, 3)))
    check(lambda a: torch.cat([a, a]), torch.empty(0))


def test_cat_non_contiguous_out_and_grad():
    check(lambda a, b: torch.cat([a.t(), b[:, ::2]], 1), make((3, 4)), make((4, 6)))
    out = torch.empty(0)
    check(lambda a, b, o: torch.cat([a, b], out=o), make((2, 2)), make((1, 2)), out)
    a, b = make((2, 3)).requires_grad_(), make((1, 3)).requires_grad_()
    check(lambda a, b: torch.autograd.grad((torch.cat([a, b]) * torch.arange(9.).reshape(3, 3).to(a.device)).sum(),
                                           (a, b)), a, b)


def test_cat_errors_match_cpu():
    with pytest.raises(RuntimeError, match="Sizes of tensors must match"):
        torch.cat([make((2, 3)).to("tpu"), make((2, 4)).to("tpu")])


@pytest.mark.parametrize("dim", [0, 2, -1])
def test_stack(dim):
    check(lambda a, b: torch.stack([a, b], dim), make((2, 3)), make((2, 3), torch.int64, 1))
    check(lambda a: torch.stack([a, a, a]), torch.tensor(3.0))


# ---- flip / roll / repeat ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_flip_dtypes(dtype):
    check(lambda a: a.flip(-1), make((2, 3, 4), dtype))


@pytest.mark.parametrize("dims", [(0,), (0, 2), ()])
def test_flip_dims_non_contiguous(dims):
    check(lambda a: a.transpose(0, 2).flip(dims), make((2, 3, 4)))


def test_flip_scalar_and_rot90():
    check(lambda a: a.flip([0]), torch.tensor(2.0))
    check(lambda a: [torch.rot90(a, k) for k in range(-1, 4)], make((3, 4)))


@pytest.mark.parametrize("shifts,dims", [(-2, 1), ((1, 2), (0, 1)), (5, None)])
def test_roll(shifts, dims):
    check(lambda a: a.roll(shifts, dims) if dims is not None else a.roll(shifts), make((3, 4), torch.int64))
    check(lambda a: a.t().roll(shifts, dims) if dims is not None else a.t().roll(shifts), make((4, 3)))


def test_roll_empty_and_grad():
    check(lambda a: a.roll(2, 0), make((0, 3)))
    check(lambda a: torch.autograd.grad((a.roll(1, 1) * torch.arange(6.).reshape(2, 3).to(a.device)).sum(), a),
          make((2, 3)).requires_grad_())


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool])
def test_repeat_dtypes(dtype):
    check(lambda a: a.repeat(2, 1), make((2, 3), dtype))


@pytest.mark.parametrize("repeats", [(1, 3), (2, 2, 2), (0, 2)])
def test_repeat_and_tile(repeats):
    check(lambda a: (a.t().repeat(*repeats), a.tile(repeats[:1])), make((3, 2)))


def test_repeat_scalar_and_grad():
    check(lambda a: a.repeat(3, 2), torch.tensor(1.5))
    check(lambda a: torch.autograd.grad(a.repeat(2, 3).pow(2).sum(), a), make((2, 2)).requires_grad_())


# ---- triangles -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.complex64])
def test_tril_triu_dtypes(dtype):
    check(lambda a: (a.tril(), a.triu(1)), make((2, 3, 4), dtype))


@pytest.mark.parametrize("diagonal", [-1, 5, -5])
def test_tril_triu_diagonals(diagonal):
    check(lambda a: (a.mT.tril(diagonal), a.mT.triu(diagonal)), make((2, 3, 4)))


def test_tril_inplace_and_out():
    check(lambda a: a.tril_(1), make((3, 3)))
    check(lambda a, o: torch.triu(a, out=o), make((3, 3)), torch.empty(0))
    check(lambda a: a.tril(), make((0, 3)))


# ---- padding --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_constant_pad_dtypes(dtype):
    value = True if dtype == torch.bool else 3
    check(lambda a: F.pad(a, (1, 2), value=value), make((2, 3, 4), dtype))


@pytest.mark.parametrize("pad", [(0, 0, 2, 1), (1, -1, -1, 1), (1, 1, 1, 1, 1, 1)])
def test_constant_pad_amounts(pad):
    check(lambda a: F.pad(a, pad), make((2, 3, 4), torch.int64))


def test_constant_pad_float_value_and_grad():
    check(lambda a: F.pad(a, (1, 1), value=-2.5), make((2, 3)))
    check(lambda a: torch.autograd.grad((F.pad(a, (1, 2, -1, 0)) ** 2).sum(), a), make((3, 4)).requires_grad_())


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("shape,pad", [((1, 2, 5), (0, 3)), ((2, 4, 5), (1, 2, 2, 1)),
                                       ((1, 1, 3, 4, 5), (1, 1, 1, 2, 2, 1))])
def test_mode_pad_and_backward(mode, shape, pad):
    weights = torch.arange(1.0, 1.0 + torch.Size(shape).numel()).reshape(shape)

    def program(a):
        out = F.pad(a, pad, mode=mode)
        return out, torch.autograd.grad((out * out.detach()).sum(), a)

    check(program, make(shape).requires_grad_() * 1 + weights * 0)


def test_mode_pad_non_contiguous():
    check(lambda a: F.pad(a.transpose(-1, -2), (1, 2), mode="reflect"), make((2, 5, 4)))
    check(lambda a: F.pad(a, (1, 1), mode="replicate"), make((2, 3), torch.float64))
    check(lambda a: F.pad(a, (1, 2), mode="circular"), make((1, 2, 5)))


# ---- diagonals and *_scatter ---------------------------------------------------------------------------


@pytest.mark.parametrize("offset,dims", [(0, (-2, -1)), (1, (0, 2)), (-2, (2, 0))])
def test_diag_embed(offset, dims):
    check(lambda a: torch.diag_embed(a, offset, *dims), make((2, 3), torch.int64))


def test_diag_family():
    check(lambda a: (torch.diag(a), torch.diag(a, 1), torch.diagflat(a)), make((4,)))
    check(lambda a: (torch.diag(a), torch.diag(a, -1)), make((3, 4)))


@pytest.mark.parametrize("offset,dim1,dim2", [(0, 0, 1), (1, 1, 2), (-1, -1, 0)])
def test_diagonal_scatter(offset, dim1, dim2):
    base = make((3, 4, 5))
    src = make(tuple(base.diagonal(offset, dim1, dim2).shape), seed=1)
    check(lambda a, s: a.diagonal_scatter(s, offset, dim1, dim2), base, src)


@pytest.mark.parametrize("dim,start,end,step", [(1, 1, None, 2), (1, -3, -1, 1), (0, None, None, 3),
                                                (1, 2, 100, 1)])
def test_slice_scatter(dim, start, end, step):
    base = make((5, 6), torch.int64)
    src = make(tuple(base[(slice(None),) * dim + (slice(start, end, step),)].shape), torch.int64, 1)
    check(lambda a, s: a.slice_scatter(s, dim, start, end, step), base, src)


@pytest.mark.parametrize("dim,index", [(0, 1), (1, -1), (-1, 0)])
def test_select_scatter(dim, index):
    base = make((3, 4))
    check(lambda a, s: a.select_scatter(s, dim, index), base, make(tuple(base.select(dim, index).shape), seed=1))


def test_as_strided_scatter():
    check(lambda a, s: a.as_strided_scatter(s, (2, 2), (1, 3), 1), make((3, 4)), make((2, 2), seed=1))
    check(lambda a, s: a.as_strided_scatter(s, (3,), (4,)), make((3, 4)), make((3,), seed=1))


def test_view_writes_autograd():
    # Autograd of in-place writes into views goes through the *_scatter ops.
    def program(a):
        b = a.clone()
        b[1] = b[1] * 2
        b[:, 1:3] += 1
        b.diagonal().mul_(3)
        return torch.autograd.grad((b * b).sum(), a)

    check(program, make((4, 4)).requires_grad_())


# ---- copying variants ------------------------------------------------------------------------------------


def test_copy_variants():
    a = make((2, 3, 4))
    check(lambda x: torch.ops.aten.alias_copy(x), a)
    check(lambda x: x.narrow_copy(1, 1, 2), a)
    check(lambda x: x.narrow_copy(-1, -3, 2), a)
    check(lambda x: torch.ops.aten._reshape_copy(x, [4, -1]), a)
    check(lambda x: torch.ops.aten.view_copy(x, [6, 4]), a)
    check(lambda x: torch.ops.aten.expand_copy(x[:, :1], [5, 2, -1, 4]), a)
    check(lambda x: torch.permute_copy(x, (2, 0, 1)), a)
    check(lambda x: torch.split_with_sizes_copy(x, [1, 2], 1), a)
    check(lambda x: torch.unbind_copy(x, -1), a)
    check(lambda x: x.transpose(0, 2).reshape(-1), a)
    check(lambda x: x.t().flatten(), make((3, 5), torch.int32))


@pytest.mark.parametrize("fn", [
    torch.t_copy,
    lambda x: torch.t_copy(x[0, 0]),
    lambda x: torch.transpose_copy(x, 0, -1),
    lambda x: torch.slice_copy(x, 2, 1, None, 2),
    lambda x: torch.slice_copy(x, -1, -3, 100),
    lambda x: torch.select_copy(x, 2, -1),
    torch.squeeze_copy,
    lambda x: torch.squeeze_copy(x, 1),
    lambda x: torch.squeeze_copy(x, 0),
    lambda x: torch.squeeze_copy(x, (0, 1)),
    lambda x: torch.unsqueeze_copy(x, -1),
    torch.detach_copy,
    lambda x: torch.split_copy(x, 3, 2),
    lambda x: torch.split_copy(x, 2, 0),
    lambda x: torch.diagonal_copy(x, 1, 0, 2),
    lambda x: torch.diagonal_copy(x[:, 0], -1),
], ids=lambda f: "")
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_more_copy_variants_of_views(fn, dtype):
    x = make((3, 1, 4), dtype)
    if fn is torch.t_copy:
        x = x[:, 0]
    check(fn, x)


def test_unfold_backward():
    def program(a):
        windows = a.unfold(1, 3, 2)
        return torch.autograd.grad((windows * windows.detach()).sum(), a)

    check(program, make((2, 7)).requires_grad_())
    check(lambda g: torch.ops.aten.unfold_backward(g, [5, 4], 0, 3, 1), make((3, 4, 3)))


# ---- im2col / col2im ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel,dilation,padding,stride", [(2, 1, 0, 1), ((2, 3), (1, 2), (1, 0), (2, 1))])
def test_unfold_fold(kernel, dilation, padding, stride):
    args = dict(kernel_size=kernel, dilation=dilation, padding=padding, stride=stride)

    def program(x):
        cols = F.unfold(x, **args)
        back = F.fold(cols, x.shape[-2:], **args)
        return cols, back, torch.autograd.grad((cols * cols.detach()).sum(), x)

    check(program, make((2, 3, 6, 7)).requires_grad_(), atol=1e-5, rtol=1e-5)
    check(lambda x: F.unfold(x, **args), make((3, 6, 7)))


# ---- printing --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [
    torch.tensor(3.25, dtype=torch.float64),
    torch.arange(6.0).reshape(2, 3) / 7,
    torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 1e-9]),
    torch.arange(-3, 3),
    torch.tensor([True, False]),
    torch.arange(6, dtype=torch.int32).reshape(3, 2).t(),
    torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
    torch.tensor([1 + 2j, -0.5j]),
    torch.empty(0, 3),
    torch.arange(2000.0),
], ids=lambda v: f"{v.dtype}-{tuple(v.shape)}")
def test_repr_matches_cpu(value):
    on_tpu = value.to("tpu")
    # The numbers' formatting exactly; the suffix may wrap differently with the device added.
    assert torch._tensor_str._tensor_str(on_tpu, 7) == torch._tensor_str._tensor_str(value, 7)
    # CPU's repr with the device suffix first after the data, as PyTorch orders suffixes.
    cpu = repr(value)
    data_end = len("tensor(") + len(torch._tensor_str._tensor_str(value, 7) if value.numel() else "[]")
    expected = cpu[:data_end] + ", device='tpu:0'" + cpu[data_end:]
    assert "".join(repr(on_tpu).split()) == "".join(expected.split())
    assert str(on_tpu) == repr(on_tpu)
