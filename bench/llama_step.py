"""A Llama-style model from ``transformers`` (random weights): forward and AdamW training step.

Configurations, measured side by side in one process:

- **cpu eager**: PyTorch's own CPU kernels;
- **cpu inductor**: ``torch.compile(backend="inductor")`` on CPU;
- **tpu strict / fused / compiled**: torchtpu's strict eager mode, fused
  eager mode (``DEFER_AND_FUSE``) and ``torch.compile(backend="tpu")``
  (three programs per training step: forward, backward, optimizer);
- **tpu compiled+fused**: the same compiled function run in fused eager
  mode, where the three compiled graphs join one pending graph: the whole
  training step is one XLA program;
- **jax**: the same math written by hand in JAX under ``jax.jit`` (the
  weights are the model's own, so its loss must equal the others'); this is
  the ceiling for anything that runs on XLA;
- **pytorch/xla**: PyTorch/XLA 2.9 on XLA's CPU backend, the predecessor on
  the same compiler, run by ``bench/ptxla_peer.py`` in its own environment
  and process (``bench/setup_ptxla.sh``; training step only).

For each one: *cold*, the wall time to the end of the second step, compiles
included; and *step*, the median time of the following steps (each ends with
a device sync).  The in-process configurations take turns step by step, so
that the machine's load falls on all of them alike; PyTorch/XLA runs alone
in its process afterwards.  The ratio column divides by the JAX step.
Cold starts are also measured with each configuration alone in a new
process, which is the fair comparison (in one process a configuration can
find tracing and compiling already done by the one before).

    .venv/bin/python bench/llama_step.py                 # ~10M parameters; writes its section of docs/benchmarks.md
    .venv/bin/python bench/llama_step.py --size 100m     # ~100M parameters (slow on 2 cores)
    .venv/bin/python bench/llama_step.py --quick         # fewer steps, no warm-start run, writes nothing
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.functional as F
from llama_config import BETAS, EPS, LR, SIZES, WEIGHT_DECAY, make_batch, make_model, make_optimizer

import torchtpu  # noqa: F401  registers the tpu device
import torchtpu.eager.fused
from results import how_measured, write_section

# ---- the torch configurations ---------------------------------------------------------------------


def torch_runner(model, device, mode, batch, train):
    """A step function for one torch configuration; returns the loss as a float."""
    model = copy.deepcopy(model).to(device)
    ids, labels = (t.to(device) for t in batch)
    compiled = mode.startswith("compiled")
    optimizer = make_optimizer(model, capturable=device == "tpu" and compiled)

    def forward():
        with torch.no_grad():
            logits = model(ids).logits
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())

    def train_step():
        loss = F.cross_entropy(model(ids).logits.flatten(0, 1).float(), labels.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.detach()

    fn = train_step if train else forward
    if compiled or mode == "inductor":
        fn = torch.compile(fn, backend="tpu" if compiled else "inductor")
    fuse = mode in ("fused", "compiled+fused")
    eager_mode = torch.tpu.EagerMode.DEFER_AND_FUSE if fuse else torch.tpu.EagerMode.DEFER_NEVER

    def dispatch():
        """The step up to its loss, not waiting for the device (fused: recorded, then run)."""
        with torch.tpu.eager_mode(eager_mode):
            return fn()

    def step():
        loss = dispatch().item()
        if device == "tpu":
            # The loss is ready before the step's last program is done (compiled: backward and
            # optimizer run after the forward that made it): wait for all, so that no step's
            # work is counted in the next configuration's time.
            torch.tpu.synchronize()
        return loss

    step.dispatch = dispatch

    if fuse and train:  # the step is one program (the optimizer step ends the fused graph)
        step.memory_analysis = torchtpu.eager.fused.memory_analysis
    return step


# ---- the same model in JAX ----------------------------------------------------------------------------


def jax_params(model):
    return {name: jnp.asarray(p.detach().numpy()) for name, p in model.named_parameters()}


def jax_loss(params, ids, labels, config):
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    dim = config.hidden_size
    head_dim = dim // heads
    b, t = ids.shape

    def rms_norm(x, weight):
        variance = jnp.mean(x * x, axis=-1, keepdims=True)
        return weight * (x * jax.lax.rsqrt(variance + config.rms_norm_eps))

    inv_freq = 1.0 / (config.rope_parameters["rope_theta"] ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = jnp.arange(t, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    cos, sin = jnp.cos(emb), jnp.sin(emb)

    def rope(x):  # (b, h, t, d)
        half = x.shape[-1] // 2
        rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rotated * sin

    x = params["model.embed_tokens.weight"][ids]
    causal = jnp.tril(jnp.ones((t, t), bool))
    for i in range(config.num_hidden_layers):
        p = lambda name: params[f"model.layers.{i}.{name}"]  # noqa: E731
        h = rms_norm(x, p("input_layernorm.weight"))
        q = (h @ p("self_attn.q_proj.weight").T).reshape(b, t, heads, head_dim).transpose(0, 2, 1, 3)
        k = (h @ p("self_attn.k_proj.weight").T).reshape(b, t, kv_heads, head_dim).transpose(0, 2, 1, 3)
        v = (h @ p("self_attn.v_proj.weight").T).reshape(b, t, kv_heads, head_dim).transpose(0, 2, 1, 3)
        q, k = rope(q), rope(k)
        k, v = jnp.repeat(k, heads // kv_heads, axis=1), jnp.repeat(v, heads // kv_heads, axis=1)
        scores = jnp.where(causal, q @ k.transpose(0, 1, 3, 2) / np.sqrt(head_dim), -jnp.inf)
        attention = jax.nn.softmax(scores, axis=-1) @ v
        x = x + attention.transpose(0, 2, 1, 3).reshape(b, t, dim) @ p("self_attn.o_proj.weight").T
        h = rms_norm(x, p("post_attention_layernorm.weight"))
        gate, up = h @ p("mlp.gate_proj.weight").T, h @ p("mlp.up_proj.weight").T
        x = x + (jax.nn.silu(gate) * up) @ p("mlp.down_proj.weight").T
    logits = rms_norm(x, params["model.norm.weight"]) @ params["lm_head.weight"].T
    logp = jax.nn.log_softmax(logits.reshape(b * t, -1), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels.reshape(-1, 1), axis=1))


def jax_runner(model, batch, train):
    config = model.config
    params = jax_params(model)
    ids, labels = (jnp.asarray(t.numpy()) for t in batch)
    state = {"params": params, "m": jax.tree.map(jnp.zeros_like, params), "v": jax.tree.map(jnp.zeros_like, params),
             "step": jnp.zeros((), jnp.int32)}

    @jax.jit
    def forward(params):
        return jax_loss(params, ids, labels, config)

    @functools.partial(jax.jit, donate_argnums=(0,))  # the old state's buffers are reused
    def train_step(state):
        loss, grads = jax.value_and_grad(jax_loss)(state["params"], ids, labels, config)
        step = state["step"] + 1
        b1, b2 = BETAS
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state["m"], grads)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state["v"], grads)
        c1, c2 = 1 - b1 ** step, 1 - b2 ** step

        def update(p, m, v):
            p = p * (1 - LR * WEIGHT_DECAY)
            return p - LR * (m / c1) / (jnp.sqrt(v / c2) + EPS)

        params = jax.tree.map(update, state["params"], m, v)
        return loss, {"params": params, "m": m, "v": v, "step": step}

    def step():
        nonlocal state
        if not train:
            return float(forward(state["params"]))
        loss, state = train_step(state)
        jax.block_until_ready(state)
        return float(loss)

    if train:
        step.memory_analysis = lambda: train_step.lower(state).compile().memory_analysis()
    return step


# ---- measuring -----------------------------------------------------------------------------------------


def cold_start(step):
    """Time to the end of the second step (compiles included), and the two losses."""
    start = time.perf_counter()
    losses = [step(), step()]
    return time.perf_counter() - start, losses


def steady_steps(steppers, steps):
    """Median step time of each configuration, taking turns step by step, so that a change in
    the machine's load during the run falls on all of them alike."""
    times = {name: [] for name in steppers}
    for _ in range(steps):
        for name, (step, losses) in steppers.items():
            t = time.perf_counter()
            losses.append(step())
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(t) for name, t in times.items()}


