"""Faults on 2 ranks: a shape mismatch, destroy and init again, then a rank that exits.

Rank 1 ends the run by exiting without a word (as a crash would); rank 0
must then fail with a clear error within the group's timeout, both for a
collective it has compiled before and for a new one.
"""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

import torchtpu  # noqa: F401
from torchtpu.distributed import runtime
from launcher import free_port
from worker_common import RANK, WORLD, finish, run

DEV = "tpu"
TIMEOUT = datetime.timedelta(seconds=10)


def check_mismatch(c):
    start = time.monotonic()
    t = torch.ones(3 if RANK == 0 else 4, device=DEV)
    c.raises("a shape mismatch names the collective and both ranks", RuntimeError,
             ["all_reduce: rank 1 has shape (4,) float32", "but rank 0 has shape (3,) float32"],
             lambda: dist.all_reduce(t))
    c.true("the mismatch is found without waiting for the timeout", time.monotonic() - start < 8,
           f"{time.monotonic() - start:.1f} s")
    t = torch.ones(2, dtype=torch.int64 if RANK == 0 else torch.int32, device=DEV)
    c.raises("a dtype mismatch is found too", RuntimeError, ["broadcast", "int64", "int32"],
             lambda: dist.broadcast(t, src=0))
    t = torch.full((3,), float(RANK + 1), device=DEV)
    dist.all_reduce(t)  # the group is still usable
    c.equal("all_reduce after the mismatches", t, torch.full((3,), float(sum(r + 1 for r in range(WORLD)))))


def check_init_again(c):
    # A fresh port for the new store: a rank that is quick to init again must not find
    # rank 0's old store server, which lives until rank 0's destroy_process_group.
    store = dist.distributed_c10d._get_default_store()
    if RANK == 0:
        store.set("second world", f"tcp://127.0.0.1:{free_port()}")
    address = store.get("second world").decode()
    dist.barrier()
    dist.destroy_process_group()
    dist.init_process_group("tpu", init_method=address, rank=RANK, world_size=WORLD, timeout=TIMEOUT)
    t = torch.full((2,), float(RANK + 1), device=DEV)
    dist.all_reduce(t)
    c.equal("all_reduce after destroy_process_group and a new init", t, torch.full((2,), 3.0))
    c.raises("a different world in this process is refused: JAX's runtime cannot restart", RuntimeError,
             ["cannot restart", f"rank {RANK} of {WORLD + 1}"], lambda: runtime.start(None, RANK, WORLD + 1, TIMEOUT))
    t = torch.full((5,), float(RANK + 1), device=DEV)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # compiled now, run again after rank 1 is gone
    c.equal("all_reduce MAX in the new world", t, torch.full((5,), 2.0))


def check_dead_peer(c):
    dist.barrier()
    if RANK == 1:
        print("[rank 1] exiting without a word", flush=True)
        finish(c)  # os._exit: no shutdown, no goodbye
    time.sleep(2)  # let rank 1 be gone
    start = time.monotonic()
    t = torch.full((5,), 1.0, device=DEV)

    def known_program():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        t.cpu()

    c.raises("a collective compiled before fails clearly once the peer is gone", RuntimeError,
             ["all_reduce"], known_program)
    c.true("... at once", time.monotonic() - start < 10, f"{time.monotonic() - start:.1f} s")
    start = time.monotonic()
    c.raises("a new collective fails within the group's timeout, naming the absent rank", RuntimeError,
             ["all_gather_into_tensor", "rank(s) [1]", "did not reach"],
             lambda: dist.all_gather_into_tensor(torch.zeros(14, device=DEV), torch.ones(7, device=DEV)))
    elapsed = time.monotonic() - start
    c.true("... after about the timeout", 9 <= elapsed < 30, f"{elapsed:.1f} s")
    print(f"[rank 0] dead peer: new collective failed after {elapsed:.1f} s", flush=True)


def main(c):
    dist.init_process_group("tpu", timeout=TIMEOUT)
    check_mismatch(c)
    check_init_again(c)
    check_dead_peer(c)


if __name__ == "__main__":
    run(main)
