"""Property test: random programs of views and in-place ops, run on CPU and tpu in lockstep.

Each program starts from one or two small tensors, then applies 3-8 random
steps: a view op (a new live tensor aliasing an old one) or a mutation of a
live tensor (possibly through a view, possibly with another live tensor as
the source).  After every step every live tensor must agree with its CPU
twin: values, shape, stride, storage offset, dtype, ``_version``, its offset
inside its storage, and which live tensors share a storage.  A step that
raises on CPU must raise the same exception type on tpu and leave every
tensor unchanged.

The search space is kept small on purpose: every new (op, layout) pair costs
an XLA compile, so a bounded vocabulary of shapes lets 2,000 programs reuse
compiled programs and finish in a couple of minutes.

Writes whose result PyTorch leaves undefined are not generated: arithmetic
into a tensor whose elements overlap (``unfold``, ``expand``) and sources
that partially overlap their target.  CPU reports some of those with an
error; that error parity is a known gap, pinned by the xfail tests below.
"""

from __future__ import annotations

import os
import random

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

import torchtpu  # noqa: F401
from torchtpu.core import tensor as tpu_tensor

# A fixed seed by default, so the test command gives the same verdict on every run; a new seed explores
# (TORCHTPU_FUZZ_SEED=random, or ./scripts/fuzz.sh for a campaign of them).  Seeds that found bugs are
# named in the regression tests they left behind.
_SEED_SETTING = os.environ.get("TORCHTPU_FUZZ_SEED", "323856582")
SEED = random.randrange(1 << 32) if _SEED_SETTING == "random" else int(_SEED_SETTING)
EXAMPLES = int(os.environ.get("TORCHTPU_FUZZ_EXAMPLES", 2000))
print(f"test_views_fuzz: hypothesis seed {SEED} (set TORCHTPU_FUZZ_SEED={SEED} to replay)")

# Repeats weight the draw.  Python ints are compile-time constants of a
# program (floats are runtime values), so few distinct ints keep the cache hot.
BASE_SHAPES = [(3, 4), (3, 4), (3, 4), (2, 3, 2), (2, 1, 3), (0, 3), ()]
BASE_DTYPES = [torch.float32] * 4 + [torch.int64, torch.complex64, torch.bfloat16, torch.bool]
# Reinterpretations whose bit patterns read back exactly on both sides.
VIEW_DTYPES = [torch.int32, torch.int16, torch.uint8, torch.float32]
SCALARS = [-1, 2, 0.5, -1.5, 2.0, True]
FILL_VALUES = [0.5, -1.5, 3.0]  # floats, also into integer and bool tensors (truncation, nonzero)
CLAMP_BOUNDS = [(-1, 2), (0, None), (None, 1.5)]


# ---- the lockstep state ----------------------------------------------------


class Pair:
    """One live tensor: its CPU twin, its tpu twin, and whether arithmetic on it is well defined."""

    def __init__(self, cpu, tpu, home_dtypes):
        self.cpu, self.tpu = cpu, tpu
        # Dtypes whose values in this storage are "real" numbers (not a
        # reinterpretation of another dtype's bits); arithmetic stays on those.
        self.home_dtypes = home_dtypes

    @property
    def arithmetic_safe(self):
        return self.cpu.dtype in self.home_dtypes[0] and not self.home_dtypes[1]

    def taint(self):
        self.home_dtypes[1] = True


def storage_bytes(t: torch.Tensor) -> list:
    """The storage byte offsets every element of ``t`` covers, element by element."""
    if t.numel() == 0:
        return []
    n = t.untyped_storage().nbytes() // t.element_size()
    index = torch.arange(n).as_strided(t.shape, t.stride(), t.storage_offset()).reshape(-1)
    size = t.element_size()
    return [i * size + b for i in index.tolist() for b in range(size)]


def has_overlapping_elements(t: torch.Tensor) -> bool:
    covered = storage_bytes(t)
    return len(covered) != len(set(covered))