CONFIGS = ["cpu eager", "cpu inductor", "tpu strict", "tpu fused", "tpu compiled", "tpu compiled+fused", "jax",
           "pytorch/xla"]
PTXLA_PYTHON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".venv-ptxla", "bin", "python")


def ptxla_row(size, steps):
    """PyTorch/XLA 2.9 on the same compiler, in its own environment and process (training only)."""
    if not os.path.exists(PTXLA_PYTHON):
        raise RuntimeError("not set up: run bench/setup_ptxla.sh")
    peer = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ptxla_peer.py")
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}  # torchtpu's entry point is not for torch 2.9
    done = subprocess.run([PTXLA_PYTHON, peer, "--size", size, "--steps", str(steps)],
                          capture_output=True, text=True, check=True, env=env)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"  pytorch/xla compiled {result['compiles']} XLA graphs", file=sys.stderr)
    return result["cold"], result["step"], result["losses"]


PEAKS = {}  # configuration -> peak device memory of its (single-program) training step, bytes


def run(size, train, steps, configs):
    model = make_model(size)
    batch = make_batch(model.config.vocab_size)
    rows, steppers, colds = {}, {}, {}
    for name in configs:
        if name == "pytorch/xla":
            continue
        try:
            if name == "jax":
                step = jax_runner(model, batch, train)
            else:
                device, mode = name.split()
                step = torch_runner(model, "tpu" if device == "tpu" else "cpu", mode, batch, train)
            colds[name], losses = cold_start(step)
            steppers[name] = (step, losses)
        except Exception as error:  # noqa: BLE001  (a configuration that fails is reported, not fatal)
            rows[name] = error
            print(f"  {name:18s} {_describe(error)}", file=sys.stderr, flush=True)
    for name, median in steady_steps(steppers, steps).items():
        step, losses = steppers[name]
        rows[name] = (colds[name], median, losses)
        print(f"  {name:18s} {_describe(rows[name])}", file=sys.stderr, flush=True)
        if train and hasattr(step, "memory_analysis"):
            m = step.memory_analysis()
            PEAKS[name] = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
    if train and "pytorch/xla" in configs:  # its own environment and process: timed on its own
        try:
            rows["pytorch/xla"] = ptxla_row(size, steps)
        except Exception as error:  # noqa: BLE001
            rows["pytorch/xla"] = error
        print(f"  {'pytorch/xla':18s} {_describe(rows['pytorch/xla'])}", file=sys.stderr, flush=True)
    return {name: rows[name] for name in configs if name in rows}


