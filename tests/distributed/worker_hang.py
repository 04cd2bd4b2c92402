"""A rank that hangs: rank 1 stops before a collective both ranks have run before.

Rank 0's call returns (collectives are asynchronous), but its result never
comes; the watchdog must end rank 0 with a clear error within the group's
timeout instead of letting it wait forever.
"""

from __future__ import annotations

import datetime
import sys
import time

import torch
import torch.distributed as dist

import torchtpu  # noqa: F401
from worker_common import RANK

dist.init_process_group("tpu", timeout=datetime.timedelta(seconds=float(sys.argv[1])))
t = torch.ones(4, device="tpu")
dist.all_reduce(t)  # compiled and agreed on: the next call skips the store check
print(f"[rank {RANK}] first all_reduce {t.cpu().tolist()}", flush=True)
if RANK == 1:
    time.sleep(600)  # hung: alive, never joins
start = time.monotonic()
dist.all_reduce(t)
print(f"[rank {RANK}] issued the second all_reduce", flush=True)
print(f"[rank {RANK}] UNEXPECTED result {t.cpu().tolist()} after {time.monotonic() - start:.0f} s", flush=True)
