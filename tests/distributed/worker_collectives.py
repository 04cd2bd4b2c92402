"""Every collective and reduce op on tpu tensors, checked against CPU math (any world size >= 2).

Each rank knows every rank's input (a formula of the rank), so it computes the
expected result with plain torch on CPU and compares dtype, shape and values,
exactly wherever the math is exact.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import torchtpu  # noqa: F401
from worker_common import RANK, WORLD, run

DEV = "tpu"
RANKS = range(WORLD)
DTYPES = (torch.float32, torch.bfloat16, torch.int64)
BIG = 1 << 40  # int64 values past int32: a silent int32 path would lose them


def value(r: int, dtype: torch.dtype, shape=(4, 3), small: bool = False) -> torch.Tensor:
    """Rank r's input: distinct per rank, exact in bfloat16, past int32 for int64."""
    n = 1
    for s in shape:
        n *= s
    base = torch.arange(n, dtype=torch.float64).reshape(shape)
    if small:  # for PRODUCT: stays exact in bfloat16 across ranks
        v = (base + r) % 3 - 1
    else:
        v = base * (r + 1) - 3 * r + (0.5 if dtype.is_floating_point else 0)
    v = v.to(dtype)
    if dtype == torch.int64 and not small:
        v = v + BIG * (r + 1)
    return v


def fold(fn, xs):
    out = xs[0].clone()
    for x in xs[1:]:
        out = fn(out, x)
    return out


REDUCERS = {
    "SUM": (dist.ReduceOp.SUM, lambda xs: fold(torch.add, xs)),
    "MAX": (dist.ReduceOp.MAX, lambda xs: torch.stack(xs).amax(0)),
    "MIN": (dist.ReduceOp.MIN, lambda xs: torch.stack(xs).amin(0)),
    "PRODUCT": (dist.ReduceOp.PRODUCT, lambda xs: fold(torch.mul, xs)),
}


def expected_avg(xs, dtype):
    return (sum(x.double() for x in xs) / WORLD).to(dtype)


def check_all_reduce(c):
    for dtype in DTYPES:
        for name, (op, reduce) in REDUCERS.items():
            small = name == "PRODUCT"
            xs = [value(r, dtype, small=small) for r in RANKS]
            t = xs[RANK].to(DEV)
            dist.all_reduce(t, op=op)
            c.equal(f"all_reduce {name} {dtype}", t, reduce(xs))
        if dtype.is_floating_point:
            xs = [value(r, dtype) for r in RANKS]
            t = xs[RANK].to(DEV)
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
            c.equal(f"all_reduce AVG {dtype}", t, expected_avg(xs, dtype), atol=1e-6)
            for factor in (0.25, torch.tensor(0.5), torch.tensor(0.5, device=DEV)):
                t = xs[RANK].to(DEV)
                dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor))
                f = float(factor)
                c.equal(f"all_reduce PREMUL_SUM({type(factor).__name__} {f}) {dtype}", t,
                        fold(torch.add, [(x.double() * f) for x in xs]).to(dtype), atol=1e-6)
        # through a non-contiguous view: the rest of the storage must be untouched
        xs = [value(r, dtype) for r in RANKS]
        x = xs[RANK].to(DEV)
        dist.all_reduce(x[:, 1])
        want = xs[RANK].clone()
        want[:, 1] = fold(torch.add, [v[:, 1] for v in xs])
        c.equal(f"all_reduce through view x[:, 1] {dtype}", x, want)
    # bitwise ops on integers and bool
    ints = [torch.tensor([0b1100, 0b1010, 7, -1], dtype=torch.int64) + r for r in RANKS]
    bools = [torch.tensor([True, False, r == 0, True]) for r in RANKS]
    for name, op, fn in (("BAND", dist.ReduceOp.BAND, torch.bitwise_and), ("BOR", dist.ReduceOp.BOR,
                         torch.bitwise_or), ("BXOR", dist.ReduceOp.BXOR, torch.bitwise_xor)):
        for label, xs in (("int64", ints), ("bool", bools)):
            t = xs[RANK].to(DEV)
            dist.all_reduce(t, op=op)
            c.equal(f"all_reduce {name} {label}", t, fold(fn, xs))
    for name, (op, _) in REDUCERS.items():
        t = bools[RANK].to(DEV)
        dist.all_reduce(t, op=op)
        any_or_all = torch.stack(bools).any(0) if name in ("SUM", "MAX") else torch.stack(bools).all(0)
        c.equal(f"all_reduce {name} bool", t, any_or_all)
    # 0-dim, and errors the dtype rules give
    t = torch.tensor(float(RANK + 1), device=DEV)
    dist.all_reduce(t)
    c.equal("all_reduce 0-dim", t, torch.tensor(float(sum(r + 1 for r in RANKS))))
    c.raises("AVG on int64 is refused", RuntimeError, ["all_reduce", "AVG"],
             lambda: dist.all_reduce(torch.ones(2, dtype=torch.int64, device=DEV), op=dist.ReduceOp.AVG))
    c.raises("BAND on float is refused", RuntimeError, ["all_reduce", "BAND"],
             lambda: dist.all_reduce(torch.ones(2, device=DEV), op=dist.ReduceOp.BAND))