def well_defined_source(target: torch.Tensor, source: torch.Tensor) -> bool:
    """Reading ``source`` while writing ``target`` has one defined result."""
    if source.untyped_storage()._cdata != target.untyped_storage()._cdata:
        return True
    same_view = (
        source.dtype == target.dtype
        and source.shape == target.shape
        and source.stride() == target.stride()
        and source.storage_offset() == target.storage_offset()
    )
    return same_view or not set(storage_bytes(source)) & set(storage_bytes(target))


def assert_same_values(actual, expected, msg):
    """Exact equality, NaN equal to NaN (assert_close costs ~10 ms a call; this ~20 us)."""
    if expected.is_complex():
        actual, expected = torch.view_as_real(actual.resolve_conj()), torch.view_as_real(expected.resolve_conj())
    same = actual == expected
    if expected.is_floating_point():
        same |= actual.isnan() & expected.isnan()
    if not bool(same.all()):
        raise AssertionError(f"{msg}: values differ\n tpu: {actual}\n cpu: {expected}")


def assert_state_matches(live, where):
    by_storage = {}
    for k, p in enumerate(live):
        c, t = p.cpu, p.tpu
        msg = f"{where}: live tensor {k}"
        assert t.device.type == "tpu", msg
        assert t.dtype == c.dtype, f"{msg}: dtype {t.dtype} != {c.dtype}"
        assert t.shape == c.shape, f"{msg}: shape {tuple(t.shape)} != {tuple(c.shape)}"
        assert t.stride() == c.stride(), f"{msg}: stride {t.stride()} != {c.stride()}"
        assert t.storage_offset() == c.storage_offset(), f"{msg}: offset {t.storage_offset()} != {c.storage_offset()}"
        assert t._version == c._version, f"{msg}: _version {t._version} != {c._version}"
        assert t.untyped_storage().nbytes() == c.untyped_storage().nbytes(), msg
        assert t.is_contiguous() == c.is_contiguous(), msg
        if c.numel():  # an empty tensor's data_ptr is null on both; its storage's address is allocator-defined
            assert t.data_ptr() - t.untyped_storage().data_ptr() == c.data_ptr() - c.untyped_storage().data_ptr(), msg
        assert_same_values(t.cpu(), c, msg)
        by_storage.setdefault(c.untyped_storage()._cdata, set()).add(t.untyped_storage()._cdata)
    # Aliasing is the same: CPU storages map one-to-one onto tpu storages.
    tpu_ptrs = [next(iter(s)) for s in by_storage.values()]
    assert all(len(s) == 1 for s in by_storage.values()), f"{where}: one CPU storage became several tpu storages"
    assert len(set(tpu_ptrs)) == len(tpu_ptrs), f"{where}: distinct CPU storages share a tpu storage"


def run_both(fn, pair_args):
    """Apply ``fn`` to the CPU twins and to the tpu twins; the same exception type or none."""
    try:
        expected = fn(*[p.cpu for p in pair_args])
    except Exception as cpu_error:  # noqa: BLE001  (any CPU error must be mirrored)
        with pytest.raises(type(cpu_error)):
            fn(*[p.tpu for p in pair_args])
        return None, None
    actual = fn(*[p.tpu for p in pair_args])
    return expected, actual


# ---- strategies for one step ---------------------------------------------------


def to_tpu(cpu: torch.Tensor) -> torch.Tensor:
    """A tpu twin of a dense CPU tensor, same strides, without compiling a copy program.

    ``.to("tpu")`` compiles a copy per new shape (tested in test_tensor.py);
    here a transfer per fresh operand would dominate the run time.
    """
    in_storage_order = cpu.as_strided((cpu.numel(),), (1,), cpu.storage_offset())
    return tpu_tensor.from_host(in_storage_order).as_strided(cpu.shape, cpu.stride())


def random_values(data, shape, dtype):
    n = 1
    for s in shape:
        n *= s
    values = data.draw(st.lists(st.integers(-4, 4), min_size=n, max_size=n), label="values")
    base = torch.tensor(values, dtype=torch.int64).reshape(shape)
    if dtype == torch.bool:
        return base > 0
    if dtype.is_complex:
        return torch.complex(base.float(), base.flip(-1).float() if base.dim() else base.float()).to(dtype)
    return base.to(dtype)


