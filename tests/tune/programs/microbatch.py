"""Planted problem: gradient accumulation over microbatches of one example.

A step over a batch of 64 runs the model 64 times at `--microbatch=1`, once at
`--microbatch=64`; on a chip every extra pass is a round of small programs, so
small microbatches cost many times the step.  Script-level: the search finds
it through `--vary microbatch=1,64`.
"""

import argparse

import torch

import torchtpu  # noqa: F401
from torchtpu.tools.tune.search import steps

parser = argparse.ArgumentParser()
parser.add_argument("--microbatch", type=int, default=1)
parser.add_argument("--batch", type=int, default=64)
args = parser.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(args.batch, 32, device="tpu"), torch.randn(args.batch, 4, device="tpu")
for _ in steps(4):
    opt.zero_grad()
    for start in range(0, args.batch, args.microbatch):
        part = slice(start, start + args.microbatch)
        loss = torch.nn.functional.mse_loss(model(x[part]), y[part]) * (args.microbatch / args.batch)
        loss.backward()
    opt.step()