def _describe(row):
    if isinstance(row, Exception):
        return f"failed: {type(row).__name__}: {str(row).splitlines()[0][:120]}"
    cold, step, losses = row
    return f"cold {cold:7.2f} s  step {step * 1e3:9.1f} ms  loss {losses[0]:.4f} -> {losses[-1]:.4f}"


def table(rows, title):
    jax_step = rows.get("jax")
    jax_step = None if jax_step is None or isinstance(jax_step, Exception) else jax_step[1]
    lines = [f"### {title}", "", "| configuration | cold (to end of step 2) s | step ms | step / jax | first loss |",
             "|---|---|---|---|---|"]
    for name, row in rows.items():
        if isinstance(row, Exception):
            lines.append(f"| {name} | failed: {type(row).__name__}: {str(row).splitlines()[0][:80]} | | | |")
            continue
        cold, step, losses = row
        ratio = f"{step / jax_step:.2f}" if jax_step else "n/a"
        lines.append(f"| {name} | {cold:.2f} | {step * 1e3:.1f} | {ratio} | {losses[0]:.4f} |")
    return "\n".join(lines)


GOALS = [  # (what, numerator row, denominator row, column: 0 cold / 1 step, goal)
    ("compiled step / jax step", "tpu compiled", "jax", 1, "≤ 1.15"),
    ("compiled+fused step / jax step", "tpu compiled+fused", "jax", 1, "≤ 1.15"),
    ("strict step / fused step (fused speed-up)", "tpu strict", "tpu fused", 1, "≥ 1.5"),
    ("compiled cold / pytorch/xla cold", "tpu compiled", "pytorch/xla", 0, "≤ 0.5"),
    ("compiled cold / inductor cold", "tpu compiled", "cpu inductor", 0, "≤ 0.1"),
    ("compiled+fused cold / pytorch/xla cold", "tpu compiled+fused", "pytorch/xla", 0, "≤ 0.5"),
    ("compiled step / pytorch/xla step", "tpu compiled", "pytorch/xla", 1, "≤ 1.0"),
    ("compiled+fused step / pytorch/xla step", "tpu compiled+fused", "pytorch/xla", 1, "≤ 1.0"),
]


