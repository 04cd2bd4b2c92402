"""Indexing lowerings against CPU: advanced indexing, index_put, index_*, gather/scatter,
masks, take/put, embedding backward, searchsorted/bucketize, unique, histc."""

import pytest
import torch
import torch.nn.functional as F
from oracle import check

DTYPES = [torch.float32, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool, torch.complex64]


def make(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return torch.randint(-50, 50, shape, generator=g, dtype=dtype)


def idx(*values):
    return torch.tensor(values, dtype=torch.int64)


# ---- index.Tensor -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_dtypes(dtype):
    check(lambda a, i: a[i], make((4, 3), dtype), idx(0, -1, 2, 2))


@pytest.mark.parametrize("where", [
    lambda a, i, j: a[:, i],
    lambda a, i, j: a[i, :, j],          # separated advanced indices go first
    lambda a, i, j: a[i[:, None], j],    # broadcast index tensors
    lambda a, i, j: a[..., j],
    lambda a, i, j: a[None, i, 1:, None],
    lambda a, i, j: a[i, j, 0],
    lambda a, i, j: a[torch.tensor(1, device=a.device)],  # 0-dim index tensor
    lambda a, i, j: a[i[:0]],
    lambda a, i, j: a.transpose(0, 2)[j],
])
def test_index_forms(where):
    check(where, make((3, 4, 5)), idx(0, -1, 2), idx(1, 0, 3))


def test_index_int32_indices():
    check(lambda a, i: a[i], make((4, 3)), torch.tensor([3, 0], dtype=torch.int32))


@pytest.mark.parametrize("where", [
    lambda a, m: a[m],
    lambda a, m: a[m[:, 0]],
    lambda a, m: a[:, m[0]],
    lambda a, m: a[m[:, 0], 1:],
    lambda a, m: a[m & False],
])
def test_index_bool_mask(where):
    check(where, make((3, 3)), make((3, 3), torch.bool, seed=1))


def test_index_gradient():
    def program(a, i):
        return torch.autograd.grad((a[i] * torch.arange(1.0, 4.0, device=a.device)).sum(), a)

    check(program, make((4, 3)).requires_grad_(), idx(1, 1, 3, 0))  # duplicates accumulate


def test_index_out_of_range_raises_like_cpu():
    a = make((3, 4)).to("tpu")
    with pytest.raises(IndexError, match="index 5 is out of bounds for dimension 0 with size 3"):
        a[idx(0, 5).to("tpu")]
    with pytest.raises(IndexError, match="index -5 is out of bounds for dimension 1 with size 4"):
        a[:, idx(-5).to("tpu")]
    with pytest.raises(IndexError, match="too many indices"):
        a[idx(0).to("tpu"), idx(0).to("tpu"), idx(0).to("tpu")]
    with pytest.raises(IndexError, match="shape of the mask"):
        a[torch.ones(2, dtype=torch.bool, device="tpu")]


def test_index_with_cpu_indices():
    """As on CUDA, a device tensor accepts CPU index tensors, for reads and writes."""
    a = make((3, 4))
    assert torch.equal(a.to("tpu")[idx(2, 0)].cpu(), a[idx(2, 0)])
    t = a.to("tpu")
    t[idx(2, 0)] = 7
    a[idx(2, 0)] = 7
    assert torch.equal(t.cpu(), a)


# ---- index_put ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_index_put_accumulate_duplicates(dtype):
    check(lambda a, i, v: a.index_put((i,), v, accumulate=True), make((4, 2), dtype), idx(1, 1, 3, 1),
          make((4, 2), dtype, seed=1))


def test_index_put_forms():
    check(lambda a, i, v: a.index_put((i,), v), make((4, 3)), idx(2, -1), make((2, 3), seed=1))
    check(lambda a, i, v: torch.ops.aten.index_put(a, [None, i], v), make((4, 3)), idx(2, 0), torch.tensor(7.0))
    check(lambda a, i, j, v: a.index_put_((i, j), v, accumulate=True), make((4, 3)), idx(0, 0, 1), idx(2, 2, 0),
          make((3,), seed=1))


def test_setitem():
    def program(a, i, m):
        a = a.clone()
        a[i] = 5.0
        a[:, i[:1]] = -1.0
        a[m] = 0.5
        a[m[:, 0]] += 1.0
        return a

    check(program, make((4, 4)), idx(3, 1), make((4, 4), torch.bool, seed=2))


def test_setitem_mask_with_values():
    def program(a, m, v):
        a = a.clone()
        a[m] = v[: int(m.sum())]
        return a

    check(program, make((3, 4)), make((3, 4), torch.bool, seed=3), make((12,), seed=1))
    check(lambda a, m, v: a.index_put((m,), v), make((3, 2)), torch.tensor([True, False, True]), make((2, 2)))


@pytest.mark.xfail(reason="compiled index_put cannot raise for out-of-range indices: the write is dropped",
                   strict=True)
def test_index_put_out_of_range_raises():
    a = make((3,)).to("tpu")
    with pytest.raises(IndexError):
        a.index_put_((idx(7).to("tpu"),), torch.tensor(1.0, device="tpu"))


# ---- index_select / add / copy / fill ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_select_dtypes(dtype):
    check(lambda a, i: (a.index_select(0, i), a.t().index_select(-1, i)), make((4, 3), dtype), idx(3, 0, 0))


def test_index_select_edge_shapes_and_out():
    check(lambda a, i: a.index_select(0, i), torch.tensor(2.5), idx(0))
    check(lambda a, i: a.index_select(1, i), make((2, 3)), torch.tensor(1))
    check(lambda a, i: a.index_select(0, i), make((0, 3)), idx())
    check(lambda a, i, o: torch.index_select(a, 1, i, out=o), make((2, 3)), idx(2), torch.empty(0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.float64])
def test_index_add_copy_fill(dtype):
    a, src = make((5, 3), dtype), make((3, 3), dtype, seed=1)
    check(lambda a, i, s: a.index_add(0, i, s), a, idx(4, 0, 4), src)
    check(lambda a, i, s: a.index_add(0, i, s, alpha=2), a, idx(4, 0, 4), src)
    check(lambda a, i, s: a.index_copy(0, i, s), a, idx(4, 0, 2), src)
    check(lambda a, i: (a.index_fill(1, i, 3), a.clone().index_fill_(-1, i, torch.tensor(2))), a, idx(0, 2))


def test_index_add_grad_and_reduce():
    check(lambda a, i, s: torch.autograd.grad((a.index_add(1, i, s) ** 2).sum(), (a, s)),
          make((2, 4)).requires_grad_(), idx(3, 3), make((2, 2), seed=1).requires_grad_())
    for reduce in ["prod", "mean", "amax", "amin"]:
        for include_self in [True, False]:
            check(lambda a, i, s: a.index_reduce(0, i, s, reduce, include_self=include_self), make((4, 2)),
                  idx(1, 1, 3), make((3, 2), seed=1))


# ---- gather / scatter ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16, torch.complex64])
def test_gather_dtypes(dtype):
    check(lambda a, i: (a.gather(1, i), a.gather(0, i[:2] % 3)), make((3, 4), dtype), idx([0, 3], [1, 1], [2, 0]))


def test_gather_shapes_and_grad():
    check(lambda a, i: a.gather(-1, i), make((2, 3, 4)), torch.zeros(2, 2, 1, dtype=torch.long))
    check(lambda a, i: a.gather(0, i), torch.tensor(3.0), torch.tensor(0))
    check(lambda a, i: a.t().gather(0, i), make((3, 4)), idx([0, 2], [1, 0]))
    check(lambda a, i: torch.autograd.grad((a.gather(1, i) ** 2).sum(), a), make((3, 4)).requires_grad_(),
          idx([0, 0], [1, 3], [2, 2]))
    check(lambda a, i: torch.take_along_dim(a, i, 1), make((3, 4)), idx([0, 3], [1, 1], [2, 0]))
    check(lambda a, i: torch.take_along_dim(a, i), make((3, 4)), idx(11, 0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_scatter_src_value(dtype):
    a, s = make((3, 4), dtype), make((3, 4), dtype, seed=1)
    i = idx([0, 3], [1, 2], [2, 0])
    check(lambda a, i, s: a.scatter(1, i, s), a, i, s)
    check(lambda a, i: a.scatter(0, i[:2] % 3, 1), a, i)
    check(lambda a, i, s: a.clone().scatter_(1, i, s), a, i, s)


def test_scatter_legacy_reduce_and_add():
    a, s, i = make((3, 4)), make((3, 4), seed=1), idx([0, 0], [1, 1], [2, 3])
    check(lambda a, i, s: a.scatter(1, i, s, reduce="add"), a, i, s)
    check(lambda a, i, s: a.scatter(1, i, s, reduce="multiply"), a, i, s)
    check(lambda a, i: a.scatter(1, i, 2.0, reduce="multiply"), a, i)
    check(lambda a, i, s: a.scatter_add(1, i, s), a, i, s)
    check(lambda a, i, s: a.scatter_add(0, i.t(), s), make((4, 3), torch.int64), i, make((4, 3), torch.int64))


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self):
    i = idx([0, 0, 2], [1, 1, 1])
    check(lambda a, i, s: a.scatter_reduce(1, i, s, reduce, include_self=include_self), make((2, 4)), i,
          make((2, 3), seed=1))
    check(lambda a, i, s: a.scatter_reduce(1, i, s, reduce, include_self=include_self), make((2, 4), torch.int64),
          i, make((2, 3), torch.int64, seed=1))


def test_scatter_grad():
    def program(a, s, i):
        return torch.autograd.grad((a.scatter(1, i, s) ** 2).sum() + (a.scatter_add(1, i, s) ** 3).sum(), (a, s))

    check(program, make((2, 4)).requires_grad_(), make((2, 2), seed=1).requires_grad_(), idx([0, 3], [2, 1]))


@pytest.mark.xfail(reason="compiled gather cannot raise for out-of-range indices (XLA clamps)", strict=True)
def test_gather_out_of_range_raises():
    a = make((3,)).to("tpu")
    with pytest.raises(RuntimeError):
        a.gather(0, idx(3).to("tpu")).cpu()


# ---- masks --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_masked_select_and_scatter(dtype):
    a, m, s = make((3, 4), dtype), make((3, 4), torch.bool, seed=1), make((12,), dtype, seed=2)
    check(lambda a, m: a.masked_select(m), a, m)
    check(lambda a, m: a.masked_select(m[0]), a, m)  # broadcasting mask
    check(lambda a, m, s: a.masked_scatter(m, s), a, m, s)
    check(lambda a, m, s: a.clone().masked_scatter_(m[:, :1], s.reshape(3, 4)), a, m, s)


def test_masked_edge_cases_and_grad():
    check(lambda a, m: a.masked_select(m), torch.tensor(2.0), torch.tensor(True))
    check(lambda a, m: a.masked_select(m), make((0, 3)), torch.zeros(0, 3, dtype=torch.bool))
    check(lambda a, m: a.t().masked_select(m), make((4, 3)), make((3, 4), torch.bool, seed=1))
    check(lambda a, m: torch.autograd.grad((a.masked_select(m) ** 2).sum(), a), make((3, 4)).requires_grad_(),
          make((3, 4), torch.bool, seed=1))
    check(lambda a, m, s: torch.autograd.grad((a.masked_scatter(m, s) ** 2).sum(), (a, s)),
          make((2, 3)).requires_grad_(), make((2, 3), torch.bool, seed=1), make((6,), seed=2).requires_grad_())
    with pytest.raises(RuntimeError, match="BoolTensor"):
        make((2,)).to("tpu").masked_select(torch.ones(2, dtype=torch.int64, device="tpu"))


@pytest.mark.parametrize("value", [make((3, 4), torch.int64) > 0, make((2, 0, 3)), torch.tensor(0.0),
                                   torch.tensor(3), make((5,), torch.float32) > 0.5],
                         ids=["2d", "empty", "scalar0", "scalar", "1d"])
def test_nonzero_argwhere_where(value):
    check(lambda a: (a.nonzero(), torch.argwhere(a), torch.nonzero(a, as_tuple=True), torch.where(a != 0)), value)


# ---- take / put -----------------------------------------------------------------------------------------------


def test_take_put():
    check(lambda a, i: a.take(i), make((3, 4)), idx([0, -1], [5, 5]))
    check(lambda a, i: a.t().take(i), make((3, 4), torch.int64), idx(1, 2, 3))
    check(lambda a, i, s: a.put(i, s), make((3, 4)), idx(0, -1, 6), make((3,), seed=1))
    check(lambda a, i, s: a.put(i, s, accumulate=True), make((3, 4)), idx(0, 0, 6), make((3,), seed=1))
    check(lambda a, i, s: a.clone().put_(i, s, accumulate=True), make((2, 2), torch.int64), idx(3, 3),
          make((2,), torch.int64, seed=1))


# ---- embedding backward -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("padding_idx", [None, 2])
@pytest.mark.parametrize("scale_grad_by_freq", [False, True])
def test_embedding_backward(padding_idx, scale_grad_by_freq):
    def program(w, i):
        out = F.embedding(i, w, padding_idx=padding_idx, scale_grad_by_freq=scale_grad_by_freq)
        return out, torch.autograd.grad((out * out.detach()).sum(), w)

    check(program, make((5, 3)).requires_grad_(), idx([0, 2, 2], [4, 0, 0]))


# ---- searchsorted / bucketize -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_searchsorted(dtype):
    seq = torch.tensor([1, 3, 3, 5, 7]).to(dtype)
    vals = torch.tensor([[0, 3, 8], [5, 1, 7]]).to(dtype)
    check(lambda s, v: torch.searchsorted(s, v), seq, vals)
    check(lambda s, v: torch.searchsorted(s, v, right=True), seq, vals)
    check(lambda s, v: torch.searchsorted(s, v, side="right", out_int32=True), seq, vals)
    check(lambda s: torch.searchsorted(s, 3), seq)
    check(lambda s, v: torch.searchsorted(s, v), seq.repeat(2, 1), vals)  # batched sequences
    check(lambda s, v, o: torch.searchsorted(s.flip(0), v, sorter=o), seq, vals, idx(4, 3, 2, 1, 0))
    check(lambda v, b: (torch.bucketize(v, b), torch.bucketize(v, b, right=True, out_int32=True)), vals, seq)


# ---- unique / histc ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_unique(dtype):
    a = make((4, 5), dtype) % 4 if dtype != torch.bool else make((4, 5), dtype)
    check(lambda a: torch.unique(a), a)
    check(lambda a: torch.unique(a, return_inverse=True, return_counts=True), a)
    check(lambda a: torch.unique(a.t(), sorted=False, return_counts=True), a)


def test_unique_empty():
    check(lambda a: torch.unique(a, return_inverse=True), make((0, 3)))


def test_histc():
    check(lambda a: torch.histc(a, bins=5), make((40,)))
    check(lambda a: torch.histc(a, bins=4, min=-1, max=1), make((40,)))
    check(lambda a: torch.histc(a, bins=3), torch.full((4,), 2.0))
    check(lambda a: torch.histc(a, bins=6, min=0, max=3), torch.tensor([0.0, 0.5, 3.0, 3.5, -1.0, 1.0]))


_NAN_WITH_PAYLOAD = -3  # int16 bits of a bfloat16/float16 NaN with a payload

_BIT_MOVING_WRITES = {
    "index_copy_": lambda x, src, idx: x.index_copy_(0, idx, src),
    "index_put_": lambda x, src, idx: x.index_put_((idx,), src),
    "setitem": lambda x, src, idx: x.__setitem__(idx, src),
}  # not scatter_: CPU's own scatter_ canonicalises NaNs


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("write", sorted(_BIT_MOVING_WRITES))
def test_indexed_writes_move_16_bit_floats_bit_for_bit(write, dtype):
    """Copies through an index move bits, as on CPU (NaN payloads kept). On XLA:CPU the
    16-bit float scatter goes through float32 unless it scatters the bit patterns, which
    also keeps it in place (no copy of the whole destination)."""
    results = []
    for device in ("cpu", "tpu"):
        x = torch.zeros(6, 3, dtype=dtype, device=device)
        src = torch.empty(2, 3, dtype=dtype, device=device)
        src.view(torch.int16).fill_(_NAN_WITH_PAYLOAD)
        src.view(torch.int16)[1, 0] = 15360  # 1.0 in float16, 1.875 in bfloat16
        _BIT_MOVING_WRITES[write](x, src, torch.tensor([4, 1], device=device))
        results.append(x.view(torch.int16).cpu())
    assert torch.equal(results[1], results[0])


def test_index_copy_into_a_bfloat16_cache_under_compile_matches_cpu():
    """The KV-cache write pattern (a paged cache updated in place inside a compiled step)."""
    def step(cache, slots, new):
        cache.view(-1, 4).index_copy_(0, slots, new)
        return cache.float().sum(dim=(1, 2))

    compiled = torch.compile(step, backend="tpu", dynamic=False)
    cpu_cache = torch.randn(8, 2, 4).to(torch.bfloat16)
    tpu_cache = cpu_cache.to("tpu")
    for k in range(3):
        slots = torch.tensor([k, 5 + k])
        new = torch.randn(2, 4).to(torch.bfloat16)
        expected = step(cpu_cache, slots, new)
        got = compiled(tpu_cache, slots.to("tpu"), new.to("tpu"))
        torch.testing.assert_close(got.cpu(), expected)
        assert torch.equal(tpu_cache.cpu().view(torch.int16), cpu_cache.view(torch.int16))
