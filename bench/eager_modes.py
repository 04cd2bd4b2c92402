"""One MLP training step (forward, backward, AdamW) in strict and in fused eager mode.

Both modes run the same model side by side in one process, taking turns
within each repeat so that load on the machine hits them alike; the median
step time of each is reported, with their ratio.  Each step ends with
``torch.tpu.synchronize()``, so a step's time includes its device work.

    .venv/bin/python bench/eager_modes.py            # width 256, batch 64
    .venv/bin/python bench/eager_modes.py --quick
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import torchtpu  # noqa: F401  registers the tpu device

EagerMode = torch.tpu.EagerMode


def make_trainer(width: int, batch: int, depth: int = 3):
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 10)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(batch, width, device="tpu")
    y = torch.randint(0, 10, (batch,), device="tpu")

    def step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        torch.tpu.synchronize()

    return step


def time_steps(step, mode, n: int) -> float:
    with torch.tpu.eager_mode(mode):
        start = time.perf_counter()
        for _ in range(n):
            step()
        return (time.perf_counter() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    repeats, steps = (5, 5) if args.quick else (11, 10)
    trainers = {mode: make_trainer(args.width, args.batch) for mode in (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)}
    for mode, step in trainers.items():  # warm up: compile every program and graph
        time_steps(step, mode, 3)
    times = {mode: [] for mode in trainers}
    for _ in range(repeats):
        for mode, step in trainers.items():
            times[mode].append(time_steps(step, mode, steps))
    strict, fused = (statistics.median(times[m]) * 1e3 for m in trainers)
    ops = torch.tpu.fused_stats()["ops fused"] / torch.tpu.fused_stats()["graphs run"]
    print(f"MLP {args.width}x{args.width}x3, batch {args.batch}, AdamW; ~{ops:.0f} ops per step")
    print(f"strict {strict:.2f} ms/step   fused {fused:.2f} ms/step   fused/strict {fused / strict:.2f}")


if __name__ == "__main__":
    main()
