"""Random sampling: shape, dtype, range, statistics, and replay under seeds and rng state.

The tpu stream is jax's, so values are compared with CPU only in
distribution: each test checks CPU and tpu satisfy the same properties.
"""

import pytest
import torch
import torch.nn.functional as F

N = 20000


def host(t):
    assert t.device.type == "tpu"
    return t.cpu()


def assert_moments(t, mean, std, tol=0.05):
    t = host(t).double()
    assert abs(t.mean().item() - mean) < tol * max(1.0, abs(std)), t.mean()
    assert abs(t.std().item() - std) < tol * max(1.0, abs(std)), t.std()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rand_randn(dtype):
    u = torch.rand(N, device="tpu", dtype=dtype)
    assert u.dtype == dtype and u.shape == (N,)
    assert host(u).min() >= 0 and host(u).max() < 1
    assert_moments(u, 0.5, (1 / 12) ** 0.5)
    z = torch.randn(4, N // 4, device="tpu", dtype=dtype)
    assert z.dtype == dtype and z.shape == (4, N // 4)
    assert_moments(z, 0.0, 1.0)


def test_uniform_normal_inplace_and_like():
    x = torch.empty(N, device="tpu")
    assert x.uniform_(-2, 3) is x
    assert host(x).min() >= -2 and host(x).max() < 3
    assert_moments(x, 0.5, 5 / 12 ** 0.5)
    assert x.normal_(2, 3) is x
    assert_moments(x, 2, 3)
    assert_moments(torch.rand_like(x), 0.5, (1 / 12) ** 0.5)
    assert_moments(torch.randn_like(x), 0, 1)
    view = torch.zeros(4, 6, device="tpu")[:, ::2]
    view.uniform_(5, 6)
    assert host(view).min() >= 5


def test_normal_overloads():
    mean, std = torch.full((N,), 5.0, device="tpu"), torch.full((N,), 2.0, device="tpu")
    assert_moments(torch.normal(mean, 2.0), 5, 2)
    assert_moments(torch.normal(mean, std), 5, 2)
    assert_moments(torch.normal(5.0, std), 5, 2)
    r = torch.normal(5.0, 2.0, (N,), device="tpu")
    assert r.shape == (N,) and r.dtype == torch.float32
    assert_moments(r, 5, 2)
    assert torch.normal(mean[:3, None], std[:4]).shape == (3, 4)


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8])
def test_randint(dtype):
    r = torch.randint(3, 10, (N,), device="tpu", dtype=dtype)
    assert r.dtype == dtype
    values = host(r)
    assert values.min() == 3 and values.max() == 9
    assert_moments(r, 6, (48 / 12) ** 0.5)
    assert host(torch.randint(5, (3, 4), device="tpu")).max() < 5
    assert host(torch.randint_like(r, 2)).max() <= 1


@pytest.mark.parametrize("dtype,upper", [(torch.int8, 127), (torch.uint8, 255), (torch.bool, 1),
                                         (torch.float32, 2 ** 24), (torch.bfloat16, 2 ** 8)])
def test_random_default_range(dtype, upper):
    values = host(torch.empty(N, device="tpu", dtype=dtype).random_()).double()
    assert values.min() >= 0 and values.max() <= upper
    assert values.max() > upper * 0.9  # spans the range
    assert torch.equal(values, values.floor())


def test_random_from_to():
    values = host(torch.empty(N, device="tpu").random_(5))
    assert set(values.unique().tolist()) == {0, 1, 2, 3, 4}
    values = host(torch.empty(N, device="tpu", dtype=torch.int64).random_(-5, 3))
    assert values.min() == -5 and values.max() == 2
    values = host(torch.empty(N, device="tpu", dtype=torch.int64).random_(-5, None))
    assert values.min() >= -5 and values.max() > 2 ** 60


def test_bernoulli_overloads():
    p = torch.full((N,), 0.3, device="tpu")
    for sample in (torch.bernoulli(p), torch.empty(N, device="tpu").bernoulli_(0.3),
                   torch.empty(N, device="tpu").bernoulli_(p), torch.bernoulli(p, 0.3)):
        values = host(sample)
        assert set(values.unique().tolist()) <= {0.0, 1.0}
        assert abs(values.mean().item() - 0.3) < 0.02
    x = torch.empty(5, device="tpu")
    assert x.bernoulli_(0.5) is x
    assert host(torch.bernoulli(torch.tensor([0.0, 1.0] * 4, device="tpu"))).tolist() == [0.0, 1.0] * 4