def check_broadcast_reduce(c):
    for dtype in DTYPES:
        xs = [value(r, dtype) for r in RANKS]
        for root in RANKS:
            t = xs[RANK].to(DEV)
            dist.broadcast(t, src=root)
            c.equal(f"broadcast src={root} {dtype}", t, xs[root])
            t = xs[RANK].to(DEV)
            dist.reduce(t, dst=root)
            c.equal(f"reduce dst={root} {dtype}", t, fold(torch.add, xs) if RANK == root else xs[RANK])
        # into a transposed (non-contiguous) view
        x = xs[RANK].t().contiguous().to(DEV)
        dist.broadcast(x.t(), src=WORLD - 1)
        c.equal(f"broadcast into a transposed view {dtype}", x, xs[WORLD - 1].t().contiguous())
    # bit exact: NaN payloads, -0.0, infinities
    bits = torch.tensor([0x7FC00001, 0x80000000, 0x7F800000, 0x3F800000 + RANK]).to(torch.int32)  # wraps
    t = bits.view(torch.float32).to(DEV)
    dist.broadcast(t, src=0)
    root_bits = torch.tensor([0x7FC00001, 0x80000000, 0x7F800000, 0x3F800000]).to(torch.int32)
    c.equal("broadcast is bit exact (NaN payload, -0.0, inf)", t.cpu().view(torch.int32), root_bits)
    t = torch.tensor([RANK % 2 == 0, True], device=DEV)
    dist.broadcast(t, src=1)
    c.equal("broadcast bool", t, torch.tensor([False, True]))


def check_gathers(c):
    for dtype in DTYPES:
        xs = [value(r, dtype) for r in RANKS]
        outs = [torch.zeros(4, 3, dtype=dtype, device=DEV) for _ in RANKS]
        dist.all_gather(outs, xs[RANK].to(DEV))
        for r in RANKS:
            c.equal(f"all_gather[{r}] {dtype}", outs[r], xs[r])
        out = torch.zeros(WORLD * 4, 3, dtype=dtype, device=DEV)
        dist.all_gather_into_tensor(out, xs[RANK].to(DEV))
        c.equal(f"all_gather_into_tensor (cat) {dtype}", out, torch.cat(xs))
        out = torch.zeros(WORLD, 4, 3, dtype=dtype, device=DEV)
        dist.all_gather_into_tensor(out, xs[RANK].to(DEV))
        c.equal(f"all_gather_into_tensor (stack) {dtype}", out, torch.stack(xs))
        out = torch.zeros(WORLD * 4, dtype=dtype, device=DEV)
        dist.all_gather_into_tensor(out, xs[RANK].to(DEV)[:, 2])  # a non-contiguous input
        c.equal(f"all_gather_into_tensor from a view {dtype}", out, torch.cat([x[:, 2] for x in xs]))
        for dst in RANKS:
            gathered = [torch.zeros(4, 3, dtype=dtype, device=DEV) for _ in RANKS] if RANK == dst else None
            dist.gather(xs[RANK].to(DEV), gathered, dst=dst)
            if RANK == dst:
                c.equal(f"gather dst={dst} {dtype}", torch.stack([g.cpu() for g in gathered]), torch.stack(xs))
        src = WORLD - 1
        pieces = [value(src * 10 + i, dtype) for i in RANKS]
        out = torch.zeros(4, 3, dtype=dtype, device=DEV)
        dist.scatter(out, [p.to(DEV) for p in pieces] if RANK == src else None, src=src)
        c.equal(f"scatter src={src} {dtype}", out, pieces[RANK])
    out = torch.zeros(WORLD, device=DEV)
    dist.all_gather_into_tensor(out, torch.tensor(float(RANK + 7), device=DEV))
    c.equal("all_gather_into_tensor 0-dim input", out, torch.tensor([7.0 + r for r in RANKS]))


