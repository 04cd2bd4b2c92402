"""Greedy decoding with ``transformers``' ``generate()`` and a static KV cache: tokens per second.

The Llama of bench/llama_config.py (random weights), batch 1, a prompt of 32
tokens, greedy decoding with ``StaticCache``.  Configurations, measured side
by side in one process:

- **cpu eager**: PyTorch's own CPU kernels (``generate`` never compiles on CPU);
- **tpu eager**: torchtpu's strict eager mode, op by op
  (``disable_compile=True``: transformers would otherwise compile the decode
  step on a ``tpu`` device by itself);
- **tpu compiled**: the model's forward under
  ``torch.compile(backend="tpu", dynamic=False, fullgraph=True)``; the
  prefill and the decode step are one program each, compiled once.

**decode tok/s** is the decode rate alone: each configuration generates
``short`` and ``long`` new tokens into the same cache (same shapes, no
recompile), and the rate is ``(long - short) / (time(long) - time(short))``,
median times, so the prefill and the per-call overhead cancel.
**generate tok/s** is ``long`` new tokens over the whole call, prefill
included.  **cold s** is the first call, compiles included.  Ratios are to
cpu eager; **tokens = cpu** says whether the greedy tokens equal CPU's.
The configurations take turns within each repeat.

    .venv/bin/python bench/hf_decode.py              # ~100M parameters; writes its section of docs/benchmarks.md
    .venv/bin/python bench/hf_decode.py --quick      # ~10M parameters, fewer tokens, writes nothing
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

import torch
import transformers
from llama_config import SIZES, make_model

import torchtpu  # noqa: F401  registers the tpu device
from results import how_measured, write_section

PROMPT = 32
CONFIGS = ["cpu eager", "tpu eager", "tpu compiled"]


def prompt_ids(vocab_size: int) -> torch.Tensor:
    return torch.randint(3, vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(1))


def decoder(model, name: str, long: int):
    """A function ``new_tokens -> generated ids on the host`` for one configuration."""
    device, mode = name.split()
    model = copy.deepcopy(model).to(device)
    if mode == "compiled":
        model.forward = torch.compile(model.forward, backend="tpu", dynamic=False, fullgraph=True)
    ids = prompt_ids(model.config.vocab_size).to(device)

    def generate(new_tokens: int) -> torch.Tensor:
        # A new cache of the same size for every call: the same shapes, so the same programs.
        # (A reused cache, reset, reports its length as a tensor, and transformers' causal-mask
        # shortcut then branches on that tensor's value: a graph break in the prefill.)
        cache = transformers.StaticCache(config=model.config, max_cache_len=PROMPT + long)
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            past_key_values=cache,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            disable_compile=mode == "eager",
        )
        return out.cpu()  # waits for the device

    return generate


def cold_start(generate, short: int, long: int) -> dict:
    """The first call (compiles included), and the programs compiled by it and by a first short call."""
    misses = torch.tpu.compile_cache_stats()["misses"]
    start = time.perf_counter()
    tokens = generate(long)
    cold = time.perf_counter() - start
    generate(short)
    return {"tokens": tokens, "cold": cold, "compiles": torch.tpu.compile_cache_stats()["misses"] - misses,
            "times": {short: [], long: []}}


def measure(generators: dict, short: int, long: int, repeats: int) -> dict:
    """Every configuration's rates; the configurations take turns within each repeat,
    so that load from elsewhere on the machine hits them alike."""
    rows = {}
    for name, generate in generators.items():
        try:
            rows[name] = cold_start(generate, short, long)
        except Exception as error:  # noqa: BLE001  (a configuration that fails is reported, not fatal)
            rows[name] = error
        print(f"  {name:13s} {_describe_cold(rows[name])}", file=sys.stderr, flush=True)
    misses = torch.tpu.compile_cache_stats()["misses"]
    for _ in range(repeats):
        for name, row in rows.items():
            if isinstance(row, Exception):
                continue
            for n in (short, long):
                start = time.perf_counter()
                generators[name](n)
                row["times"][n].append(time.perf_counter() - start)
    for row in rows.values():
        if not isinstance(row, Exception):
            t_short, t_long = statistics.median(row["times"][short]), statistics.median(row["times"][long])
            row.update(decode=(long - short) / (t_long - t_short), generate=long / t_long)
    recompiles = torch.tpu.compile_cache_stats()["misses"] - misses
    print(f"  programs compiled after the first calls: {recompiles}", file=sys.stderr)
    return rows


def _describe_cold(row) -> str:
    if isinstance(row, Exception):
        return f"failed: {type(row).__name__}: {str(row).splitlines()[0][:160]}"
    return f"cold {row['cold']:6.1f} s, {row['compiles']} programs compiled"


def table(rows: dict, title: str) -> str:
    base = rows.get("cpu eager")
    lines = [f"### {title}", "",
             "| configuration | decode tok/s | decode / cpu eager | generate tok/s | generate / cpu eager | cold s | "
             "programs compiled | tokens = cpu |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        if isinstance(r, Exception):
            lines.append(f"| {name} | failed: {type(r).__name__}: {str(r).splitlines()[0][:80]} | | | | | | |")
            continue
        ok = isinstance(base, dict)
        same = "yes" if ok and torch.equal(r["tokens"], base["tokens"]) else ("no" if ok else "n/a")
        lines.append(
            f"| {name} | {r['decode']:.1f} | {r['decode'] / base['decode'] if ok else float('nan'):.2f} | "
            f"{r['generate']:.1f} | {r['generate'] / base['generate'] if ok else float('nan'):.2f} | "
            f"{r['cold']:.1f} | {r['compiles'] if name.startswith('tpu') else 'n/a'} | {same} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="100m")
    parser.add_argument("--quick", action="store_true", help="10m model, fewer tokens and repeats, write nothing")
    parser.add_argument("--short", type=int, default=16)
    parser.add_argument("--long", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--cpu-threads", type=int, help="CPU PyTorch's threads (steadier on a busy machine)")
    args = parser.parse_args()
    if args.cpu_threads:
        torch.set_num_threads(args.cpu_threads)
    size = "10m" if args.quick else args.size
    short, long, repeats = (4, 12, 1) if args.quick else (args.short, args.long, args.repeats)
    transformers.logging.set_verbosity_error()
    started, load = time.time(), os.getloadavg()
    model = make_model(size).eval()
    params = sum(p.numel() for p in model.parameters())
    title = (f"Llama {size} ({params / 1e6:.1f}M parameters), float32, batch 1, prompt {PROMPT} tokens, "
             f"greedy, static cache: {short} vs {long} new tokens")
    print(title, file=sys.stderr)
    generators = {}
    for name in args.configs.split(","):
        generators[name] = decoder(model, name, long)
    rows = measure(generators, short, long, repeats)
    for name, r in rows.items():
        if not isinstance(r, Exception):
            print(f"  {name:13s} decode {r['decode']:7.1f} tok/s  generate {r['generate']:7.1f} tok/s",
                  file=sys.stderr)
    report = table(rows, title)
    print(report)
    if args.quick:
        return
    versions = (f"torch {torch.__version__}, transformers {transformers.__version__}, "
                f"torchtpu {torchtpu.__version__}; CPU PyTorch threads: {torch.get_num_threads()}")
    command = f"python bench/hf_decode.py --size {size} --short {short} --long {long} --repeats {repeats}" + (
        f" --cpu-threads {args.cpu_threads}" if args.cpu_threads else "")
    write_section("hf_decode.py", "\n".join([
        "## Hugging Face greedy decoding with a static cache", "",
        __doc__.split("\n\n", 1)[1].split("    .venv")[0].strip(), "",
        report, "",
        how_measured(command, started, torch.tpu.get_device_name(), versions,
                     notes=[f"Load average at start: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} (the cores are shared)"]),
    ]))


if __name__ == "__main__":
    main()
