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

    .venv/bin/python bench/hf_decode.py              # ~100M parameters; writes its section of docs/benchmarks.md
    .venv/bin/python bench/hf_decode.py --quick      # ~10M parameters, fewer tokens, writes nothing
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import platform
import statistics
import sys
import time

import torch
import transformers
from llama_config import SIZES, make_model

import torchtpu  # noqa: F401  registers the tpu device
from results import write_section

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


def measure(generate, short: int, long: int, repeats: int) -> dict:
    misses = torch.tpu.compile_cache_stats()["misses"]
    start = time.perf_counter()
    tokens = generate(long)
    cold = time.perf_counter() - start
    generate(short)  # the short call's own first-time work (none expected)
    compiles = torch.tpu.compile_cache_stats()["misses"] - misses
    times = {short: [], long: []}
    for _ in range(repeats):
        for n in (short, long):
            start = time.perf_counter()
            generate(n)
            times[n].append(time.perf_counter() - start)
    t_short, t_long = statistics.median(times[short]), statistics.median(times[long])
    return {"tokens": tokens, "cold": cold, "compiles": compiles, "decode": (long - short) / (t_long - t_short),
            "generate": long / t_long, "after_cold_compiles": torch.tpu.compile_cache_stats()["misses"] - misses
            - compiles}


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
    args = parser.parse_args()
    size = "10m" if args.quick else args.size
    short, long, repeats = (4, 12, 1) if args.quick else (args.short, args.long, args.repeats)
    transformers.logging.set_verbosity_error()
    started = time.time()
    model = make_model(size).eval()
    params = sum(p.numel() for p in model.parameters())
    title = (f"Llama {size} ({params / 1e6:.1f}M parameters), float32, batch 1, prompt {PROMPT} tokens, "
             f"greedy, static cache: {short} vs {long} new tokens")
    print(title, file=sys.stderr)
    rows = {}
    for name in args.configs.split(","):
        try:
            rows[name] = measure(decoder(model, name, long), short, long, repeats)
            r = rows[name]
            print(f"  {name:13s} decode {r['decode']:7.1f} tok/s  generate {r['generate']:7.1f} tok/s  "
                  f"cold {r['cold']:6.1f} s  compiles {r['compiles']} (+{r['after_cold_compiles']} later)",
                  file=sys.stderr, flush=True)
        except Exception as error:  # noqa: BLE001  (a configuration that fails is reported, not fatal)
            rows[name] = error
            print(f"  {name:13s} failed: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
    report = table(rows, title)
    print(report)
    if args.quick:
        return
    machine = f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores; device: {torch.tpu.get_device_name()}"
    versions = (f"torch {torch.__version__}, transformers {transformers.__version__}, "
                f"torchtpu {torchtpu.__version__}; CPU PyTorch threads: {torch.get_num_threads()}")
    write_section("hf_decode.py", "\n".join([
        "## Hugging Face greedy decoding with a static cache", "",
        __doc__.split("\n\n", 1)[1].split("    .venv")[0].strip(), "",
        report, "",
        "### How this was measured", "",
        f"- Command: `python bench/hf_decode.py --size {size} --short {short} --long {long} --repeats {repeats}`",
        f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- Machine: {machine}",
        f"- Versions: {versions}",
        f"- Total time: {time.time() - started:.0f} s",
    ]))


if __name__ == "__main__":
    main()
