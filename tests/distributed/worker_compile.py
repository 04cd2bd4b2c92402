"""torch.compile(backend="tpu") of graphs with functional collectives, checked against CPU math.

Run by tests/distributed/test_compile_collectives.py with 2 processes (any
world size >= 2 works).  Each scenario named on the command line (default:
all) runs inside its own try block, and every check is named
``<scenario>: ...``, so the test can judge each scenario on its own.  A
scenario that ran to its end prints ``DONE <scenario>``.

Each rank knows every rank's input (a formula of the rank, or one seeded
generator), so it computes the expected result with plain torch on CPU.
"""

from __future__ import annotations

import statistics
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn

import torchtpu  # noqa: F401
from torchtpu.distributed import compiled
from worker_common import RANK, WORLD, run

DEV = "tpu"
RANKS = range(WORLD)
REGISTERED_BY_IMPORT = compiled.registered()  # reported: torchtpu.distributed.register() should call it
compiled.register()  # idempotent


def value(r: int, shape=(4, 3)) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=torch.float32).reshape(shape) * (r + 1) - 3 * r + 0.5)


def metrics():
    m = torch.tpu.metrics()
    return dict(m["compiles"]), sum(m["graph_fallbacks"].values())


def eager_collective_compiles(compiles) -> int:
    return sum(v for k, v in compiles.items() if k.startswith("collective "))


# ---- (1) all_reduce in a compiled function ------------------------------------------------------


def scenario_all_reduce(c):
    group = dist.group.WORLD

    def fn(x, y):
        s = funcol.all_reduce(x * 2, "sum", group)
        return torch.relu(s - y) + 1, s.sum()

    xs = [value(r) for r in RANKS]
    y = torch.full((4, 3), 5.0)
    total = sum(2 * x for x in xs)
    want = (torch.relu(total - y) + 1, total.sum())
    f = torch.compile(fn, backend="tpu")
    before, fallbacks = metrics()
    for call in range(2):  # the second call reuses the program
        out, loss = f(xs[RANK].to(DEV), y.to(DEV))
        c.equal(f"all_reduce: call {call} result", out, want[0])
        c.equal(f"all_reduce: call {call} 0-dim result", loss, want[1])
    after, fallbacks_after = metrics()
    graphs = after.get("compiled graph inference", 0) - before.get("compiled graph inference", 0)
    c.true("all_reduce: one compiled graph", graphs == 1, f"{graphs} compiled graphs: {after}")
    c.true("all_reduce: no graph fallback", fallbacks_after == fallbacks, str(torch.tpu.metrics()["graph_fallbacks"]))
    c.true("all_reduce: the collective ran inside the graph (no eager collective program)",
           eager_collective_compiles(after) == eager_collective_compiles(before), str(after))

    # avg, max, a 0-dim input, and a later graph that reuses the mesh
    def stats(x, scalar):
        return funcol.all_reduce(x, "avg", group), funcol.all_reduce(x, "max", group), \
            funcol.all_reduce(scalar * 1.0, "sum", group)

    avg, mx, sc = torch.compile(stats, backend="tpu")(xs[RANK].to(DEV), torch.tensor(float(RANK + 1), device=DEV))
    c.equal("all_reduce: avg", avg, sum(xs) / WORLD, atol=1e-6)
    c.equal("all_reduce: max", mx, torch.stack(xs).amax(0))
    c.equal("all_reduce: 0-dim input", sc, torch.tensor(float(sum(r + 1 for r in RANKS))))

    # an input updated in place with a reduced value (an optimizer-like step): written back, donated
    def sgd(param, grad):
        param.sub_(funcol.all_reduce(grad, "avg", group) * 0.5)

    step = torch.compile(sgd, backend="tpu")
    param, want_param = xs[RANK].to(DEV), xs[RANK].clone()
    donated = torch.tpu.metrics()["compile_cache"].get("donated_inputs", 0)
    for i in range(2):
        step(param, xs[RANK].to(DEV) * (i + 1))
        want_param -= sum(x * (i + 1) for x in xs) / WORLD * 0.5
    c.equal("all_reduce: in-place update of an input, twice", param, want_param, atol=1e-5)
    c.true("all_reduce: the updated input's old array was donated",
           torch.tpu.metrics()["compile_cache"].get("donated_inputs", 0) > donated, str(torch.tpu.metrics()))

    # a new batch size: Dynamo's dynamic-shape graph takes the size as a runtime number
    for rows in (6, 8):
        xr = [value(r, (rows, 3)) for r in RANKS]
        out, loss = f(xr[RANK].to(DEV), torch.full((rows, 3), 5.0, device=DEV))
        total = sum(2 * x for x in xr)
        c.equal(f"all_reduce: {rows} rows", out, torch.relu(total - 5.0) + 1)
    c.true("all_reduce: still no graph fallback", metrics()[1] == fallbacks,
           str(torch.tpu.metrics()["graph_fallbacks"]))

    # fused eager mode: the graph runs when called, after the pending fused graph
    with torch.tpu.eager_mode("fused"):
        a = xs[RANK].to(DEV) * 1.0  # pending in the fused graph
        out, loss = f(a, y.to(DEV))
        out = out * 2  # recorded after the compiled graph's outputs
        c.equal("all_reduce: fused mode", out, want[0] * 2)
    c.true("all_reduce: fused mode needs no fallback", metrics()[1] == fallbacks, str(torch.tpu.metrics()))