def new_base(data):
    shape = data.draw(st.sampled_from(BASE_SHAPES), label="shape")
    dtype = data.draw(st.sampled_from(BASE_DTYPES), label="dtype")
    cpu = random_values(data, shape, dtype)
    if cpu.dim() == 2 and data.draw(st.booleans(), label="transposed base"):
        cpu = cpu.t().contiguous().t()  # a dense, non-row-major layout
    tpu = cpu.to("tpu") if data.draw(st.integers(0, 9), label="transfer with .to") == 0 else to_tpu(cpu)
    homes = {dtype, torch.float32} if dtype == torch.complex64 else {dtype}
    return Pair(cpu.clone(), tpu, [homes, False])


def dim_of(data, t, label="dim"):
    return data.draw(st.integers(-max(t.dim(), 1), max(t.dim(), 1) - 1), label=label)


# Menus of view parameters: each a few values, so layouts recur across programs.
SHAPE_MENU = [(-1,), (2, -1), (-1, 2), (1, -1, 2), (3, -1)]
INDEX_MENU = [slice(None), slice(1, None), slice(None, None, 2), slice(1, None, 2), slice(None, -1), 0, -1, None]
AS_STRIDED_MENU = [((2, 2), (1, 2), 0), ((3,), (2,), 1), ((2, 3), (0, 1), 0), ((2, 2), (3, 1), 1), ((4,), (1,), 2), ((0, 2), (1, 1), 0)]
VIEW_OPS = [
    "view", "reshape", "transpose", "permute", "t", "mT", "slice", "select", "narrow",
    "expand", "unsqueeze", "squeeze", "unbind", "split", "chunk", "diagonal",
    "as_strided", "unfold", "view_as_real", "view_as_complex", "data", "view_dtype", "flatten",
    "clone", "contiguous",
]


def draw_view(data, t):
    """A view op for tensor ``t`` as (name, fn); fn may legitimately raise."""
    kind = data.draw(st.sampled_from(VIEW_OPS), label="view op")
    nd = t.dim()
    if kind in ("view", "reshape"):
        shape = data.draw(st.sampled_from(SHAPE_MENU), label="shape")
        return kind, (lambda x: x.view(shape)) if kind == "view" else (lambda x: x.reshape(shape))
    if kind == "transpose":
        a, b = dim_of(data, t), dim_of(data, t)
        return kind, lambda x: x.transpose(a, b)
    if kind == "permute":
        perm = data.draw(st.permutations(range(nd)), label="perm")
        return kind, lambda x: x.permute(*perm)
    if kind == "t":
        return kind, lambda x: x.t()
    if kind == "mT":
        return kind, lambda x: x.mT
    if kind == "slice":
        index = [data.draw(st.sampled_from(INDEX_MENU), label="index") for _ in range(min(nd, 3))]
        if data.draw(st.booleans(), label="ellipsis"):
            index.insert(data.draw(st.integers(0, len(index)), label="ellipsis at"), Ellipsis)
        index = tuple(index)
        return kind, lambda x: x[index]
    if kind == "select":
        d, i = dim_of(data, t), data.draw(st.sampled_from([0, -1]), label="index")
        return kind, lambda x: x.select(d, i)
    if kind == "narrow":
        d = dim_of(data, t)
        start, length = data.draw(st.sampled_from([(0, 1), (1, 2), (0, 2), (1, 0)]), label="start, length")
        return kind, lambda x: x.narrow(d, start, length)
    if kind == "expand":
        if data.draw(st.booleans(), label="new leading dim"):
            return kind, lambda x: x.expand(2, *x.shape)
        return kind, lambda x: x.expand(*[2 if s == 1 else s for s in x.shape])
    if kind == "unsqueeze":
        d = data.draw(st.integers(-nd - 1, nd), label="dim")
        return kind, lambda x: x.unsqueeze(d)
    if kind == "squeeze":
        if data.draw(st.booleans(), label="all dims"):
            return kind, lambda x: x.squeeze()
        d = dim_of(data, t)
        return kind, lambda x: x.squeeze(d)
    if kind in ("unbind", "split", "chunk"):
        d = dim_of(data, t)
        k = data.draw(st.sampled_from([1, 2]), label="k")
        pick = data.draw(st.sampled_from([0, -1]), label="pick")
        fn = {
            "unbind": lambda x: x.unbind(d),
            "split": lambda x: x.split(k, dim=d),
            "chunk": lambda x: x.chunk(k, dim=d),
        }[kind]
        return kind, lambda x: fn(x)[pick]
    if kind == "diagonal":
        offset = data.draw(st.sampled_from([0, 1, -1]), label="offset")
        a, b = dim_of(data, t, "dim1"), dim_of(data, t, "dim2")
        return kind, lambda x: x.diagonal(offset, a, b)
    if kind == "as_strided":
        size, stride, offset = data.draw(st.sampled_from(AS_STRIDED_MENU), label="size, stride, offset")
        return kind, lambda x: x.as_strided(size, stride, offset)
    if kind == "unfold":
        d = dim_of(data, t)
        size, step = data.draw(st.sampled_from([(2, 1), (2, 2)]), label="size, step")
        return kind, lambda x: x.unfold(d, size, step)
    if kind == "view_as_real":
        return kind, torch.view_as_real
    if kind == "view_as_complex":
        return kind, torch.view_as_complex
    if kind == "data":
        return kind, lambda x: x.data
    if kind == "view_dtype":
        dtype = data.draw(st.sampled_from(VIEW_DTYPES), label="view dtype")
        return kind, lambda x: x.view(dtype)
    if kind == "clone":  # a device-side read through the view: a new storage
        return kind, lambda x: x.clone()
    if kind == "contiguous":
        return kind, lambda x: x.contiguous()
    return kind, lambda x: x.flatten()