def goals(rows, colds):
    """The training-step ratios the fast-paths issue sets goals for, from this run
    (cold starts from new processes where measured)."""
    lines = ["### Goals (training step, this run)", "", "| ratio | goal | measured |", "|---|---|---|"]
    rows = {name: (colds.get(name, row[0]), *row[1:]) if isinstance(row, tuple) else row for name, row in rows.items()}
    for what, top, bottom, column, goal in GOALS:
        a, b = rows.get(top), rows.get(bottom)
        if isinstance(a, tuple) and isinstance(b, tuple):
            lines.append(f"| {what} | {goal} | {a[column] / b[column]:.2f} |")
    return "\n".join(lines)


def _fresh_process(size, steps, config, env=None, inductor_cache=None):
    """One configuration's training row, measured in a new process (with an empty inductor cache
    unless ``inductor_cache`` is given: torch's disk caches, on by default, would otherwise skip
    AOTAutograd and inductor's compile)."""
    with tempfile.TemporaryDirectory() as empty:
        env = {**(env or os.environ), "TORCHINDUCTOR_CACHE_DIR": inductor_cache or empty}
        done = subprocess.run([sys.executable, __file__, "--size", size, "--steps", str(steps), "--configs", config,
                               "--train-only", "--json"], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])[config]


def peak_memory():
    """Peak device memory of one training step, for the configurations that run it as one
    program: XLA's buffer assignment for that program (arguments + outputs - outputs
    aliased to donated arguments + temporaries).  On XLA's CPU backend there are no
    device memory statistics to read instead."""
    lines = ["### Peak device memory of the training step (configurations that run it as one program)", "",
             "| configuration | peak MB (arguments + outputs - aliased + temporaries) | / jax |", "|---|---|---|"]
    for name, peak in PEAKS.items():
        ratio = f"{peak / PEAKS['jax']:.2f}" if "jax" in PEAKS else "n/a"
        lines.append(f"| {name} | {peak / 2**20:.1f} | {ratio} |")
    return "\n".join(lines)


FRESH_CONFIGS = ["cpu inductor", "tpu strict", "tpu fused", "tpu compiled", "tpu compiled+fused", "jax"]


def fresh_colds(size, configs):
    """Cold start of each configuration in a new process: in one process, a configuration
    that runs after another finds some of its tracing and compiling already done."""
    return {config: _fresh_process(size, 1, config)["cold"] for config in FRESH_CONFIGS if config in configs}