# ---- (2) all_gather / reduce_scatter / all_to_all / broadcast -----------------------------------


def scenario_gather_scatter(c):
    group = dist.group.WORLD

    def fn(x):
        gathered = funcol.all_gather_tensor(x + 1, 0, group)  # (WORLD * 4, 3)
        scattered = funcol.reduce_scatter_tensor(gathered * 2, "sum", 0, group)  # (4, 3)
        swapped = funcol.all_to_all_single(x.reshape(WORLD, -1) * 3, None, None, group)
        root = funcol.broadcast(x - 1, 1, group)
        return gathered, scattered, swapped, root

    xs = [value(r, (2 * WORLD, 3)) for r in RANKS]
    _, fallbacks = metrics()
    before = metrics()[0]
    gathered, scattered, swapped, root = torch.compile(fn, backend="tpu")(xs[RANK].to(DEV))
    want_gathered = torch.cat([x + 1 for x in xs])
    c.equal("gather_scatter: all_gather_tensor", gathered, want_gathered)
    rows = want_gathered.shape[0] // WORLD
    c.equal("gather_scatter: reduce_scatter_tensor", scattered,
            (want_gathered * 2 * WORLD)[RANK * rows:(RANK + 1) * rows])
    blocks = [(x.reshape(WORLD, -1) * 3)[RANK] for x in xs]
    c.equal("gather_scatter: all_to_all_single", swapped, torch.stack(blocks))
    c.equal("gather_scatter: broadcast from rank 1", root, xs[1] - 1)
    c.true("gather_scatter: no graph fallback", metrics()[1] == fallbacks, str(torch.tpu.metrics()["graph_fallbacks"]))
    c.true("gather_scatter: no eager collective", eager_collective_compiles(metrics()[0]) ==
           eager_collective_compiles(before), str(metrics()[0]))

    # the coalesced forms (what FSDP2 and DTensor's bucketing call)
    def coalesced(a, b):
        g = funcol.all_gather_into_tensor_coalesced([a, b], group)
        s = funcol.reduce_scatter_tensor_coalesced([a, b], "sum", [0, 0], group)
        r = funcol.all_reduce_coalesced([a, b], "sum", group)
        return *g, *s, *r

    a = [value(r, (WORLD * 2,)) for r in RANKS]
    b = [value(r, (WORLD, 2)) * -1 for r in RANKS]
    got = torch.compile(coalesced, backend="tpu")(a[RANK].to(DEV), b[RANK].to(DEV))
    want = (torch.cat(a), torch.cat(b), sum(a)[2 * RANK:2 * RANK + 2], sum(b)[RANK:RANK + 1], sum(a), sum(b))
    for i, (g, w) in enumerate(zip(got, want)):
        c.equal(f"gather_scatter: coalesced output {i}", g, w)
    c.true("gather_scatter: coalesced, no graph fallback", metrics()[1] == fallbacks,
           str(torch.tpu.metrics()["graph_fallbacks"]))

    # the autograd forms: the forward gathers, the backward graph reduce-scatters
    def gathered_loss(x):
        return (funcol.all_gather_tensor_autograd(x * 2, 0, group) ** 2).sum()

    xs = [torch.arange(4.0) + r for r in RANKS]
    x = xs[RANK].to(DEV).requires_grad_()
    loss = torch.compile(gathered_loss, backend="tpu")(x)
    loss.backward()
    c.equal("gather_scatter: all_gather_tensor_autograd forward", loss, sum((2 * v) ** 2 for v in xs).sum())
    c.equal("gather_scatter: all_gather_tensor_autograd backward (reduce_scatter)", x.grad, 8 * WORLD * xs[RANK])

    # DTensor's Shard(0) -> Shard(1): _dtensor.shard_dim_alltoall
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh(DEV, (WORLD,))
    full = torch.arange(WORLD * WORLD * 4.0).reshape(WORLD * 2, WORLD * 2)
    rows_to_cols = torch.compile(lambda d: d.redistribute(mesh, [Shard(1)]).to_local() + 0, backend="tpu")
    c.equal("gather_scatter: DTensor Shard(0) -> Shard(1)",
            rows_to_cols(distribute_tensor(full.to(DEV), mesh, [Shard(0)])), full[:, 2 * RANK:2 * RANK + 2])
    c.true("gather_scatter: autograd and DTensor forms, no graph fallback", metrics()[1] == fallbacks,
           str(torch.tpu.metrics()["graph_fallbacks"]))

    # unequal all_to_all splits have no lowering: the graph falls back (counted, with the reason), still right
    in_splits = [j + 1 for j in RANKS]
    xs = [torch.arange(sum(in_splits), dtype=torch.float32) + 100 * r for r in RANKS]
    offset = sum(in_splits[:RANK])

    def uneven(x):
        return funcol.all_to_all_single(x * 1, [RANK + 1] * WORLD, in_splits, group)

    got = torch.compile(uneven, backend="tpu")(xs[RANK].to(DEV))
    c.equal("gather_scatter: unequal all_to_all_single (eager fallback)", got,
            torch.cat([x[offset:offset + RANK + 1] for x in xs]))
    reasons = torch.tpu.metrics()["graph_fallbacks"]
    c.true("gather_scatter: unequal all_to_all_single is a counted fallback with its reason",
           metrics()[1] == fallbacks + 1 and any("all_to_all_single" in r and "not equal" in r for r in reasons),
           str(reasons))