def fresh_pair(data, shape, dtype=None, like=None):
    if dtype is None:  # mostly the target's dtype; sometimes one that needs a conversion
        dtype = data.draw(st.sampled_from([like, like, torch.float32, torch.int64, torch.bool]), label="source dtype")
    cpu = random_values(data, shape, dtype)
    return Pair(cpu, to_tpu(cpu), [{dtype}, False])


def draw_source(data, live, target):
    """A tensor to read while writing ``target``: a live tensor or a fresh one."""
    candidates = [
        p for p in live
        if p.arithmetic_safe or p.cpu.dtype == target.cpu.dtype
        if well_defined_source(target.cpu, p.cpu)
    ]
    if candidates and data.draw(st.booleans(), label="live source"):
        return data.draw(st.sampled_from(candidates), label="source")
    shape = tuple(target.cpu.shape)
    if shape and data.draw(st.booleans(), label="broadcast source"):
        shape = shape[data.draw(st.integers(0, len(shape)), label="drop leading"):]
    return fresh_pair(data, shape, like=target.cpu.dtype)


def draw_mutation(data, live, target):
    """A mutation of ``target`` as (name, fn, extra pairs fn reads)."""
    overlapping = has_overlapping_elements(target.cpu)
    kinds = ["fill_", "zero_"]
    if not overlapping:
        kinds += ["copy_", "setitem", "masked_fill_"]
        if target.arithmetic_safe:
            kinds += ["add_", "mul_", "add_tensor", "mul_tensor"]
            if not target.cpu.is_complex():  # tpu's clamp accepts complex; CPU raises (reported)
                kinds.append("clamp_")
    kind = data.draw(st.sampled_from(kinds), label="mutation")
    scalar = data.draw(st.sampled_from(SCALARS), label="scalar")
    if kind in ("add_", "mul_") and not torch.can_cast(torch.result_type(target.cpu, scalar), target.cpu.dtype):
        kind = "fill_"  # tpu misses CPU's can't-cast error (pinned by an xfail test below)
    if target.cpu.dtype == torch.uint8:
        # Out-of-range scalars for uint8: CPU wraps or raises, tpu differs (pinned in test_tensor.py).
        scalar = abs(scalar)
    if kind == "fill_":
        value = data.draw(st.sampled_from(FILL_VALUES), label="fill value")
        value = abs(value) if target.cpu.dtype == torch.uint8 else value
        return kind, lambda x: x.fill_(value), []
    if kind == "zero_":
        return kind, lambda x: x.zero_(), []
    if kind == "add_":
        return kind, lambda x: x.add_(scalar), []
    if kind == "mul_":
        return kind, lambda x: x.mul_(scalar), []
    if kind == "clamp_":
        # (None, None) is left out: CPU raises RuntimeError, the meta kernel ValueError (reported)
        low, high = data.draw(st.sampled_from(CLAMP_BOUNDS), label="bounds")
        return kind, lambda x: x.clamp_(low, high), []
    if kind == "masked_fill_":
        mask = fresh_pair(data, tuple(target.cpu.shape), torch.bool)
        return kind, lambda x, m: x.masked_fill_(m, scalar), [mask]
    source = draw_source(data, live, target)
    if kind.endswith("_tensor") and not torch.can_cast(torch.result_type(target.cpu, source.cpu), target.cpu.dtype):
        kind = "copy_"  # tpu misses CPU's can't-cast error for mul_ (pinned by an xfail test below)
    if kind == "copy_":
        return kind, lambda x, s: x.copy_(s), [source]
    if kind == "add_tensor":
        alpha = data.draw(st.sampled_from([1, 2, -1]), label="alpha")
        return kind, lambda x, s: x.add_(s, alpha=alpha), [source]
    if kind == "mul_tensor":
        return kind, lambda x, s: x.mul_(s), [source]
    # v[index] = value: basic indexing, then copy_ or fill_ of the selected view.
    index = tuple(data.draw(st.sampled_from(INDEX_MENU[:5]), label="index") for _ in target.cpu.shape[:2])
    index = index or Ellipsis
    if data.draw(st.booleans(), label="scalar value"):
        def setitem(x):
            x[index] = scalar
        return kind, setitem, []

    def setitem_tensor(x, s):
        x[index] = s[index] if s.shape == x.shape else s
    return kind, setitem_tensor, [source]


