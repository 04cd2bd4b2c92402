"""The three eager modes: debug, strict (the default) and fused, against each other and CPU.

Fused mode must compute exactly what strict mode computes (both run the same
per-op programs; fused only composes them), so results are compared for
equality, and against CPU PyTorch with the usual tolerance.
"""

from __future__ import annotations

import os
import weakref
import subprocess
import sys

import pytest
import torch

import torchtpu  # noqa: F401
from torchtpu.eager import fused, modes

EagerMode = torch.tpu.EagerMode
STRICT, DEBUG, FUSED = EagerMode.DEFER_NEVER, EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING, EagerMode.DEFER_AND_FUSE


@pytest.fixture(autouse=True)
def strict_afterwards():
    """Every test starts and ends in strict mode with the default graph size limit."""
    assert torch.tpu.get_eager_mode() is STRICT
    yield
    torch.tpu.set_eager_mode(STRICT)
    torch.tpu.set_max_fused_ops(torchtpu.config.Config().max_fused_ops)


def run_in(mode, program):
    """Run ``program()`` (which returns tpu tensors) in ``mode``; its results copied to CPU."""
    with torch.tpu.eager_mode(mode):
        result = program()
        return [t.cpu() for t in result]


def assert_same_as_strict(actual, strict, mode):
    """Equal, except that XLA may round a float op fused with its neighbours differently (1 ulp)."""
    if actual.is_floating_point():
        torch.testing.assert_close(actual, strict, rtol=3e-7, atol=1e-7, msg=lambda m: f"{mode.name}: {m}")
    else:
        assert torch.equal(actual, strict), f"{mode.name} differs from strict:\n{actual}\n{strict}"


def assert_modes_agree(program, cpu_program, atol=1e-5, rtol=1e-5):
    strict = run_in(STRICT, program)
    for a, b in zip(run_in(DEBUG, program), strict):
        assert torch.equal(a, b), f"debug mode differs from strict:\n{a}\n{b}"
    for a, b in zip(run_in(FUSED, program), strict):
        assert_same_as_strict(a, b, FUSED)
    for a, c in zip(strict, cpu_program()):
        torch.testing.assert_close(a, c, atol=atol, rtol=rtol)


# ---- the mode switch --------------------------------------------------------------


def test_strict_is_the_default_and_modes_switch():
    assert torch.tpu.get_eager_mode() is STRICT
    torch.tpu.set_eager_mode(FUSED)
    assert torch.tpu.get_eager_mode() is FUSED
    torch.tpu.set_eager_mode("DEFER_NEVER_AND_LAUNCH_BLOCKING")
    assert torch.tpu.get_eager_mode() is DEBUG
    with pytest.raises(ValueError, match="unknown eager mode"):
        torch.tpu.set_eager_mode("FAST")
    assert torch.tpu.get_eager_mode() is DEBUG


def test_context_manager_restores_the_previous_mode_even_on_error():
    torch.tpu.set_eager_mode(DEBUG)
    with pytest.raises(KeyError):
        with torch.tpu.eager_mode(FUSED):
            assert torch.tpu.get_eager_mode() is FUSED
            raise KeyError("boom")
    assert torch.tpu.get_eager_mode() is DEBUG
    with torch.tpu.eager_mode(FUSED):
        with torch.tpu.eager_mode(STRICT):
            assert torch.tpu.get_eager_mode() is STRICT
        assert torch.tpu.get_eager_mode() is FUSED
    assert torch.tpu.get_eager_mode() is DEBUG


def test_leaving_fused_mode_runs_the_pending_graph():
    x = torch.ones(3, device="tpu")
    with torch.tpu.eager_mode(FUSED):
        y = x * 3
        assert fused.pending_ops() == 1
    assert fused.pending_ops() == 0
    assert torch.tpu.graph_break_stats().get("mode change", 0) >= 1
    assert y.cpu().tolist() == [3.0, 3.0, 3.0]


