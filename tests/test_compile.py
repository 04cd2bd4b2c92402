"""torch.compile(backend="tpu"): compiled programs match CPU eager, and compiles are counted.

Each model from test_models.py trains for a few steps with the whole step
(forward, loss, backward, optimizer.step) under torch.compile on tpu, and
its losses and parameters must match the same steps run eagerly on CPU.
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch._dynamo.testing
import torch.nn as nn
import torch.nn.functional as F
from oracle import assert_same
from test_models import CNN, GPT, OPTIMIZERS, Recurrent, classification_loss, lm_batches, lm_loss, random_batches

import torchtpu
from torchtpu.runtime import metrics

STEPS = 4


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def make_step(model, optimizer, loss_fn):
    """One training step: forward, loss, backward, optimizer step."""

    def step(*batch):
        loss = loss_fn(model, *batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.detach()

    return step


def train_steps(model, optimizer_name, batches, loss_fn, compiled):
    step = make_step(model, OPTIMIZERS[optimizer_name](model.parameters()), loss_fn)
    if compiled:
        step = torch.compile(step, backend="tpu")
    return torch.stack([step(*b) for b in batches])


def compare_compiled_training(make_model, optimizer_name, batches, loss_fn):
    torch.manual_seed(0)
    model = make_model()
    device_model = copy.deepcopy(model).to("tpu")
    expected = train_steps(model, optimizer_name, batches, loss_fn, compiled=False)
    before = torch.tpu.compile_cache_stats()
    actual = train_steps(device_model, optimizer_name, [tuple(t.to("tpu") for t in b) for b in batches],
                         loss_fn, compiled=True)
    torch.testing.assert_close(actual.cpu(), expected, rtol=1e-4, atol=1e-6)
    for (name, p_cpu), p_tpu in zip(model.named_parameters(), device_model.parameters()):
        torch.testing.assert_close(p_tpu.detach().cpu(), p_cpu.detach(), rtol=1e-3, atol=1e-4, msg=name)
    after = torch.tpu.compile_cache_stats()
    return after["misses"] - before["misses"], after["hits"] - before["hits"]


@pytest.mark.parametrize("make_model,optimizer_name,batches,loss_fn", [
    pytest.param(lambda: GPT(), "adamw", lm_batches(steps=STEPS), lm_loss, id="gpt-adamw"),
    pytest.param(lambda: GPT(norm=nn.RMSNorm, kv_heads=2), "sgd_nesterov", lm_batches(steps=STEPS), lm_loss,
                 id="gpt-gqa-rmsnorm-sgd"),
    pytest.param(CNN, "adam", random_batches(lambda g: torch.randn(8, 3, 8, 8, generator=g), 4, steps=STEPS),
                 classification_loss, id="cnn-adam"),
    pytest.param(lambda: Recurrent(nn.LSTM), "rmsprop",
                 random_batches(lambda g: torch.randn(8, 5, 6, generator=g), 3, steps=STEPS),
                 classification_loss, id="lstm-rmsprop"),
])
def test_compiled_training_step_matches_cpu(make_model, optimizer_name, batches, loss_fn):
    fallbacks = sum(metrics.graph_fallbacks.values())
    misses, hits = compare_compiled_training(make_model, optimizer_name, batches, loss_fn)
    assert sum(metrics.graph_fallbacks.values()) == fallbacks, "a graph ran op by op instead of compiled"
    # Each graph (forward, backward, optimizer) compiles once; later steps hit the cache.
    assert misses > 0 and hits >= misses


def test_later_steps_do_not_recompile():
    torch.manual_seed(0)
    model = GPT().to("tpu")
    step = torch.compile(make_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3), lm_loss), backend="tpu")
    batches = [tuple(t.to("tpu") for t in b) for b in lm_batches(steps=5)]
    for b in batches[:2]:
        step(*b)
    before = torch.tpu.compile_cache_stats()
    for b in batches[2:]:
        step(*b)
    after = torch.tpu.compile_cache_stats()
    assert after["misses"] == before["misses"], "steps 3-5 recompiled"
    assert after["hits"] > before["hits"]


@pytest.mark.parametrize("capturable", [False, True])
def test_compiled_optimizer_updates_parameters_in_place(capturable):
    torch.manual_seed(0)
    params = [torch.randn(4, 3, requires_grad=True), torch.randn(3, requires_grad=True)]
    device_params = [p.detach().to("tpu").requires_grad_() for p in params]
    optimizers = [torch.optim.Adam(ps, lr=0.1, capturable=capturable and ps is device_params)
                  for ps in (params, device_params)]
    ptrs = [p.data_ptr() for p in device_params]
    versions = [p._version for p in device_params]
    before = torch.tpu.compile_cache_stats()
    step = torch.compile(optimizers[1].step, backend="tpu")
    for k in range(3):
        for p, q in zip(params, device_params):
            p.grad = torch.full_like(p, k + 1.0)
            q.grad = p.grad.to("tpu")
        optimizers[0].step()
        step()
    for p, q, ptr, version in zip(params, device_params, ptrs, versions):
        assert_same(q.detach(), p.detach(), rtol=1e-5, atol=1e-6)
        assert q.data_ptr() == ptr, "the parameter keeps its storage"
        assert q._version > version, "autograd sees the in-place update"
    for p, q in zip(params, device_params):
        assert float(optimizers[1].state[q]["step"]) == float(optimizers[0].state[p]["step"]) == 3.0
    if capturable:  # parameters and state live on the device: their old arrays are donated
        assert torch.tpu.compile_cache_stats()["donated_inputs"] > before["donated_inputs"]


def test_inference_and_graph_break_match_cpu():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).eval()
    device_model = copy.deepcopy(model).to("tpu")
    x = torch.randn(5, 8)

    def program(m, x):
        h = m[0](x)
        if h.sum() > 0:  # data-dependent control flow: a graph break, the rest runs in two graphs
            h = h * 2
        print("graph break", end="")  # a print is a graph break as well
        return m[2](m[1](h)).softmax(-1)

    with torch.no_grad():
        expected = program(model, x)
        actual = torch.compile(program, backend="tpu")(device_model, x.to("tpu"))
    assert_same(actual, expected, rtol=1e-5, atol=1e-6)


def test_dynamic_false_compiles_once_per_shape():
    def f(x, w):
        return torch.tanh(x @ w).sum(0)

    compiled = torch.compile(f, backend="tpu", dynamic=False)
    w = torch.randn(4, 3)
    counts = []
    for rows in (2, 5, 2, 5, 7):
        before = torch.tpu.compile_cache_stats()["misses"]
        x = torch.randn(rows, 4)
        assert_same(compiled(x.to("tpu"), w.to("tpu")), f(x, w), rtol=1e-5, atol=1e-6)
        counts.append(torch.tpu.compile_cache_stats()["misses"] - before)
    assert counts == [1, 1, 0, 0, 1]


def test_recompiles_are_logged_with_the_reason(monkeypatch, caplog):
    monkeypatch.setattr(torchtpu.config.current, "log_recompiles", True)
    torch.tpu.precision("highest")

    @torch.compile(backend="tpu", dynamic=False)
    def f(x):
        return x.exp() + 1

    x = torch.randn(3, 4, device="tpu")
    f(x)
    with caplog.at_level(logging.WARNING, logger="torchtpu.recompiles"):
        with torch.tpu.precision("default"):
            f(x)  # same graph, another precision: the program is rebuilt
    assert any("precision=highest -> precision=default" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="torchtpu.recompiles"):
        f(torch.randn(5, 4, device="tpu"))
    assert any("input 0: ((3, 4), torch.float32) -> ((5, 4), torch.float32)" in r.getMessage()
               for r in caplog.records)


def test_dropout_in_compiled_graph_is_reproducible_under_seed():
    @torch.compile(backend="tpu")
    def f(x):
        return F.dropout(x, 0.5, training=True) + F.dropout(x, 0.5, training=True)

    x = torch.ones(32, 32, device="tpu")
    torch.manual_seed(7)
    a = f(x).cpu()
    b = f(x).cpu()
    torch.manual_seed(7)
    c = f(x).cpu()
    assert torch.equal(a, c), "the same seed gives the same masks"
    assert not torch.equal(a, b), "the stream advances between calls"
    assert set(a.unique().tolist()) <= {0.0, 2.0, 4.0}
    assert 0.3 < (a == 2.0).float().mean().item() < 0.7, "two independent masks per call"


def test_op_without_lowering_falls_back_to_eager(monkeypatch):
    from torchtpu.ops.registry import LOWERINGS

    cos = torch.ops.aten.cos.default
    monkeypatch.delitem(LOWERINGS, cos)  # as if cos had no lowering: the graph cannot be compiled
    monkeypatch.setattr("torchtpu.ops.decompositions.for_graphs", lambda: {})

    def f(x):
        return torch.cos(x) * 2

    x = torch.randn(6)
    with pytest.warns(UserWarning, match="aten.cos.default"):
        actual = torch.compile(f, backend="tpu")(x.to("tpu"))
    assert_same(actual, f(x))
    assert any("aten.cos.default" in reason for reason in metrics.graph_fallbacks)


def test_compile_cache_stats_shape():
    stats = torch.tpu.compile_cache_stats()
    assert set(stats) >= {"requests", "hits", "misses", "compile_seconds", "donated_inputs"}
    assert stats["requests"] == stats["hits"] + stats["misses"]


_CACHED_PROGRAM = """
import torch, torchtpu
f = torch.compile(lambda x: (x.sin() * 2).sum(0), backend="tpu")
x = torch.randn(5, 3, device="tpu")
f(x).cpu()
print(torch.tpu.compile_cache_stats()["disk_hits"])
"""


def test_disk_cache_lets_a_new_process_skip_compiling(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "TORCHTPU_CACHE_DIR": str(tmp_path / "cache")}

    def disk_hits():
        done = subprocess.run([sys.executable, "-c", _CACHED_PROGRAM], env=env, capture_output=True, text=True,
                              timeout=300, check=True)
        return int(done.stdout.strip().splitlines()[-1])

    assert disk_hits() == 0, "the first process finds an empty cache"
    assert any((tmp_path / "cache").iterdir()), "and fills it"
    assert disk_hits() > 0, "a second process loads the programs instead of compiling them"


_TRAINING_PROGRAM = """
import json, torch, torchtpu
from torch._dynamo.utils import counters
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
x = torch.randn(5, 8)
on_tpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
on_tpu.load_state_dict(model.state_dict())
on_tpu = on_tpu.to("tpu")
out = torch.compile(on_tpu, backend="tpu", dynamic=DYNAMIC)(x.to("tpu"))
out.square().sum().backward()
expected = model(x)
expected.square().sum().backward()
error = max((out.cpu() - expected).abs().max().item(),
            *[(a.grad.cpu() - b.grad).abs().max().item() for a, b in zip(on_tpu.parameters(), model.parameters())])
