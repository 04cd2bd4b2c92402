"""Peak host memory while ``from_pretrained(dir, device_map="tpu")`` loads a sharded checkpoint.

A Llama with random weights is saved with ``save_pretrained(max_shard_size=...)``
as several safetensors shards.  A fresh process then imports torch, torchtpu
and transformers, touches the device once, takes its resident set size as the
baseline, and loads the checkpoint onto ``tpu``.  The peak resident set size
during the load, minus the baseline, is the extra host memory the load took.

The columns split that extra:

- **model on the device**: the model's own bytes, ``torch.tpu.memory_allocated()``
  after the load.  On a real TPU they are in device memory; on XLA's CPU
  backend the "device" is host memory, so they count here.
- **checkpoint files mapped**: pages of the safetensors files.  transformers
  opens every shard with ``mmap`` and closes them only when all are loaded, so
  the whole checkpoint is resident by the end (clean page cache, shared with
  the kernel's file cache, dropped under memory pressure; the same on any
  device).
- **transient host allocations**: what the load allocated on the host beyond
  the model (the peak of ``RssAnon``, sampled every millisecond, minus the
  model on the device): tensors read from a shard, on their way to the
  device.  A loader that builds the whole model on the host first would hold a
  second full copy here; a streaming one holds about a shard.

    .venv/bin/python bench/hf_load_memory.py             # ~160 MB checkpoint; writes its section of docs/benchmarks.md
    .venv/bin/python bench/hf_load_memory.py --quick     # ~40 MB, writes nothing
"""

from __future__ import annotations

import argparse
import json
import pathlib
import resource
import subprocess
import sys
import tempfile
import threading
import time

# name -> (Llama config overrides, max shard size): the checkpoint's float32 size is about 160 MB / 40 MB.
SIZES = {
    "160m": (dict(vocab_size=8000, hidden_size=768, intermediate_size=2048, num_hidden_layers=4,
                  num_attention_heads=12, num_key_value_heads=12), "24MB"),
    "40m": (dict(vocab_size=4000, hidden_size=384, intermediate_size=1024, num_hidden_layers=4,
                 num_attention_heads=6, num_key_value_heads=6), "8MB"),
}
MIB = 1 << 20


def write_checkpoint(directory, size: str) -> dict:
    """Save a random Llama in several safetensors shards; returns the shard and total sizes in bytes."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    overrides, max_shard_size = SIZES[size]
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**overrides, tie_word_embeddings=False))
    model.save_pretrained(directory, max_shard_size=max_shard_size)
    shards = sorted(pathlib.Path(directory).glob("*.safetensors"))
    sizes = [s.stat().st_size for s in shards]
    return {"shards": len(shards), "largest_shard": max(sizes), "total": sum(sizes),
            "parameters": sum(p.numel() for p in model.parameters())}


def _status() -> dict:
    """/proc/self/status's memory fields in bytes: VmRSS (resident now), VmHWM (its peak),
    RssAnon (memory the process allocated) and RssFile (pages of mapped files)."""
    fields = {}
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            fields[name] = int(value.split()[0]) * 1024
    return fields


class PeakSampler:
    """Samples RssAnon and RssFile every millisecond on a thread: /proc keeps only the peak of their sum."""

    def __init__(self):
        self.peak = {"RssAnon": 0, "RssFile": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self._sample()
            time.sleep(0.001)

    def _sample(self):
        now = _status()
        for name in self.peak:
            self.peak[name] = max(self.peak[name], now[name])

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()


def child(directory: str, dtype_name: str) -> dict:
    """Runs in a fresh process: load the checkpoint onto tpu and report the host memory it took."""
    import gc

    import torch
    import transformers
    import transformers.models.llama.modeling_llama  # noqa: F401  (imported before the baseline)

    import torchtpu  # noqa: F401

    transformers.logging.set_verbosity_error()
    dtype = getattr(torch, dtype_name)
    (torch.ones(8, device="tpu", dtype=dtype) * 2).cpu()  # the device client and a first program exist now
    transformers.AutoConfig.from_pretrained(directory)
    gc.collect()
    baseline = _status()
    baseline_maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    pathlib.Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS, so VmHWM is the load's own peak
    device_before = torch.tpu.memory_allocated()
    start = time.perf_counter()
    with PeakSampler() as sampler:
        model = transformers.AutoModelForCausalLM.from_pretrained(directory, device_map="tpu", dtype=dtype)
    seconds = time.perf_counter() - start
    after = _status()
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert {p.device.type for p in model.parameters()} == {"tpu"}
    model_bytes = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    return {
        "rss_extra": after["VmHWM"] - baseline["VmRSS"],  # the peak resident set, all of it
        "maxrss_extra": maxrss - baseline_maxrss,  # ru_maxrss: the same peak, as a high-water mark since exec
        "anon_extra": sampler.peak["RssAnon"] - baseline["RssAnon"],
        "file_extra": sampler.peak["RssFile"] - baseline["RssFile"],
        "device": torch.tpu.memory_allocated() - device_before,
        "model_bytes": model_bytes,
        "seconds": seconds,
        "platform": torch.tpu.get_device_name(),
    }


def measure(directory, dtype_name: str) -> dict:
    """``child`` in a fresh process (its own baseline and peak)."""
    done = subprocess.run([sys.executable, __file__, "--child", str(directory), dtype_name],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the loading process failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def transient(row: dict) -> int:
    """Host memory the load allocated beyond the model's own bytes on the device, at its peak."""
    return row["anon_extra"] - row["device"]