# ---- the property ------------------------------------------------------------------


@seed(SEED)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=False,
    suppress_health_check=list(HealthCheck),
    # Shrinking replays programs with new layouts, each an XLA compile: minutes.
    # The failing example's draws are printed in full; set TORCHTPU_FUZZ_SHRINK=1 to shrink.
    phases=[Phase.explicit, Phase.generate] + ([Phase.shrink] if os.environ.get("TORCHTPU_FUZZ_SHRINK") else []),
)
@given(st.data())
def test_random_view_and_mutation_programs_match_cpu(data):
    live = [new_base(data)]
    if data.draw(st.booleans(), label="second base"):
        live.append(new_base(data))
    assert_state_matches(live, "start")
    steps = data.draw(st.integers(3, 8), label="steps")
    for step in range(steps):
        action = data.draw(st.sampled_from(["view", "view", "mutate", "mutate", "mutate", "drop"]), label="action")
        target = data.draw(st.sampled_from(live), label="target")
        if action == "drop" and len(live) > 1:
            live.remove(target)  # the storage must outlive its dropped base
        elif action == "view" and len(live) < 6:
            name, fn = draw_view(data, target.cpu)
            expected, actual = run_both(fn, [target])
            if expected is not None:
                aliases = expected.untyped_storage()._cdata == target.cpu.untyped_storage()._cdata
                homes = target.home_dtypes if aliases else [{expected.dtype}, not target.arithmetic_safe]
                live.append(Pair(expected, actual, homes))
        else:
            name, fn, extra = draw_mutation(data, live, target)
            if not target.arithmetic_safe or any(not p.arithmetic_safe for p in extra):
                target.taint()  # bits written through a reinterpreting view
            run_both(fn, [target] + extra)
        assert_state_matches(live, f"seed {SEED}, after step {step} ({action})")


# ---- autograd's in-place check works on tpu ------------------------------------------


def _saved_tensor_modified(device):
    x = torch.tensor([1.0, 2.0, 3.0], device=device, requires_grad=True)
    a = x * 1.0
    b = a * a  # saves a for backward
    a.add_(1)
    b.backward(torch.ones_like(b))