def check_reduce_scatter(c):
    for dtype in DTYPES:
        big = [value(r, dtype, (WORLD * 2, 3)) for r in RANKS]
        mine = slice(2 * RANK, 2 * RANK + 2)
        for name, (op, reduce) in REDUCERS.items():
            small = name == "PRODUCT"
            big = [value(r, dtype, (WORLD * 2, 3), small=small) for r in RANKS]
            out = torch.zeros(2, 3, dtype=dtype, device=DEV)
            dist.reduce_scatter_tensor(out, big[RANK].to(DEV), op=op)
            c.equal(f"reduce_scatter_tensor {name} {dtype}", out, reduce(big)[mine])
        big = [value(r, dtype, (WORLD * 2, 3)) for r in RANKS]
        if dtype.is_floating_point:
            out = torch.zeros(2, 3, dtype=dtype, device=DEV)
            dist.reduce_scatter_tensor(out, big[RANK].to(DEV), op=dist.ReduceOp.AVG)
            c.equal(f"reduce_scatter_tensor AVG {dtype}", out, expected_avg(big, dtype)[mine], atol=1e-6)
            out = torch.zeros(2, 3, dtype=dtype, device=DEV)
            dist.reduce_scatter_tensor(out, big[RANK].to(DEV), op=dist._make_nccl_premul_sum(0.25))
            c.equal(f"reduce_scatter_tensor PREMUL_SUM(0.25) {dtype}", out,
                    (fold(torch.add, [b.double() for b in big]) * 0.25).to(dtype)[mine], atol=1e-6)
        out = torch.zeros(2, 3, dtype=dtype, device=DEV)
        dist.reduce_scatter(out, [b.to(DEV) for b in big[RANK].chunk(WORLD)])
        c.equal(f"reduce_scatter (list) {dtype}", out, fold(torch.add, big)[mine])
        stacked = [value(r, dtype, (WORLD, 3)) for r in RANKS]
        out = torch.zeros(3, dtype=dtype, device=DEV)
        dist.reduce_scatter_tensor(out, stacked[RANK].to(DEV))
        c.equal(f"reduce_scatter_tensor (stacked input) {dtype}", out, fold(torch.add, stacked)[RANK])


def check_all_to_all(c):
    for dtype in DTYPES:
        xs = [value(r, dtype, (WORLD * 2, 3)) for r in RANKS]
        out = torch.zeros(WORLD * 2, 3, dtype=dtype, device=DEV)
        dist.all_to_all_single(out, xs[RANK].to(DEV))
        c.equal(f"all_to_all_single equal splits {dtype}", out, torch.cat([x[2 * RANK:2 * RANK + 2] for x in xs]))

        # unequal splits: rank r sends (r + j) % 3 rows to rank j
        def split(src, dst):
            return (src + dst) % 3

        ins = [value(r, dtype, (sum(split(r, j) for j in RANKS), 3)) for r in RANKS]
        in_splits = [split(RANK, j) for j in RANKS]
        out_splits = [split(i, RANK) for i in RANKS]
        out = torch.zeros(sum(out_splits), 3, dtype=dtype, device=DEV)
        dist.all_to_all_single(out, ins[RANK].to(DEV), out_splits, in_splits)
        pieces = []
        for i in RANKS:
            start = sum(split(i, j) for j in range(RANK))
            pieces.append(ins[i][start:start + split(i, RANK)])
        c.equal(f"all_to_all_single unequal splits {dtype}", out, torch.cat(pieces))
    # list form, a different shape for each destination
    sends = [[torch.full((r + 1, j + 2), float(10 * r + j)) for j in RANKS] for r in RANKS]
    outs = [torch.zeros(i + 1, RANK + 2, device=DEV) for i in RANKS]
    dist.all_to_all(outs, [t.to(DEV) for t in sends[RANK]])
    for i in RANKS:
        c.equal(f"all_to_all (list) from rank {i}", outs[i], sends[i][RANK])


def check_point_to_point(c):
    peer = (RANK + 1) % WORLD
    prev = (RANK - 1) % WORLD
    for dtype in DTYPES:
        payload = value(RANK, dtype)
        if RANK % 2 == 0:  # even ranks send first: blocking pairs must meet in order
            dist.send(payload.to(DEV), dst=peer)
            got = torch.zeros(4, 3, dtype=dtype, device=DEV)
            dist.recv(got, src=prev)
        else:
            got = torch.zeros(4, 3, dtype=dtype, device=DEV)
            dist.recv(got, src=prev)
            dist.send(payload.to(DEV), dst=peer)
        c.equal(f"send/recv ring {dtype}", got, value(prev, dtype))
    got = torch.zeros(5, device=DEV)
    ops = [dist.P2POp(dist.isend, torch.arange(5.0, device=DEV) + RANK, peer),
           dist.P2POp(dist.irecv, got, prev)]
    if RANK % 2:
        ops.reverse()
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    c.equal("batch_isend_irecv", got, torch.arange(5.0) + prev)