def cold_table(colds, ptxla_row):
    lines = ["### Cold start in a new process (training step: to the end of step 2, compiles included)", "",
             "| configuration | cold s |", "|---|---|"]
    lines += [f"| {name} | {cold:.2f} |" for name, cold in colds.items()]
    if isinstance(ptxla_row, tuple):
        lines.append(f"| pytorch/xla (its own process, above) | {ptxla_row[0]:.2f} |")
    return "\n".join(lines)


def warm_start(size, steps):
    """Time to the end of step 2 of the compiled training step, in a fresh process with empty
    disk caches and then in a second one that finds them full: XLA's programs (TORCHTPU_CACHE_DIR)
    and AOTAutograd's graphs (in TORCHINDUCTOR_CACHE_DIR)."""
    colds = []
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as inductor_cache:
        env = {**os.environ, "TORCHTPU_CACHE_DIR": cache}
        for _ in range(2):
            colds.append(_fresh_process(size, steps, "tpu compiled", env, inductor_cache)["cold"])
    return "\n".join([
        "### Warm start from the disk cache (compiled training step, a new process each)", "",
        "| process | cold (to end of step 2) s |", "|---|---|",
        f"| first, empty cache | {colds[0]:.2f} |", f"| second, cache filled by the first | {colds[1]:.2f} |",
        f"| ratio | {colds[1] / colds[0]:.2f} |"])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="10m")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="3 steps, write nothing")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--train-only", action="store_true", help="skip the forward-only table")
    parser.add_argument("--json", action="store_true", help="print the training rows as JSON and write nothing")
    parser.add_argument("--no-warm-start", action="store_true", help="skip the two-process disk-cache measurement")
    args = parser.parse_args()
    steps = 3 if args.quick else args.steps
    configs = args.configs.split(",")
    # Cold starts are cold for inductor too: not served by an earlier run's inductor caches.
    inductor_cache = tempfile.TemporaryDirectory()  # noqa: SIM115  (removed when main returns)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", inductor_cache.name)
    params = sum(p.numel() for p in make_model(args.size).parameters())
    started = time.time()
    load_at_start = os.getloadavg()
    sections = []
    for train in (True,) if args.train_only else (False, True):
        title = f"Llama {args.size} ({params / 1e6:.1f}M parameters), batch 4 x 128 tokens: " + (
            "training step (forward, backward, AdamW)" if train else "forward")
        print(title, file=sys.stderr)
        rows = run(args.size, train, steps, configs)
        sections.append(table(rows, title))
    if args.json:
        print(json.dumps({name: {"cold": row[0], "step": row[1]}
                          for name, row in rows.items() if not isinstance(row, Exception)}))
        return
    if not (args.quick or args.no_warm_start):
        sections.append(warm_start(args.size, steps))
    colds = {} if args.quick else fresh_colds(args.size, configs)
    if colds:
        sections.append(cold_table(colds, rows.get("pytorch/xla")))
    if PEAKS:
        sections.append(peak_memory())
    sections.append(goals(rows, colds))
    report = "\n\n".join(sections)
    print(report)
    if args.quick:
        return
    versions = (f"torch {torch.__version__}, jax {jax.__version__}, "
                f"transformers {__import__('transformers').__version__}, torchtpu {torchtpu.__version__}")
    load = "load average at the start (1, 5, 15 min): " + ", ".join(f"{x:.1f}" for x in load_at_start)
    intro = __doc__.split(chr(10) + chr(10), 1)[1].split("    .venv")[0]
    write_section(f"llama_step.py --size {args.size}",
                  f"## Llama {args.size}: forward and training step\n\n{intro}{report}\n\n"
                  + how_measured(f"python bench/llama_step.py --size {args.size} --steps {steps}", started,
                                 torch.tpu.get_device_name(), versions, [load]))


if __name__ == "__main__":
    main()
