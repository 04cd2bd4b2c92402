"""`torchtpu tune cost` checked against the clock: predicted and measured XLA:CPU step times.

For each model, a compiled training step (forward, backward, AdamW) runs a
few times under ``cost.Capture``; the captured programs are costed on the
"host" target, this machine calibrated afresh just before the step is timed (matmul FLOP/s
per dtype and shape, convolutions, memory bandwidth per size, transposes,
the cost of new memory, vector work, gathers, reductions, launch, per-op
and torchtpu's per-graph overheads).  The machine is shared, so the least
disturbed runs say best what it can do: each calibration figure is the
lower quartile of its runs, and the measured step is the best of its
steps; the median step is shown too.  The Llama models are the ones of ``bench/llama_step.py``;
the MLP, the small conv net and GPT-2 (tiny) are models the model was not
tuned against.  The target is a predicted/measured ratio within 0.75-1.25.

    .venv/bin/python bench/tune_cost.py                  # all models; writes its section of docs/benchmarks.md
    .venv/bin/python bench/tune_cost.py --models mlp --no-write
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from llama_config import make_batch, make_model, make_optimizer

import torchtpu  # noqa: F401  registers the tpu device
from torchtpu.tools.tune import cost


def _descend(loss, optimizer):
    """Gradients of ``loss``, then one optimizer step; returns the loss, detached."""
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.detach()


def _train_step(model, loss_fn, batch):
    """A compiled AdamW training step of ``model`` on ``batch`` (already on the device)."""
    optimizer = make_optimizer(model, capturable=True)
    return torch.compile(lambda: _descend(loss_fn(model, *batch), optimizer), backend="tpu")


def _to_device(*tensors):
    return [t.to("tpu") for t in tensors]


def llama(size):
    model = make_model(size).to("tpu")

    def loss(model, ids, labels):
        return F.cross_entropy(model(ids).logits.flatten(0, 1).float(), labels.flatten())

    return model, _train_step(model, loss, _to_device(*make_batch(model.config.vocab_size)))


def mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 2048),
                                torch.nn.GELU(), torch.nn.Linear(2048, 10)).to("tpu")
    batch = _to_device(torch.randn(256, 1024), torch.randint(0, 10, (256,)))
    return model, _train_step(model, lambda m, x, y: F.cross_entropy(m(x), y), batch)


def convnet():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(64 * 8 * 8, 10)).to("tpu")
    batch = _to_device(torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,)))
    return model, _train_step(model, lambda m, x, y: F.cross_entropy(m(x), y), batch)


def gpt2_tiny():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=8192, n_positions=256, n_embd=256, n_layer=4, n_head=4,
                        attn_implementation="sdpa")
    model = GPT2LMHeadModel(config).to("tpu")
    ids = torch.randint(0, config.vocab_size, (8, 128), generator=torch.Generator().manual_seed(1))
    return model, _train_step(model, lambda m, ids: m(ids, labels=ids).loss, _to_device(ids))


MODELS = {"llama 10m": lambda: llama("10m"), "llama 100m": lambda: llama("100m"), "mlp": mlp,
          "convnet": convnet, "gpt-2 tiny": gpt2_tiny}


def measure(name, steps, calibration):
    """One row: the step's programs costed on the host calibrated just before, and the step timed."""
    torch._dynamo.reset()
    model, step = MODELS[name]()
    with cost.Capture() as capture:
        for _ in range(3):
            step().item()
    cost.calibrate(calibration, refresh=True)  # just before the timing, under the same load
    predicted = cost.predict_programs(capture.programs, "host", calibration)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        torch.tpu.synchronize()  # all three programs done, not just the one that makes the loss
        times.append(time.perf_counter() - start)
    v5e = cost.predict_programs(capture.programs, "v5e")
    row = dict(model=name, params=sum(p.numel() for p in model.parameters()), programs=len(capture.programs),
               gflop=predicted.flops / 1e9, predicted=predicted.seconds, best=min(times),
               median=statistics.median(times), v5e=v5e.seconds, v5e_mfu=v5e.mfu)
    print(_line(row), flush=True)
    return row


def _line(row):
    return (f"| {row['model']} | {row['params'] / 1e6:.1f}M | {row['programs']} | {row['gflop']:.2f} | "
            f"{row['predicted'] * 1e3:.1f} | {row['best'] * 1e3:.1f} | **{row['predicted'] / row['best']:.2f}** | "
            f"{row['median'] * 1e3:.1f} | {row['predicted'] / row['median']:.2f} | "
            f"{row['v5e'] * 1e3:.3f} | {row['v5e_mfu']:.0%} |")


HEADER = ["| model (training step) | parameters | programs | GFLOP/step | predicted ms | measured best ms | "
          "predicted / best | measured median ms | predicted / median | v5e predicted ms | v5e MFU |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    started, load = time.time(), os.getloadavg()
    calibration = os.path.join(tempfile.mkdtemp(), "calibration.json")  # the user's cache stays as it was
    print("\n".join(HEADER))
    rows = []
    for name in args.models:
        try:
            rows.append(measure(name, args.steps, calibration))
        except Exception as error:  # noqa: BLE001  a model that fails is reported, not fatal
            print(f"FAILED {name}: {type(error).__name__}: {error}", file=sys.stderr)
    if not args.no_write and rows:
        write(rows, args, started, load, calibration)


def write(rows, args, started, load, calibration):
    import jax

    import results

    within = [r["model"] for r in rows if 0.75 <= r["predicted"] / r["best"] <= 1.25]
    outside = [f"{r['model']} ({r['predicted'] / r['best']:.2f})" for r in rows if r["model"] not in within]
    verdict = f"Within +-25% of the best measured step: {', '.join(within) or 'none'}." + (
        f" Outside: {', '.join(outside)}." if outside else "")
    command = "python bench/tune_cost.py" + (f" --models {' '.join(repr(m) for m in args.models)}"
                                             if args.models != list(MODELS) else "")
    text = "\n\n".join([
        "## `torchtpu tune cost`: predicted vs measured step time on XLA:CPU",
        __doc__.split("\n\n    .venv")[0].split("\n", 1)[1].strip(),
        "\n".join(HEADER + [_line(r) for r in rows]), verdict,
        "The last calibration: " + cost._describe_host(cost.calibrate(calibration)).replace("\n", "; "),
        results.how_measured(command, started, "XLA CPU", f"jax {jax.__version__}, torch {torch.__version__}",
                             notes=[f"Load average at the start: {', '.join(f'{v:.2f}' for v in load)}; "
                                    f"at the end: {', '.join(f'{v:.2f}' for v in os.getloadavg())}"])])
    results.write_section("tune_cost.py", text)


if __name__ == "__main__":
    main()