def check_coalesced_and_new_names(c):
    xs = [value(r, torch.float32, (6,)) for r in RANKS]
    a, b = xs[RANK].to(DEV), xs[RANK][:2].to(DEV)  # one dtype per call (c10d's rule)
    dist.all_reduce_coalesced([a, b])
    c.equal("all_reduce_coalesced [0]", a, fold(torch.add, xs))
    c.equal("all_reduce_coalesced [1]", b, fold(torch.add, xs)[:2])
    a, b = xs[RANK].to(DEV), xs[RANK].to(DEV) * 2
    with dist._coalescing_manager(async_ops=True) as manager:
        dist.all_reduce(a)
        dist.all_reduce(b)
    manager.wait()
    c.equal("coalescing manager all_reduce [0]", a, fold(torch.add, xs))
    c.equal("coalescing manager all_reduce [1]", b, fold(torch.add, xs) * 2)
    out = torch.zeros(WORLD * 6, device=DEV)
    dist.all_gather_single(out, xs[RANK].to(DEV))
    c.equal("all_gather_single", out, torch.cat(xs))
    out = torch.zeros(3, device=DEV)
    dist.reduce_scatter_single(out, xs[RANK].to(DEV)[:WORLD * 3])
    c.equal("reduce_scatter_single", out, fold(torch.add, [x[:WORLD * 3] for x in xs])[3 * RANK:3 * RANK + 3])
    zs = [value(r, torch.float32, (2, 2)) for r in RANKS]
    outs = [[torch.zeros(6, device=DEV), torch.zeros(2, 2, device=DEV)] for _ in RANKS]
    dist.all_gather_coalesced(outs, [xs[RANK].to(DEV), zs[RANK].to(DEV)])
    for r in RANKS:
        c.equal(f"all_gather_coalesced [0] from rank {r}", outs[r][0], xs[r])
        c.equal(f"all_gather_coalesced [1] from rank {r}", outs[r][1], zs[r])


def check_async_and_futures(c):
    total = float(sum(r + 1 for r in RANKS))
    t = torch.full((5,), float(RANK + 1), device=DEV)
    work = dist.all_reduce(t, async_op=True)
    c.true("async work.wait() returns True", work.wait() is True)
    c.true("async work is completed after wait", work.is_completed())
    c.equal("async all_reduce value", t, torch.full((5,), total))
    t = torch.full((5,), float(RANK + 1), device=DEV)
    fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    c.equal("get_future().then(...)", fut.wait(), torch.full((5,), 2 * total))
    outs = torch.zeros(WORLD, 2, device=DEV)
    work = dist.all_gather_into_tensor(outs, torch.full((2,), float(RANK), device=DEV), async_op=True)
    work.wait()
    c.equal("async all_gather_into_tensor", outs, torch.arange(float(WORLD)).repeat_interleave(2).reshape(WORLD, 2))


def check_cpu_tensors_and_errors(c):
    total = float(sum(r + 1 for r in RANKS))
    t = torch.full((3,), float(RANK + 1))
    dist.all_reduce(t)
    c.equal("cpu all_reduce (gloo)", t, torch.full((3,), total))
    outs = [torch.zeros(2) for _ in RANKS]
    dist.all_gather(outs, torch.full((2,), float(RANK)))
    c.equal("cpu all_gather (gloo)", torch.stack(outs), torch.arange(float(WORLD))[:, None].expand(WORLD, 2))
    t = torch.full((2,), float(RANK))
    dist.broadcast(t, src=WORLD - 1)
    c.equal("cpu broadcast (gloo)", t, torch.full((2,), float(WORLD - 1)))
    out = torch.zeros(WORLD * 2)
    dist.all_gather_into_tensor(out, torch.full((2,), float(RANK)))
    c.equal("cpu all_gather_into_tensor (gloo)", out, torch.arange(float(WORLD)).repeat_interleave(2))
    c.raises("cpu and tpu tensors in one call", RuntimeError, ["all_gather", "cpu", "tpu"],
             lambda: dist.all_gather([torch.zeros(2, device=DEV) for _ in RANKS], torch.zeros(2)))
    dist.barrier()
    c.true("barrier", True)