@pytest.mark.parametrize("env,expected", [
    ({}, "DEFER_NEVER"),
    ({"TPU_LAUNCH_BLOCKING": "1"}, "DEFER_NEVER_AND_LAUNCH_BLOCKING"),
    ({"TPU_DEFER_AND_FUSE": "1"}, "DEFER_AND_FUSE"),
    ({"TPU_DEFER_AND_FUSE": "1", "TPU_LAUNCH_BLOCKING": "1"}, "DEFER_NEVER_AND_LAUNCH_BLOCKING"),
    ({"TPU_DEFER_AND_FUSE": "0"}, "DEFER_NEVER"),
])
def test_env_vars_choose_the_mode(monkeypatch, env, expected):
    for name in ("TPU_LAUNCH_BLOCKING", "TPU_DEFER_AND_FUSE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert modes.mode_from_config(torchtpu.config.from_environ()).name == expected


def test_env_vars_are_read_at_import():
    code = ("import torch, torchtpu; x = torch.ones(2, device='tpu') + 1; "
            "print(torch.tpu.get_eager_mode().name, torchtpu.eager.fused.pending_ops(), "
            "torch.tpu.get_max_fused_ops())")
    env = dict(os.environ, TPU_DEFER_AND_FUSE="1", TPU_MAX_FUSED_OPS="7")
    env.pop("TPU_LAUNCH_BLOCKING", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    mode, pending, limit = out.stdout.split()
    assert (mode, limit) == ("DEFER_AND_FUSE", "7") and int(pending) >= 1  # ones and add, not yet run


# ---- the same results in every mode -------------------------------------------------


def test_pointwise_chain_matches_strict_and_cpu():
    x_cpu = torch.linspace(-2, 2, 24).reshape(4, 6)

    def program(device):
        x = x_cpu.to(device)
        y = torch.tanh(x * 1.5 + 0.25).exp() - x.sigmoid()
        return [y, y.sum(dim=0), (y > 0.5).to(torch.int64) * 3]

    assert_modes_agree(lambda: program("tpu"), lambda: program("cpu"))


def test_inplace_ops_on_views_match_strict_and_cpu():
    def program(device):
        base = torch.arange(24.0, device=device).reshape(4, 6)
        other = base.clone()
        row = base[1]
        row.mul_(2)
        base[:, ::2].add_(1.5)
        column = base.t()[3]
        column.neg_()
        flat = base.view(-1)
        flat[5:9].copy_(other[0, :4])
        other.transpose(0, 1)[::2].sub_(base.transpose(0, 1)[::2])
        return [base, other, row, column]

    assert_modes_agree(lambda: program("tpu"), lambda: program("cpu"))


def test_dropout_under_a_seed_matches_strict():
    def program():
        torch.manual_seed(0)
        torch.tpu.manual_seed(5)
        x = torch.ones(64, 32, device="tpu")
        a = torch.nn.functional.dropout(x, 0.5)
        b = torch.nn.functional.dropout(x * 2, 0.25)
        return [a, b, torch.rand(8, device="tpu"), torch.randn(3, 3, device="tpu")]

    strict = run_in(STRICT, program)
    fused_results = run_in(FUSED, program)
    for a, b in zip(fused_results, strict):
        assert torch.equal(a, b)
    assert 0.3 < (strict[0] == 0).float().mean() < 0.7  # it is dropout, not identity


def _mlp_training(device, steps, losses_out=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(5, 8, generator=gen), torch.randint(0, 3, (5,), generator=gen)) for _ in range(steps)]
    losses = []
    for step, (x, y) in enumerate(data):
        loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
        if losses_out is not None:
            losses_out(step)
    return [*model.parameters(), torch.stack(losses)]


def test_mlp_training_with_adamw_matches_strict_and_cpu():
    assert_modes_agree(lambda: _mlp_training("tpu", 4), lambda: _mlp_training("cpu", 4), atol=1e-4, rtol=1e-4)


def test_fused_training_step_compiles_once():
    """Each optimizer step ends a graph, which runs at the next op.  Step 1 creates AdamW's
    state, so its graph differs; from step 2 on every step reuses one compiled program
    (compiled, at the earliest, when step 3 begins)."""
    compiles_after_step = []
    breaks_before = torch.tpu.graph_break_stats().get("optimizer step", 0)

    def on_step(step):  # no host sync in the loop: the optimizer step alone cuts the graph
        compiles_after_step.append(sum(torch.tpu.compile_stats().values()))

    with torch.tpu.eager_mode(FUSED):
        _mlp_training("tpu", 6, on_step)
    steady = compiles_after_step[2:]
    assert steady == [steady[0]] * len(steady), f"compiles after each step: {compiles_after_step}"
    assert torch.tpu.graph_break_stats()["optimizer step"] - breaks_before == 6
    assert torch.tpu.fused_stats()["graph cache hits"] >= 4


def test_fused_step_donates_the_buffers_it_replaces():
    before = torch.tpu.fused_stats().get("buffers donated", 0)
    with torch.tpu.eager_mode(FUSED):
        params = _mlp_training("tpu", 3, lambda step: torch.tpu.synchronize())
    assert torch.tpu.fused_stats()["buffers donated"] > before
    assert all(torch.isfinite(p.cpu()).all() for p in params)  # donated inputs were not read again


# ---- graph breaks ---------------------------------------------------------------------


def _breaks_from(action):
    x = torch.arange(4.0, device="tpu")
    with torch.tpu.eager_mode(FUSED):
        y = x * 2 + 1
        before = torch.tpu.graph_break_stats()
        action(y)
        after = torch.tpu.graph_break_stats()
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


@pytest.mark.parametrize("action,cause", [
    (lambda y: y[1].item(), "item"),
    (lambda y: bool(y[0] > 0), "item"),
    (lambda y: y.cpu(), "cpu"),
    (lambda y: y.tolist(), "cpu"),
    (lambda y: print(y), "print"),
    (lambda y: torch.tpu.synchronize(), "synchronize"),
    (lambda y: torch.nonzero(y), "data-dependent op aten::nonzero"),
])
def test_host_syncs_are_graph_breaks_with_their_cause(action, cause, capsys):
    breaks = _breaks_from(action)
    assert set(breaks) == {cause}, breaks


def test_size_limit_breaks_the_graph():
    torch.tpu.set_max_fused_ops(4)
    x = torch.ones(3, device="tpu")
    with torch.tpu.eager_mode(FUSED):
        before = torch.tpu.graph_break_stats().get("size limit", 0)
        for _ in range(10):
            x = x + 1
        assert fused.pending_ops() <= 4
        assert torch.tpu.graph_break_stats()["size limit"] - before == 2
        assert x.cpu().tolist() == [11.0] * 3


def test_no_graph_break_without_pending_ops():
    x = torch.ones(3, device="tpu") * 2
    with torch.tpu.eager_mode(FUSED):
        before = sum(torch.tpu.graph_break_stats().values())
        x.cpu()
        torch.tpu.synchronize()
        assert sum(torch.tpu.graph_break_stats().values()) == before


def test_fused_graph_keeps_only_live_values_and_reuses_the_cache():
    x = torch.arange(6.0, device="tpu")
    results = []
    with torch.tpu.eager_mode(FUSED):
        for k in range(3):
            temp = x * (k + 1.0)  # a Python float: a runtime value, not part of the graph key
            results.append((temp.exp() - 1).sum().item())
    expected = [(torch.arange(6.0) * (k + 1.0)).exp().sub(1).sum().item() for k in range(3)]
    assert results == pytest.approx(expected, rel=1e-5)
    stats = torch.tpu.fused_stats()
    assert stats["graph cache hits"] >= 2


def test_cpu_upload_into_a_pending_tensor_in_fused_mode():
    with torch.tpu.eager_mode(FUSED):
        x = torch.ones(2, 3, device="tpu") * 5
        x.copy_(torch.full((2, 3), 7.0))  # overwrites the pending value entirely
        y = torch.zeros(2, 3, device="tpu") + 1
        y[0].copy_(torch.tensor([1.0, 2.0, 3.0]))  # a partial write into a pending buffer
        assert x.cpu().tolist() == [[7.0] * 3] * 2
        assert y.cpu().tolist() == [[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]]


# ---- debug mode -------------------------------------------------------------------


def test_debug_mode_blocks_on_every_op():
    from torchtpu.core import tensor

    with torch.tpu.eager_mode(DEBUG):
        y = torch.ones(128, 128, device="tpu") @ torch.ones(128, 128, device="tpu")
        assert tensor.buffer_of(y).value.is_ready()


def test_debug_checks_name_the_op_and_the_users_line():
    x = torch.tensor([1.0, 0.0], device="tpu")
    with torch.tpu.eager_mode(DEBUG), torch.tpu.debug_checks(True):
        ok = x + 1  # finite: no error
        with pytest.raises(torch.tpu.NonFiniteError) as error:
            y = x / 0.0  # noqa: F841  (this line must appear in the error)
    message = str(error.value)
    assert "aten::div" in message and "NaN" in message
    assert f"{__file__}:" in message and "y = x / 0.0" in message
    assert ok.cpu().tolist() == [2.0, 1.0]


def test_debug_checks_are_off_by_default_and_restored():
    x = torch.tensor([0.0], device="tpu")
    with torch.tpu.eager_mode(DEBUG):
        assert torch.isnan((x / x).cpu()).all()  # checks off: NaN is a value like any other
        with torch.tpu.debug_checks(True):
            with pytest.raises(torch.tpu.NonFiniteError, match="NaN"):
                x / x
        assert torch.isnan((x / x).cpu()).all()


def test_debug_checks_see_nan_from_autograd_in_the_users_backward_line():
    w = torch.tensor([0.0], device="tpu", requires_grad=True)
    with torch.tpu.eager_mode(DEBUG), torch.tpu.debug_checks(True):
        loss = w.sqrt().sum()
        with pytest.raises(torch.tpu.NonFiniteError) as error:
            loss.backward()
    assert "loss.backward()" in str(error.value)


def test_fused_errors_raise_at_the_op_and_keep_the_pending_graph():
    x = torch.arange(4.0, device="tpu")
    with torch.tpu.eager_mode(FUSED):
        y = x * 2
        with pytest.raises(RuntimeError):  # the meta kernel's shape check, as in strict mode
            x + torch.ones(3, device="tpu")
        with pytest.raises(IndexError, match="non-zero size"):  # a check inside the lowering
            torch.empty(0, 3, device="tpu").max(dim=0)
        assert y.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]


def test_synchronize_skips_arrays_a_program_donated():
    """A donated array may still be alive (a caller's frame holds it) but is deleted: waiting skips it."""
    import jax
    import jax.numpy as jnp

    from torchtpu.core import tensor

    donated = jnp.ones(4)
    jax.jit(lambda a: a + 1, donate_argnums=0)(donated)
    assert donated.is_deleted()
    tensor._note_dispatched(donated)
    tensor._prune_dispatched()
    tensor._note_dispatched(donated)
    event = torch.tpu.Event()
    event.record()
    assert event.query()
    event.synchronize()
    torch.tpu.synchronize()
