"""Timing of the 1 MiB float32 allreduce on tpu tensors (2 ranks), with the distribution."""
import os, sys, time, statistics, subprocess, socket

def worker():
    import torch, torch.distributed as dist, torchtpu, tpu_pg, jax
    rank = int(os.environ["RANK"])
    dist.init_process_group("tpu")
    pg = dist.group.WORLD
    t = torch.ones(1 << 18, device="tpu")
    def run(label, fn, n=30, pre=None):
        times = []
        for i in range(n):
            if pre: pre()
            s = time.perf_counter(); fn(); times.append((time.perf_counter() - s) * 1e3)
        times = times[5:]
        if rank == 0:
            print(f"{label}: median {statistics.median(times):.2f} ms  min {min(times):.2f}  max {max(times):.2f}  "
                  f"all {' '.join(f'{x:.1f}' for x in times)}", flush=True)
    cpu = torch.ones(1 << 18)
    run("gloo cpu tensor", lambda: dist.all_reduce(cpu))
    run("tpu all_reduce + synchronize", lambda: (dist.all_reduce(t), torch.tpu.synchronize()))
    run("tpu all_reduce + synchronize, gloo barrier first", lambda: (dist.all_reduce(t), torch.tpu.synchronize()), pre=dist.barrier)
    progs = pg.programs
    arr = torchtpu.core.tensor.read(t)
    run("raw jitted psum (no torch) + block", lambda: progs.run("allreduce", arr, op="SUM").block_until_ready())
    run("raw jitted psum, barrier first", lambda: progs.run("allreduce", arr, op="SUM").block_until_ready(), pre=dist.barrier)
    dist.destroy_process_group()
    os._exit(0)

if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker()
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    here = os.path.dirname(os.path.abspath(__file__))
    ps = [subprocess.Popen([sys.executable, __file__, "--worker"], env=dict(os.environ, RANK=str(r), WORLD_SIZE="2",
          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONPATH=here), start_new_session=True) for r in range(2)]
    try:
        for p in ps: p.wait(timeout=180)
    finally:
        for p in ps:
            if p.poll() is None: os.killpg(p.pid, 9)