def check_functional_collectives(c):
    xs = [value(r, torch.float32, (WORLD * 3,)) for r in RANKS]
    group = dist.group.WORLD
    y = funcol.all_reduce(xs[RANK].to(DEV), "sum", group)
    c.equal("funcol.all_reduce", funcol.wait_tensor(y), fold(torch.add, xs))
    y = funcol.all_gather_tensor(xs[RANK].to(DEV), 0, group)
    c.equal("funcol.all_gather_tensor", funcol.wait_tensor(y), torch.cat(xs))
    y = funcol.reduce_scatter_tensor(xs[RANK].to(DEV), "sum", 0, group)
    c.equal("funcol.reduce_scatter_tensor", funcol.wait_tensor(y), fold(torch.add, xs)[3 * RANK:3 * RANK + 3])
    y = funcol.all_reduce(xs[RANK].to(DEV), "avg", group)
    c.equal("funcol.all_reduce avg", funcol.wait_tensor(y), expected_avg(xs, torch.float32), atol=1e-6)


def check_subgroups(c):
    xs = [value(r, torch.float32) for r in RANKS]
    reversed_group = dist.new_group(list(reversed(RANKS)))
    singles = [dist.new_group([r]) for r in RANKS]  # every rank makes every group, members or not
    for step in range(2):  # interleave groups: no cross talk between their programs or checks
        t = xs[RANK].to(DEV)
        dist.all_reduce(t, group=reversed_group)
        c.equal(f"all_reduce on new_group(reversed) step {step}", t, fold(torch.add, xs))
        t = xs[RANK].to(DEV)
        dist.all_reduce(t, group=singles[RANK])
        c.equal(f"all_reduce on a singleton group step {step}", t, xs[RANK])
        t = xs[RANK].to(DEV)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        c.equal(f"all_reduce MAX on the world between subgroup calls step {step}", t, torch.stack(xs).amax(0))
    out = torch.zeros(WORLD * 4, 3, device=DEV)
    dist.all_gather_into_tensor(out, xs[RANK].to(DEV), group=reversed_group)
    order = [dist.get_global_rank(reversed_group, i) for i in RANKS]
    c.equal("all_gather_into_tensor on new_group(reversed), group-rank order", out,
            torch.cat([xs[r] for r in order]))
    c.true("a subgroup is a tpu process group", type(reversed_group).__name__ == "TpuProcessGroup",
           type(reversed_group).__name__)


def check_ddp(c):
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    model.load_state_dict(reference.state_dict())
    if RANK == 1:  # DDP's first broadcast must undo this
        with torch.no_grad():
            model[0].weight.add_(1.0)
    ddp = torch.nn.parallel.DistributedDataParallel(model.to(DEV))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(123)
    for _ in range(4):
        batches = [(torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)) for _ in RANKS]
        x, y = batches[RANK]
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x.to(DEV)), y.to(DEV)).backward()
        opt.step()
        ref_opt.zero_grad()  # one process, the whole batch: what DDP's averaged gradient must equal
        torch.nn.functional.mse_loss(reference(torch.cat([b[0] for b in batches])),
                                     torch.cat([b[1] for b in batches])).backward()
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        c.equal(f"DDP 4 SGD steps vs one CPU process: {name}", p.detach().cpu(), q.detach(), atol=1e-5)


def check_compile_counts(c):
    compiles = torch.tpu.metrics()["compiles"]
    before = compiles.get("collective all_reduce", 0)
    c.true("collective compiles are counted", before > 0, str(dict(compiles)))
    t = torch.ones(4, 3, device=DEV)
    dist.all_reduce(t)  # a signature already compiled
    c.true("a known signature compiles nothing", torch.tpu.metrics()["compiles"]["collective all_reduce"] == before)


def main(c):
    dist.init_process_group("cpu:gloo,tpu:tpu")  # before any tpu tensor
    import jax

    c.true("jax.distributed spans the world", (jax.process_index(), jax.process_count()) == (RANK, WORLD))
    check_all_reduce(c)
    check_broadcast_reduce(c)
    check_gathers(c)
    check_reduce_scatter(c)
    check_all_to_all(c)
    check_point_to_point(c)
    check_coalesced_and_new_names(c)
    check_async_and_futures(c)
    check_cpu_tensors_and_errors(c)
    check_functional_collectives(c)
    check_subgroups(c)
    check_ddp(c)
    check_compile_counts(c)
    dist.destroy_process_group()


if __name__ == "__main__":
    run(main)