def table(checkpoint: dict, rows: dict) -> str:
    lines = ["| load dtype | peak RSS extra MiB | model on the device MiB | checkpoint files mapped MiB | "
             "transient host allocations MiB | transient / largest shard | transient / checkpoint | load s |",
             "|---|---|---|---|---|---|---|---|"]
    for dtype_name, r in rows.items():
        extra = transient(r)
        lines.append(f"| {dtype_name} | {r['rss_extra'] / MIB:.0f} | {r['device'] / MIB:.0f} | "
                     f"{r['file_extra'] / MIB:.0f} | {extra / MIB:.0f} | {extra / checkpoint['largest_shard']:.2f} | "
                     f"{extra / checkpoint['total']:.2f} | {r['seconds']:.1f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="160m")
    parser.add_argument("--quick", action="store_true", help="the 40m checkpoint, write nothing")
    parser.add_argument("--child", nargs=2, metavar=("DIR", "DTYPE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    size = "40m" if args.quick else args.size
    started = time.time()
    with tempfile.TemporaryDirectory() as directory:
        checkpoint = write_checkpoint(directory, size)
        rows = {dtype_name: measure(directory, dtype_name) for dtype_name in ("float32", "bfloat16")}
    summary = (f"Checkpoint: Llama, {checkpoint['parameters'] / 1e6:.1f}M parameters in float32, "
               f"{checkpoint['shards']} safetensors shards, {checkpoint['total'] / MIB:.0f} MiB in all, "
               f"the largest {checkpoint['largest_shard'] / MIB:.0f} MiB.")
    report = f"{summary}\n\n{table(checkpoint, rows)}"
    print(report)
    print(json.dumps({"checkpoint": checkpoint, "rows": rows}), file=sys.stderr)
    if args.quick:
        return
    import torch
    import transformers

    import torchtpu

    from results import how_measured, write_section

    versions = f"torch {torch.__version__}, transformers {transformers.__version__}, torchtpu {torchtpu.__version__}"
    peak = ("Peak: `VmHWM` of the loading process, reset to `VmRSS` (`/proc/self/clear_refs`) just before "
            "`from_pretrained`; baseline: `VmRSS` after the imports and a first device op.")
    write_section("hf_load_memory.py", "\n".join([
        "## Host memory while loading a sharded checkpoint onto tpu", "",
        __doc__.split("\n\n", 1)[1].split("    .venv")[0].strip(), "",
        report, "",
        how_measured(f"python bench/hf_load_memory.py --size {size}", started, rows["float32"]["platform"],
                     versions, notes=[peak]),
    ]))


if __name__ == "__main__":
    main()