# ---- 2-D device meshes: a collective per mesh dim, in one graph ---------------------------------


def scenario_mesh2d(c):
    from torch.distributed.device_mesh import init_device_mesh

    _, fallbacks = metrics()
    xs = [value(r) for r in RANKS]
    shapes = [(WORLD, 1), (1, WORLD)] + ([(2, WORLD // 2)] if WORLD % 2 == 0 and WORLD > 2 else [])
    for rows, cols in shapes:
        mesh = init_device_mesh(DEV, (rows, cols), mesh_dim_names=("dp", "tp"))

        def fn(x):
            over_dp = funcol.all_reduce(x, "sum", (mesh, 0))  # down a column of the mesh
            over_tp = funcol.all_gather_tensor(over_dp * 2, 0, (mesh, 1))  # along a row
            return over_dp, funcol.reduce_scatter_tensor(over_tp, "sum", 0, (mesh, 1))

        over_dp, scattered = torch.compile(fn, backend="tpu")(xs[RANK].to(DEV))
        row, col = divmod(RANK, cols)
        column_sum = [sum(xs[i * cols + j] for i in range(rows)) for j in range(cols)]  # over_dp of column j
        c.equal(f"mesh2d {(rows, cols)}: all_reduce over dim 0", over_dp, column_sum[col])
        gathered = torch.cat([column_sum[j] * 2 for j in range(cols)])
        block = gathered.shape[0] // cols
        c.equal(f"mesh2d {(rows, cols)}: all_gather then reduce_scatter over dim 1", scattered,
                (gathered * cols)[col * block:(col + 1) * block])
        if rows > 1:  # src as eager funcol reads it (the group rank): compiled and eager agree

            def down(x):
                return funcol.broadcast(x + 1, rows - 1, (mesh, 0))

            x = xs[RANK].to(DEV)
            c.equal(f"mesh2d {(rows, cols)}: broadcast over dim 0 as in eager", torch.compile(down, backend="tpu")(x),
                    funcol.wait_tensor(down(x)).cpu())
            c.equal(f"mesh2d {(rows, cols)}: broadcast over dim 0 from the last row", funcol.wait_tensor(down(x)),
                    xs[(rows - 1) * cols + col] + 1)
    c.true("mesh2d: no graph fallback", metrics()[1] == fallbacks, str(torch.tpu.metrics()["graph_fallbacks"]))


# ---- (3) DTensor tensor parallelism ------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, d_in=8, hidden=16, d_out=8):
        super().__init__()
        self.up = nn.Linear(d_in, hidden)
        self.down = nn.Linear(hidden, d_out)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def _median_step_ms(step, steps=5) -> float:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        torch.tpu.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def scenario_tp(c):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh(DEV, (WORLD,))
    torch.manual_seed(0)
    reference = MLP()
    initial = {k: v.clone() for k, v in reference.state_dict().items()}
    x = torch.randn(4, 8)
    want = reference(x)

    def tp_model():
        model = MLP()
        model.load_state_dict(initial)
        return parallelize_module(model.to(DEV), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})

    model = torch.compile(tp_model(), backend="tpu")
    before, fallbacks = metrics()
    with torch.no_grad():
        got = model(x.to(DEV))
        got = model(x.to(DEV))  # cached
    after, _ = metrics()
    c.equal("tp: compiled forward vs CPU", got, want.detach(), atol=1e-5)
    c.true("tp: no graph fallback", metrics()[1] == fallbacks, str(torch.tpu.metrics()["graph_fallbacks"]))
    c.true("tp: the forward's all_reduce ran inside the graph", eager_collective_compiles(after) ==
           eager_collective_compiles(before), str(after))
    graphs = after.get("compiled graph inference", 0) - before.get("compiled graph inference", 0)
    c.true("tp: one compiled graph", graphs == 1, str(after))

    # a training step (forward and backward graphs both hold collectives), compiled vs eager vs CPU
    y = torch.randn(4, 8)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(2):
        ref_opt.zero_grad()
        nn.functional.mse_loss(reference(x), y).backward()
        ref_opt.step()
    medians = {}
    for kind in ("eager", "compiled"):
        model = tp_model()
        m = torch.compile(model, backend="tpu") if kind == "compiled" else model
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        xd, yd = x.to(DEV), y.to(DEV)

        def step():
            opt.zero_grad()
            nn.functional.mse_loss(m(xd), yd).backward()
            opt.step()

        for _ in range(2):
            step()
        for name, p in model.named_parameters():
            c.equal(f"tp: {kind} 2 training steps vs CPU: {name}", p.full_tensor().detach().cpu(),
                    dict(reference.named_parameters())[name].detach(), atol=1e-5)
        medians[kind] = _median_step_ms(step)
    c.true("tp: training step, no graph fallback", metrics()[1] == fallbacks,
           str(torch.tpu.metrics()["graph_fallbacks"]))
    if RANK == 0:
        print(f"TIMING tp training step (2-layer MLP, {WORLD} processes): eager median {medians['eager']:.2f} ms, "
              f"compiled median {medians['compiled']:.2f} ms", flush=True)


# ---- (3b) each rank's own numbers in the graph -------------------------------------------------


def scenario_rank_numbers(c):
    """A vocabulary-parallel embedding: each rank's graph bakes in its own index range and scale,
    so the ranks' graphs differ in those numbers alone; they still compile to one program."""
    group = dist.group.WORLD
    rows = 5
    torch.manual_seed(0)
    table = torch.randn(rows * WORLD, 3)
    start, end, scale = RANK * rows, (RANK + 1) * rows, RANK + 0.5
    ids = torch.tensor([0, rows * WORLD - 1, rows, 3, rows + 1, 2 * rows - 1])

    def embed(ids, shard):
        inside = (ids >= start) & (ids < end)
        rows_here = shard[(ids - start) * inside] * inside.unsqueeze(-1)
        return funcol.all_reduce(rows_here * scale, "sum", group)

    want = table[ids] * torch.tensor([(i // rows) + 0.5 for i in ids.tolist()]).unsqueeze(-1)
    before, fallbacks = metrics()
    f = torch.compile(embed, backend="tpu")
    for call in range(2):
        c.equal(f"rank_numbers: call {call} vs CPU", f(ids.to(DEV), table[start:end].to(DEV)), want, atol=1e-6)
    after, _ = metrics()
    graphs = after.get("compiled graph inference", 0) - before.get("compiled graph inference", 0)
    c.true("rank_numbers: one compiled graph", graphs == 1, str(after))
    c.true("rank_numbers: no graph fallback", metrics()[1] == fallbacks, str(torch.tpu.metrics()["graph_fallbacks"]))

    # ranks whose graphs differ in more than numbers: a clear error on every rank, not a hang
    def differs(x):
        y = x * 2 if RANK == 0 else x.sin()
        return funcol.all_reduce(y, "sum", group)

    c.raises("rank_numbers: graphs of other ops are refused", RuntimeError,
             ["ranks compile different programs", "same compiled graphs"],
             lambda: torch.compile(differs, backend="tpu")(torch.ones(3, device=DEV)))


# ---- (4) FSDP2 ---------------------------------------------------------------------------------


def scenario_fsdp(c):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(DEV, (WORLD,))
    torch.manual_seed(0)
    reference = MLP(8, 16, 4)
    g = torch.Generator().manual_seed(1)
    batches = [[(torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)) for _ in RANKS] for _ in range(2)]
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in batches:  # one process, the whole batch: what FSDP's averaged gradients must give
        ref_opt.zero_grad()
        nn.functional.mse_loss(reference(torch.cat([b[0] for b in step])), torch.cat([b[1] for b in step])).backward()
        ref_opt.step()

    def sharded_model():
        torch.manual_seed(0)
        model = MLP(8, 16, 4).to(DEV)
        fully_shard(model.up, mesh=mesh)
        fully_shard(model.down, mesh=mesh)
        return fully_shard(model, mesh=mesh)

    _, fallbacks = metrics()
    medians = {}
    for kind in ("eager", "compiled"):
        model = sharded_model()
        m = torch.compile(model, backend="tpu") if kind == "compiled" else model
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x, y):
            opt.zero_grad()
            nn.functional.mse_loss(m(x.to(DEV)), y.to(DEV)).backward()
            opt.step()

        for batch in batches:
            step(*batch[RANK])
        for name, p in model.named_parameters():
            c.equal(f"fsdp: {kind} 2 training steps vs CPU: {name}", p.full_tensor().detach().cpu(),
                    dict(reference.named_parameters())[name].detach(), atol=1e-5)
        medians[kind] = _median_step_ms(lambda: step(*batches[0][RANK]))
    c.true("fsdp: no graph fallback", metrics()[1] == fallbacks, str(torch.tpu.metrics()["graph_fallbacks"]))
    if RANK == 0:
        print(f"TIMING fsdp2 training step (2-layer MLP, {WORLD} processes; FSDP's hooks run eagerly): eager median "
              f"{medians['eager']:.2f} ms, compiled median {medians['compiled']:.2f} ms", flush=True)


SCENARIOS = {"all_reduce": scenario_all_reduce, "gather_scatter": scenario_gather_scatter,
             "mesh2d": scenario_mesh2d, "tp": scenario_tp, "rank_numbers": scenario_rank_numbers,
             "fsdp": scenario_fsdp}


def main(c):
    start = time.perf_counter()
    dist.init_process_group("tpu")  # before any tpu tensor
    print(f"init_process_group ({time.perf_counter() - start:.1f} s); handler registered by import torchtpu: "
          f"{REGISTERED_BY_IMPORT}", flush=True)
    for name in sys.argv[1:] or SCENARIOS:
        start = time.perf_counter()
        try:
            SCENARIOS[name](c)
            print(f"DONE {name} ({time.perf_counter() - start:.1f} s)", flush=True)
        except Exception:  # noqa: BLE001 (report it under the scenario's name, then go on)
            traceback.print_exc()
            sys.stderr.flush()
            c.failed.append(f"{name}: uncaught exception")
            print(f"[rank {RANK}] FAIL {name}: uncaught exception (see stderr)", flush=True)
    dist.barrier()  # rank 0 hosts the store: it must outlive the other ranks' last use of it


if __name__ == "__main__":
    run(main)
