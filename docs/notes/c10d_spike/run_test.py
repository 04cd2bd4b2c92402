"""Spawn 2 ranks that check the tpu process group against CPU math, then DDP against a 1-process CPU run."""

import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORLD = 2
TIMEOUT = int(os.environ.get("RUN_TEST_TIMEOUT", "180"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------- worker


def worker():
    import statistics

    import torch
    import torch.distributed as dist
    import torchtpu  # noqa: F401
    import tpu_pg  # noqa: F401

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("tpu")  # before any tpu tensor: JAX must start distributed first
    import jax

    if os.environ.get("SIMULATE_HANG") and rank == 1:
        time.sleep(3600)  # rank 0 then blocks in its first collective: the launcher must kill both
    assert jax.process_count() == world and jax.process_index() == rank
    dev = "tpu"
    results = []

    def check(name, got, want, atol=0.0):
        got_c = got.cpu() if isinstance(got, torch.Tensor) else got
        ok = got_c.dtype == want.dtype and got_c.shape == want.shape and torch.allclose(
            got_c.double(), want.double(), atol=atol, rtol=0
        )
        results.append((name, ok))
        if not ok:
            print(f"[rank {rank}] FAIL {name}: got {got_c} want {want}", flush=True)

    def per_rank(r, dtype, shape=(4, 3)):
        base = torch.arange(int(torch.tensor(shape).prod()), dtype=torch.float64).reshape(shape)
        v = base * (r + 1) - 5 * r + 0.5 * (dtype.is_floating_point)
        return v.to(dtype)

    def phase(label):
        tpu_pg.TRACE.append(("--", label))

    def timing():
        # ---- timing: 1 MiB float32 allreduce
        if os.environ.get("TIMING_SLEEP"):
            dist.barrier()
            time.sleep(float(os.environ["TIMING_SLEEP"]))
        t = torch.ones(1 << 18, device=dev)
        times = []
        for i in range(25):
            start = time.perf_counter()
            dist.all_reduce(t)
            torch.tpu.synchronize()
            times.append(time.perf_counter() - start)
        med = statistics.median(times[5:]) * 1e3
        progs = dist.group.WORLD.programs
        arr = torchtpu.core.tensor.read(t)
        rtimes = []
        for i in range(25):
            start = time.perf_counter()
            progs.run("allreduce", arr, op="SUM").block_until_ready()
            rtimes.append(time.perf_counter() - start)
        if rank == 0:
            print(f"TIMING raw jitted psum (no torch), median of 20 = {statistics.median(rtimes[5:]) * 1e3:.2f} ms; all:",
                  " ".join(f"{x * 1e3:.1f}" for x in rtimes[5:]), flush=True)
        c = torch.ones(1 << 18)
        ctimes = []
        for i in range(25):
            start = time.perf_counter()
            dist.all_reduce(c)
            ctimes.append(time.perf_counter() - start)
        if rank == 0:
            print(f"TIMING reference: gloo all_reduce 1 MiB float32 CPU tensor: median of 20 = "
                  f"{statistics.median(ctimes[5:]) * 1e3:.2f} ms", flush=True)
        if rank == 0:
            print(f"TIMING all_reduce 1 MiB float32: median of 20 = {med:.2f} ms (min {min(times[5:]) * 1e3:.2f})", flush=True)
            print("TIMING all (ms):", " ".join(f"{x * 1e3:.1f}" for x in times[5:]), flush=True)


    if os.environ.get('TIMING_AT', 'start') == 'start':
        timing()

    ranks = range(world)
    reducers = {
        dist.ReduceOp.SUM: lambda xs: sum(xs[1:], xs[0].clone()),
        dist.ReduceOp.MAX: lambda xs: torch.stack(xs).amax(0),
        dist.ReduceOp.MIN: lambda xs: torch.stack(xs).amin(0),
        dist.ReduceOp.PRODUCT: lambda xs: torch.stack(xs).prod(0).to(xs[0].dtype),
    }
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        inputs = [per_rank(r, dtype) for r in ranks]
        for op, f in reducers.items():
            t = inputs[rank].to(dev)
            phase(f"dist.all_reduce {op}")
            dist.all_reduce(t, op=op)
            check(f"all_reduce {op} {dtype}", t, f(inputs))
        if dtype.is_floating_point:
            t = inputs[rank].to(dev)
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
            want = (sum(x.double() for x in inputs) / world).to(dtype)
            check(f"all_reduce AVG {dtype}", t, want, atol=1e-6)
        # non-contiguous view: write-back through the view
        x = inputs[rank].to(dev)
        col = x[:, 1]
        dist.all_reduce(col)
        want = inputs[rank].clone()
        want[:, 1] = sum(i[:, 1] for i in inputs)
        check(f"all_reduce view x[:,1] {dtype}", x, want)
        # broadcast from each root
        for root in ranks:
            t = inputs[rank].to(dev)
            phase("dist.broadcast")
            dist.broadcast(t, src=root)
            check(f"broadcast src={root} {dtype}", t, inputs[root])
        # all_gather (list)
        outs = [torch.zeros(4, 3, dtype=dtype, device=dev) for _ in ranks]
        phase("dist.all_gather")
        dist.all_gather(outs, inputs[rank].to(dev))
        for r in ranks:
            check(f"all_gather[{r}] {dtype}", outs[r], inputs[r])
        # all_gather_into_tensor
        out = torch.zeros(world * 4, 3, dtype=dtype, device=dev)
        phase("dist.all_gather_into_tensor")
        dist.all_gather_into_tensor(out, inputs[rank].to(dev))
        check(f"all_gather_into_tensor {dtype}", out, torch.cat(inputs))
        # reduce_scatter_tensor
        big = [per_rank(r, dtype, (world * 2, 3)) for r in ranks]
        out = torch.zeros(2, 3, dtype=dtype, device=dev)
        phase("dist.reduce_scatter_tensor")
        dist.reduce_scatter_tensor(out, big[rank].to(dev))
        check(f"reduce_scatter_tensor SUM {dtype}", out, sum(big[1:], big[0].clone())[2 * rank : 2 * rank + 2])
        out = torch.zeros(2, 3, dtype=dtype, device=dev)
        dist.reduce_scatter_tensor(out, big[rank].to(dev), op=dist.ReduceOp.MAX)
        check(f"reduce_scatter_tensor MAX {dtype}", out, torch.stack(big).amax(0)[2 * rank : 2 * rank + 2])

    # async_op + wait + future
    t = torch.full((5,), float(rank + 1), device=dev)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    fut_val = work.get_future().wait()
    check("async all_reduce + future", fut_val[0], torch.full((5,), float(sum(r + 1 for r in ranks))))
    # CPU tensors go through gloo
    c = torch.full((3,), float(rank + 1))
    dist.all_reduce(c)
    check("all_reduce cpu (gloo)", c, torch.full((3,), float(sum(r + 1 for r in ranks))))
    phase("dist.barrier")
    dist.barrier()
    results.append(("barrier", True))

    if os.environ.get('TIMING_AT') == 'after_basic':
        timing()
    # ---- FSDP2-style: all_gather_single / reduce_scatter_single with AVG and PREMUL_SUM
    xs = [per_rank(r, torch.float32, (world * 3,)) for r in ranks]
    out = torch.zeros(3, device=dev)
    phase("dist.reduce_scatter_single AVG")
    dist.reduce_scatter_single(out, xs[rank].to(dev), op=dist.ReduceOp.AVG)
    check("reduce_scatter_single AVG", out, (sum(xs) / world)[3 * rank : 3 * rank + 3], atol=1e-6)
    out = torch.zeros(3, device=dev)
    phase("dist.reduce_scatter_single PREMUL_SUM(0.25)")
    dist.reduce_scatter_single(out, xs[rank].to(dev), op=dist._make_nccl_premul_sum(0.25))
    check("reduce_scatter_single PREMUL_SUM(0.25)", out, (sum(xs) * 0.25)[3 * rank : 3 * rank + 3], atol=1e-6)
    t = xs[rank].to(dev)
    phase("dist.all_reduce PREMUL_SUM(tensor 0.5)")
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(torch.tensor(0.5)))
    check("all_reduce PREMUL_SUM(tensor 0.5)", t, sum(xs) * 0.5, atol=1e-6)
    out = torch.zeros(world * 6, device=dev)
    phase("dist.all_gather_single")
    dist.all_gather_single(out, xs[rank].to(dev))
    check("all_gather_single", out, torch.cat(xs))
    phase("dist.all_gather_into_tensor 0-dim input")
    out = torch.zeros(world, device=dev)
    dist.all_gather_into_tensor(out, torch.tensor(float(rank + 7), device=dev))
    check("all_gather_into_tensor 0-dim input", out, torch.tensor([7.0 + r for r in ranks]))
    t = torch.tensor(float(rank + 1), device=dev)
    dist.all_reduce(t)
    check("all_reduce 0-dim", t, torch.tensor(float(sum(r + 1 for r in ranks))))

    if os.environ.get('TIMING_AT') == 'after_fsdp_ops':
        timing()
    # ---- functional collectives (C++ path through the override hooks)
    import torch.distributed._functional_collectives as funcol
    try:
        phase("funcol.all_reduce")
        y = funcol.all_reduce(xs[rank].to(dev), "sum", dist.group.WORLD)
        check("funcol.all_reduce", funcol.wait_tensor(y) if hasattr(funcol, "wait_tensor") else y, sum(xs))
        phase("funcol.all_gather_tensor")
        y = funcol.all_gather_tensor(xs[rank].to(dev), 0, dist.group.WORLD)
        check("funcol.all_gather_tensor", y, torch.cat(xs))
        phase("funcol.reduce_scatter_tensor")
        y = funcol.reduce_scatter_tensor(xs[rank].to(dev), "sum", 0, dist.group.WORLD)
        check("funcol.reduce_scatter_tensor", y, sum(xs)[3 * rank : 3 * rank + 3])
    except Exception as e:  # noqa: BLE001
        print(f"[rank {rank}] funcol: {type(e).__name__}: {str(e)[:300]}", flush=True)
        results.append(("funcol (exception)", False))

    if os.environ.get('TIMING_AT') == 'after_funcol':
        timing()
    # ---- send / recv (ppermute over a two-device mesh)
    phase("dist.send / dist.recv")
    skip = os.environ.get("SKIP", "").split(",")
    if "sendrecv" in skip:
        pass
    elif rank == 0:
        dist.send(torch.arange(5, dtype=torch.float32, device=dev) * 3, dst=1)
        results.append(("send", True))
    else:
        t = torch.zeros(5, device=dev)
        dist.recv(t, src=0)
        check("recv", t, torch.arange(5, dtype=torch.float32) * 3)

    if os.environ.get('TIMING_AT') == 'after_sendrecv':
        timing()
    # ---- subgroups: all ranks in another order, and a singleton group
    phase("dist.new_group")
    if "groups" in skip:
        g_all = dist.group.WORLD
    else:
        g_all = dist.new_group([1, 0])
    g_one = None if "groups" in skip else dist.new_group([1])
    t = xs[rank].to(dev)
    phase("all_reduce on new_group([1,0])")
    dist.all_reduce(t, group=g_all)
    check("all_reduce on new_group([1,0])", t, sum(xs))
    out = torch.zeros(world * 6, device=dev)
    dist.all_gather_into_tensor(out, xs[rank].to(dev), group=g_all)
    order = [dist.get_global_rank(g_all, i) for i in range(world)]
    check(f"all_gather_into_tensor on new_group([1,0]) (group order {order})", out, torch.cat([xs[r] for r in order]))
    if rank == 1 and g_one is not None:
        t = xs[rank].to(dev)
        dist.all_reduce(t, group=g_one)
        check("all_reduce on singleton new_group([1])", t, xs[1])

    if os.environ.get('TIMING_AT') == 'after_groups':
        timing()
    # ---- DDP
    torch.manual_seed(0)
    ref = torch.nn.Linear(6, 3)
    model = torch.nn.Linear(6, 3)
    model.load_state_dict(ref.state_dict())
    if rank == 1:  # perturb: DDP's initial broadcast must fix it
        with torch.no_grad():
            model.weight.add_(1.0)
    model = model.to(dev)
    phase("DDP construction")
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    phase("DDP training steps")
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(123)
    batches = [[(torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)) for _ in ranks] for _ in range(3)]
    for step in batches:
        xb, yb = step[rank]
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(xb.to(dev)), yb.to(dev))
        loss.backward()
        opt.step()
        ref_opt.zero_grad()
        xa = torch.cat([s[0] for s in step])
        ya = torch.cat([s[1] for s in step])
        torch.nn.functional.mse_loss(ref(xa), ya).backward()
        ref_opt.step()
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        err = (p.detach().cpu() - q.detach()).abs().max().item()
        ok = err <= 1e-5
        results.append((f"DDP 3 SGD steps {n} (max err {err:.2e})", ok))

    if rank == 0 and os.environ.get("TPU_PG_TRACE"):
        print("TRACE (rank 0): method calls per phase", flush=True)
        seen = set()
        phases = set()
        skip = False
        for name, info in tpu_pg.TRACE:
            if name == "--":
                skip = info in phases
                phases.add(info)
                if not skip:
                    print(f"  {info}:", flush=True)
                seen = set()
            elif not skip and (name, info) not in seen:
                seen.add((name, info))
                print(f"      {name}({info})", flush=True)

    if os.environ.get('TIMING_AT', 'start') == 'end':
        timing()

    bad = [n for n, ok in results if not ok]
    print(f"[rank {rank}] {len(results) - len(bad)}/{len(results)} checks passed", flush=True)
    if rank == 0:
        for n, ok in results:
            print(f"  {'ok  ' if ok else 'FAIL'} {n}", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(1 if bad else 0)


# ----------------------------------------------------------------------------- launcher


def main():
    port = free_port()
    procs = []
    for r in range(WORLD):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        env["PYTHONPATH"] = HERE + os.pathsep + env.get("PYTHONPATH", "")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker"], env=env, start_new_session=True))
    deadline = time.time() + TIMEOUT
    codes = [None] * WORLD
    while time.time() < deadline and any(c is None for c in codes):
        codes = [p.poll() for p in procs]
        if any(c not in (None, 0) for c in codes):
            time.sleep(5)  # let the other rank print, then stop it
            break
        time.sleep(0.5)
    for p in procs:
        if p.poll() is None:
            print(f"killing pid {p.pid} (timeout or peer failure)", flush=True)
            os.killpg(p.pid, 9)
            p.wait()
    codes = [p.returncode for p in procs]
    print("exit codes:", codes)
    sys.exit(0 if codes == [0] * WORLD else 1)


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker()
    else:
        main()