def test_other_distributions():
    x = torch.empty(N, device="tpu")
    e = host(x.exponential_(2.0))
    assert e.min() > 0 and abs(e.mean().item() - 0.5) < 0.03
    g = host(x.geometric_(0.5))
    assert g.min() >= 1 and torch.equal(g, g.floor()) and abs(g.mean().item() - 2) < 0.1
    ln = host(x.log_normal_(0, 0.5))
    assert ln.min() > 0 and abs(ln.log().mean().item()) < 0.03 and abs(ln.log().std().item() - 0.5) < 0.03
    c = host(x.cauchy_(1.0, 2.0))
    assert abs(c.median().item() - 1.0) < 0.1  # the median, since the mean does not exist


def test_multinomial():
    probs = torch.tensor([0.0, 1.0, 2.0, 3.0, 0.0], device="tpu")
    for _ in range(5):
        s = host(torch.multinomial(probs, 3))
        assert s.dtype == torch.int64 and sorted(s.tolist()) == [1, 2, 3]  # without replacement: distinct
    rows = torch.tensor([[0.0, 1.0, 2.0, 3.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0]], device="tpu")
    s = host(torch.multinomial(rows, N, replacement=True))
    assert s.shape == (2, N)
    counts = torch.bincount(s[0], minlength=5).double() / N
    torch.testing.assert_close(counts, torch.tensor([0, 1 / 6, 2 / 6, 3 / 6, 0], dtype=torch.float64), atol=0.02, rtol=0)
    assert (s[1] == 0).all()


def test_randperm():
    for n in (1, 10, 1000):
        p = torch.randperm(n, device="tpu")
        assert p.dtype == torch.int64 and p.shape == (n,)
        assert torch.equal(host(p).sort().values, torch.arange(n))
    assert torch.randperm(10, device="tpu", dtype=torch.int32).dtype == torch.int32


def _draw_all():
    return [host(t) for t in (
        torch.rand(8, device="tpu"), torch.randn(8, device="tpu"), torch.randint(0, 100, (8,), device="tpu"),
        torch.randperm(8, device="tpu"), torch.bernoulli(torch.full((8,), 0.5, device="tpu")),
        torch.multinomial(torch.ones(8, device="tpu"), 4), F.dropout(torch.ones(8, device="tpu"), 0.5))]


def test_manual_seed_replays():
    torch.manual_seed(123)
    first = _draw_all()
    torch.manual_seed(123)
    second = _draw_all()
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    torch.manual_seed(124)
    assert not torch.equal(_draw_all()[0], first[0])


def test_rng_state_replays():
    state = torch.tpu.get_rng_state()
    first = _draw_all()
    torch.tpu.set_rng_state(state)
    second = _draw_all()
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    # successive draws differ
    assert not torch.equal(torch.rand(8, device="tpu").cpu(), torch.rand(8, device="tpu").cpu())


def test_a_tpu_generator_replays_its_own_stream_independent_of_the_global_one():
    gen = torch.Generator(device="tpu")
    assert gen.device == torch.device("tpu", 0)
    gen.manual_seed(7)
    first = torch.empty(6, device="tpu").exponential_(generator=gen).cpu()
    second = torch.rand(6, device="tpu", generator=gen).cpu()
    state = gen.get_state()
    third = torch.rand(6, device="tpu", generator=gen).cpu()
    gen.manual_seed(7)
    torch.rand(6, device="tpu")  # the global stream moves; the generator's must not
    assert torch.equal(torch.empty(6, device="tpu").exponential_(generator=gen).cpu(), first)
    assert torch.equal(torch.rand(6, device="tpu", generator=gen).cpu(), second)
    gen.set_state(state)
    assert torch.equal(torch.rand(6, device="tpu", generator=gen).cpu(), third)
    assert not torch.equal(first, second)


def test_a_cpu_generator_for_a_tpu_op_raises_like_cuda():
    with pytest.raises(RuntimeError, match="Expected a 'tpu' device type for generator but found 'cpu'"):
        torch.rand(2, device="tpu", generator=torch.Generator())