def test_inplace_on_saved_tensor_raises_like_cpu():
    with pytest.raises(RuntimeError, match="modified by an inplace operation") as cpu:
        _saved_tensor_modified("cpu")
    with pytest.raises(RuntimeError, match="modified by an inplace operation") as tpu:
        _saved_tensor_modified("tpu")
    # Same version numbers in the message ("is at version 1; expected version 0").
    assert str(tpu.value).split("is at version")[1] == str(cpu.value).split("is at version")[1]


def test_inplace_on_view_of_saved_tensor_raises_like_cpu():
    def program(device):
        x = torch.arange(6.0, device=device).reshape(2, 3).requires_grad_()
        y = x * 2.0
        z = y * y
        y[0].mul_(3)  # a write through a view bumps the base's version
        z.backward(torch.ones_like(z))

    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        program("cpu")
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        program("tpu")


def test_gradient_through_views_and_inplace_matches_cpu():
    def program(device):
        x = torch.arange(6.0, device=device).reshape(2, 3).requires_grad_()
        y = x * 1.0
        y[:, 1].mul_(3)  # in-place on a view of a non-leaf: autograd rebases the view
        y.t().add_(1)
        (y * y).backward(torch.ones(2, 3, device=device))
        return y.detach(), x.grad

    (cy, cg), (ty, tg) = program("cpu"), program("tpu")
    torch.testing.assert_close(ty.cpu(), cy)
    torch.testing.assert_close(tg.cpu(), cg)


# ---- memory-overlap errors: CPU refuses, tpu currently does not -----------------------

_OVERLAP_XFAIL = pytest.mark.xfail(
    strict=True,
    reason="execution/strict.py runs the meta kernel on unaliased meta tensors, so "
    "TensorIterator's internal/partial overlap checks never fire (reported to the lead)",
)


@_OVERLAP_XFAIL
@pytest.mark.parametrize("write", [
    lambda x: x[:1].expand(4, 4).add_(1),
    lambda x: x[:1].expand(4, 4).copy_(x),
])
def test_write_to_self_overlapping_tensor_raises_like_cpu(write):
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        write(torch.zeros(4, 4))
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        write(torch.zeros(4, 4, device="tpu"))


@_OVERLAP_XFAIL
@pytest.mark.parametrize("write", [
    lambda x: x.add_(x.t()),
    lambda x: x.view(-1)[1:].copy_(x.view(-1)[:-1]),
])
def test_partially_overlapping_source_raises_like_cpu(write):
    with pytest.raises(RuntimeError, match="some elements of the input tensor and the written-to tensor"):
        write(torch.zeros(4, 4))
    with pytest.raises(RuntimeError, match="some elements of the input tensor and the written-to tensor"):
        write(torch.zeros(4, 4, device="tpu"))


def test_fill_of_expanded_view_matches_cpu():
    c, t = torch.arange(16.0).reshape(4, 4), torch.arange(16.0).reshape(4, 4).to("tpu")
    c[:1].expand(4, 4).fill_(7)
    t[:1].expand(4, 4).fill_(7)
    torch.testing.assert_close(t.cpu(), c)


def test_inplace_result_that_cannot_be_cast_raises_like_cpu():
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.ones(3, dtype=torch.int16).mul_(torch.tensor(1.5))
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.ones(3, dtype=torch.int16, device="tpu").mul_(torch.tensor(1.5, device="tpu"))
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.ones(3, dtype=torch.int16, device="tpu").mul_(1.5)


@pytest.mark.parametrize("select", [
    lambda b, m: b.masked_fill_(m, 2.0),
    lambda b, m: b.copy_(torch.where(m, torch.full_like(b, 2.0), b)),
])
def test_select_keeps_nan_payloads_written_through_a_bit_view(select):
    # Found by the fuzz test: XLA:CPU computes bfloat16 in float32 and canonicalises NaNs.
    results = []
    for device in ("cpu", "tpu"):
        base = torch.zeros(4, dtype=torch.bfloat16, device=device)
        base.view(torch.int16).fill_(-3)  # a NaN with a payload
        select(base, torch.tensor([True, False, False, False], device=device))
        results.append(base.view(torch.int16).cpu())
    assert results[1].tolist() == results[0].tolist() == [16384, -3, -3, -3]