print(json.dumps({"error": error, **counters["aot_autograd"]}))
"""


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_aot_autograd_cache_serves_a_new_process(tmp_path, dynamic):
    """With torchtpu's disk cache on, a second process finds the first one's AOTAutograd graphs in
    AOTAutograd's disk cache (forward and backward bundled) and computes the same values and
    gradients as CPU; with it off, AOTAutograd's cache is not used. Dynamic graphs (symbolic
    sizes) load too."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "torch")}
    env.pop("TORCHTPU_CACHE_DIR", None)

    def run(**settings):
        program = f"DYNAMIC = {dynamic}\n" + _TRAINING_PROGRAM
        done = subprocess.run([sys.executable, "-c", program], env={**env, **settings}, capture_output=True,
                              text=True, timeout=300, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])

    off = run()
    assert not {"autograd_cache_saved", "autograd_cache_hit", "autograd_cache_miss"} & set(off), off
    first, second = (run(TORCHTPU_CACHE_DIR=str(tmp_path / "torchtpu")) for _ in range(2))
    assert first.get("autograd_cache_saved") == 1 and "autograd_cache_hit" not in first, first
    assert second.get("autograd_cache_hit") == 1 and "autograd_cache_miss" not in second, second
    assert max(off["error"], first["error"], second["error"]) < 1e-5, (off, first, second)


