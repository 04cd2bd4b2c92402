"""The Llama training step on PyTorch/XLA 2.9 (XLA's CPU backend), the predecessor, as a peer.

Runs in PyTorch/XLA's own virtual environment (``bench/setup_ptxla.sh``
makes it), never in torchtpu's: torch_xla needs torch 2.9, and the project
never imports it.  ``bench/llama_step.py`` calls this script in a
subprocess and puts its figures in the same table.  It prints one JSON line:
cold (seconds to the end of step 2), step (median seconds), losses, and how
many XLA graphs PyTorch/XLA compiled.

    .venv-ptxla/bin/python bench/ptxla_peer.py --size 10m --steps 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla.debug.metrics as metrics  # noqa: E402
from llama_config import make_batch, make_model, make_optimizer  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="10m")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    device = torch_xla.device()
    model = make_model(args.size)
    ids, labels = (t.to(device) for t in make_batch(model.config.vocab_size))
    model = model.to(device)
    optimizer = make_optimizer(model)

    def step():
        loss = F.cross_entropy(model(ids).logits.flatten(0, 1).float(), labels.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        torch_xla.sync()  # PyTorch/XLA's step boundary (mark_step)
        return loss.item()

    start = time.perf_counter()
    losses = [step(), step()]
    cold = time.perf_counter() - start
    times = []
    for _ in range(args.steps):
        t = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - t)
    compiles = metrics.metric_data("CompileTime")
    print(json.dumps({"cold": cold, "step": statistics.median(times), "losses": losses,
                      "compiles": compiles[0] if compiles else None}))


if __name__ == "__main__":
    main()