def test_dump_dir_gets_the_stablehlo_of_each_graph(tmp_path, monkeypatch):
    monkeypatch.setattr(torchtpu.config.current, "dump_dir", str(tmp_path))
    torch.compile(lambda x: x.cos() + 1, backend="tpu")(torch.randn(4, device="tpu"))
    dumps = list(tmp_path.glob("*.stablehlo.mlir"))
    assert len(dumps) == 1
    text = dumps[0].read_text()
    assert "stablehlo.cosine" in text and "func.func public @main" in text


def test_bucketing_bounds_compiles_by_the_buckets_used():
    """50 steps of sequence lengths 3..16, right-padded to power-of-two buckets with ignored
    labels: a causal model's loss is unchanged, and each bucket compiles once."""
    torch.manual_seed(0)
    model = GPT()
    device_model = copy.deepcopy(model).to("tpu")

    def loss_and_grad(m, idx, targets):
        loss = lm_loss(m, idx, targets)
        loss.backward()
        return loss.detach()

    step = torch.compile(loss_and_grad, backend="tpu", dynamic=False)
    g = torch.Generator().manual_seed(2)
    lengths = torch.randint(3, 17, (50,), generator=g).tolist()
    compiled_at = []  # the bucket of each step that compiled anything
    for t in lengths:
        idx = torch.randint(0, 32, (2, t), generator=g)
        targets = torch.randint(0, 32, (2, t), generator=g)
        padded_idx, _ = torch.tpu.pad_to_bucket(idx, 1)
        padded_targets, length = torch.tpu.pad_to_bucket(targets, 1, value=-100)
        assert length == t
        before = torch.tpu.compile_cache_stats()["misses"]
        # The mean over real tokens only: ignore_index drops the padding.
        actual = step(device_model, padded_idx.to("tpu"), padded_targets.to("tpu"))
        expected = loss_and_grad(model, idx, targets)
        torch.testing.assert_close(actual.cpu(), expected, rtol=1e-4, atol=1e-6)
        if torch.tpu.compile_cache_stats()["misses"] > before:
            compiled_at.append(padded_idx.shape[1])
    # Steps compile only when they meet a bucket for the first time: one compiling step per bucket.
    assert sorted(compiled_at) == sorted({torch.tpu.bucket_size(t) for t in lengths})
    for p_cpu, p_tpu in zip(model.parameters(), device_model.parameters()):
        torch.testing.assert_close(p_tpu.grad.cpu(), p_cpu.grad, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("n,buckets,expected", [(0, None, 1), (1, None, 1), (5, None, 8), (8, None, 8),
                                                (9, [4, 12, 32], 12), (32, [4, 12, 32], 32)])
def test_bucket_size(n, buckets, expected):
    assert torch.tpu.bucket_size(n, buckets) == expected


def test_bucket_size_beyond_the_largest_bucket_raises():
    with pytest.raises(ValueError, match="larger than the largest bucket"):
        torch.tpu.bucket_size(33, [4, 12, 32])


def test_torchtpu_runtime_is_skipped_by_dynamo():
    """Dynamo must not trace our executors when eager ops run between graphs (a backward
    after a graph break): every runtime module, packages included, is on its skip list."""
    import importlib

    from torch._dynamo import trace_rules

    from torchtpu.compile import dynamo

    for name in dynamo.runtime_modules():
        module = importlib.import_module(name)
        assert trace_rules.check_file(module.__file__).skipped, name


def _fused_graphs_per_step(step, batches):

    losses, graphs = [], []
    with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        for b in batches:
            before = metrics.fused["graphs run"]
            losses.append(step(*b).item())
            graphs.append(metrics.fused["graphs run"] - before)
    return losses, graphs


def test_compiled_training_step_in_fused_mode_is_one_program():
    """In fused mode the forward, backward and optimizer graphs join one pending graph,
    so each training step runs as a single XLA program, compiled once."""
    from torchtpu.eager import fused

    torch.manual_seed(0)
    model = GPT()
    device_model = copy.deepcopy(model).to("tpu")
    batches = lm_batches(steps=4)

    cpu_step = make_step(model, torch.optim.AdamW(model.parameters(), lr=1e-2), lm_loss)
    expected = [cpu_step(*b).item() for b in batches]
    optimizer = torch.optim.AdamW(device_model.parameters(), lr=1e-2, capturable=True)
    step = torch.compile(make_step(device_model, optimizer, lm_loss), backend="tpu")
    compiled, donated = metrics.fused["graphs compiled"], metrics.fused["buffers donated"]
    losses, graphs = _fused_graphs_per_step(step, [tuple(t.to("tpu") for t in b) for b in batches])
    torch.testing.assert_close(losses, expected, rtol=1e-4, atol=1e-6)
    for p_cpu, p_tpu in zip(model.parameters(), device_model.parameters()):
        torch.testing.assert_close(p_tpu.detach().cpu(), p_cpu.detach(), rtol=1e-3, atol=1e-4)
    assert graphs == [1, 1, 1, 1], graphs
    # The optimizer state that Dynamo creates while tracing the first step runs at once,
    # outside the pending graph, so the first step is the same program as the others.
    assert metrics.fused["graphs compiled"] - compiled == 1, "the step compiles once, at the first step"
    assert metrics.fused["buffers donated"] > donated, "parameters and optimizer state are updated in place"
    # The program writes out the new parameters and optimizer state and the loss, not the
    # gradients: zero_grad() drops them before the graph runs.
    optimizer_state = [t for state in optimizer.state.values() for t in state.values()]
    param_bytes = sum(p.nbytes for p in device_model.parameters())
    state_bytes = param_bytes + sum(t.nbytes for t in optimizer_state)
    written = fused.memory_analysis().output_size_in_bytes
    assert state_bytes <= written < state_bytes + param_bytes // 2, "gradients are not written out"


def test_compiled_graph_in_fused_mode_reads_and_writes_through_views():
    def fn(x, y):
        x[1:].add_(y)  # an input written through a view
        return (x * 2).sum(0), y.t()

    torch.manual_seed(0)
    base, y = torch.randn(5, 3), torch.randn(4, 3)
    expected = fn(base.clone()[:, :], y)
    device_base = base.to("tpu")
    with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        view = device_base.t().t()  # a view of the whole storage
        actual = torch.compile(fn, backend="tpu")(view, y.to("tpu").t().contiguous().t())
    assert_same(actual[0], expected[0])
    assert_same(actual[1], expected[1])
    expected_base = base.clone()
    expected_base[1:] += y
    assert_same(device_base, expected_base)


def test_the_default_backend_compiles_tpu_graphs_with_the_tpu_backend():
    """``torch.compile(model)`` with no backend named (inductor) works on tpu as on CUDA: inductor
    has no tpu code generator, so the tpu backend compiles the graph; values and gradients equal CPU's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    on_tpu = copy.deepcopy(model).to("tpu")
    x = torch.randn(5, 8)
    before = metrics.compiles["compiled graph forward"]
    loss = torch.compile(on_tpu)(x.to("tpu")).square().sum()
    loss.backward()
    assert metrics.compiles["compiled graph forward"] == before + 1, "compiled by the tpu backend"
    expected = model(x).square().sum()
    expected.backward()
    assert_same(loss, expected)
    for p_tpu, p_cpu in zip(on_tpu.parameters(), model.parameters()):
        assert_same(p_tpu.grad, p_cpu.grad)


def test_a_dynamic_dimension_traces_once_and_compiles_a_program_per_size():
    """``mark_dynamic``: one Dynamo trace serves every size, its sizes are constants of one
    program per size, and views with no copying twin (``view(dtype)``) and uninitialized
    tensors take their sizes from the call's inputs."""

    def f(x):
        bits = x.view(torch.int16)  # read through its layout: no view_copy twin
        scratch = torch.empty_like(x)
        scratch.copy_(x * 2)
        return bits + 1, scratch, x[: x.shape[0] // 2].float().sum(0)

    counter = torch._dynamo.testing.CompileCounterWithBackend("tpu")
    compiled = torch.compile(f, backend=counter, fullgraph=True)
    before = torch.tpu.compile_cache_stats()["misses"]
    for n in (16, 32, 64, 32):
        x = torch.randn(n, 4).bfloat16()
        on_tpu = x.to("tpu")
        torch._dynamo.mark_dynamic(on_tpu, 0)
        for actual, expected in zip(compiled(on_tpu), f(x)):
            assert_same(actual, expected)
    assert counter.frame_count == 1, "one trace serves every size"
    assert torch.tpu.compile_cache_stats()["misses"] - before == 3, "a program per size, reused"


def test_integer_inputs_are_passed_at_run_time():
    """A size Dynamo makes symbolic (a cache position, say) is a program argument: a new
    value reuses the program; an integer that tracing needs as a shape becomes a constant."""

    def shift(x, n):
        return x + n, (x * n).sum()

    def reshape(x, n):
        return x.reshape(n, -1) * 2

    x = torch.arange(12.0)
    compiled_shift = torch.compile(shift, backend="tpu", dynamic=True)
    before = torch.tpu.compile_cache_stats()["misses"]
    for n in (3, 4, 5, 6):
        for actual, expected in zip(compiled_shift(x.to("tpu"), n), shift(x, n)):
            assert_same(actual, expected)
    assert torch.tpu.compile_cache_stats()["misses"] - before == 1, "one program serves every n"
    compiled_reshape = torch.compile(reshape, backend="tpu", dynamic=True)
    for n in (2, 3, 4):
        assert_same(compiled_reshape(x.to("tpu"), n), reshape(x, n))
