"""`torchtpu tune cost`: XLA's costs read right, the roofline's arithmetic, the capture of a step, the command."""

from __future__ import annotations

import contextlib
import io
import json
import math

import jax
import jax.numpy as jnp
import pytest
import torch

import torchtpu  # noqa: F401  registers the tpu device
from torchtpu.tools import cli
from torchtpu.tools.tune import chips, cost

# A calibration made up for the tests, so that none of them measures this (shared) machine.
FAKE_HOST = {"matmul": {"f32": [[2e6, 1e10], [2e9, 1e11]], "bf16": [[2e6, 5e9], [2e9, 5e10]]},
             "skinny_matmul": {"f32": [[10, 1e10], [300, 1e11]], "bf16": [[10, 5e9], [300, 5e10]]},
             "convolution": [[27, 1e10], [576, 1e11]], "bandwidth": [[1e5, 1e10], [1e8, 2e10]],
             "fresh_seconds_per_byte": 1e-9, "op_seconds": 1e-6, "program_seconds": 5e-6,
             "transcendentals_per_s": 1e9, "elementwise_per_s": 1e10, "gathered_per_s": 1e9,
             "reduce": [[4, 1e9], [2048, 1e10]], "transpose_bandwidth": [[1e5, 2e9], [1e8, 4e9]],
             "graph_seconds": 1e-4, "graph_array_seconds": 1e-5}


@pytest.fixture
def calibration(tmp_path):
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({cost._calibration_key(): FAKE_HOST}))
    return str(path)


def _compiled_matmul(m, n, k, dtype=jnp.float32):
    a, b = jnp.ones((m, k), dtype), jnp.ones((k, n), dtype)
    return jax.jit(lambda a, b: a @ b).lower(a, b).compile()


def test_a_matmul_costs_two_m_n_k_flops():
    m, n, k = 64, 48, 32
    program = cost.program_costs(_compiled_matmul(m, n, k))
    assert program.flops == 2 * m * n * k  # XLA's own count
    assert program.matmul_flops == 2 * m * n * k  # ours, from the optimized HLO
    assert program.bytes_accessed >= 4 * (m * k + k * n + m * n)
    assert program.memory["argument"] == 4 * (m * k + k * n)


def test_a_lowered_program_is_compiled_for_its_costs():
    lowered = jax.jit(lambda a: jnp.tanh(a) * 2).lower(jnp.ones((16, 16)))
    program = cost.program_costs(lowered, "tanh")
    assert program.name == "tanh" and program.transcendentals == 256
    assert sum(op.transcendentals for op in program.ops) == 256


def test_hlo_ops_read_dots_dtypes_and_precision():
    text = """HloModule m, entry_computation_layout={(bf16[8,4]{1,0}, bf16[4,2]{1,0})->f32[8,2]{1,0}}

ENTRY %main (a: bf16[8,4], b: bf16[4,2]) -> f32[8,2] {
  %a = bf16[8,4]{1,0} parameter(0)
  %b = bf16[4,2]{1,0} parameter(1)
  ROOT %d = f32[8,2]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, operand_precision={highest,highest}
}
"""
    (op,) = cost.hlo_ops(text)
    assert (op.opcode, op.matmul_flops, op.matmul_dtype, op.precision) == ("dot", 2 * 8 * 2 * 4, "bf16", "highest")
    assert op.bytes == 2 * (8 * 4 + 4 * 2) + 4 * 8 * 2
    assert cost.output_arrays(text) == [64]


def test_a_while_loop_repeats_its_body():
    def loop(x):
        return jax.lax.fori_loop(0, 7, lambda i, x: x @ x, x)

    program = cost.program_costs(jax.jit(loop).lower(jnp.ones((32, 32))))
    assert program.matmul_flops == 7 * 2 * 32**3


HAND_MADE = chips.Chip("hand", bf16_flops=100e12, int8_ops=200e12, fp8_flops=0.0, hbm_bytes=16e9,
                       hbm_bandwidth=1e12, ici_bandwidth=0.0, ici_topology="2d-torus", dcn_bandwidth=0.0,
                       max_slice_chips=1, mxu_tile=128, source="a test")


def test_roofline_on_a_hand_made_chip():
    machine = cost.chip_target(HAND_MADE)
    compute_bound = cost.Op("mm", "dot", matmul_flops=1e12, bytes=1e6, matmul_dtype="bf16")
    memory_bound = cost.Op("add", "fusion", elementwise=1e6, bytes=1e9)
    assert cost.op_seconds(compute_bound, machine) == pytest.approx(1e12 / 100e12)
    assert cost.op_seconds(memory_bound, machine) == pytest.approx(1e9 / 1e12)
    highest = cost.Op("mm32", "dot", matmul_flops=1e12, bytes=1e6, matmul_dtype="f32", precision="highest")
    assert cost.op_seconds(highest, machine) == pytest.approx(6 * 1e12 / 100e12)  # six bf16 passes
    looped = cost.Op("add", "fusion", bytes=1e9, repeats=3)
    assert cost.op_seconds(looped, machine) == pytest.approx(3e9 / 1e12)
    program = cost.Program("p", 1e12, 1e9, 0.0, {}, [compute_bound, memory_bound])
    assert cost.program_seconds(program, machine) == pytest.approx(0.01 + 0.001 + cost.TPU_PROGRAM_SECONDS)


def _product(flops, dtype="f32", intensity=1000.0, narrowness=0.0):
    return cost.Op("p", "fusion", matmul_flops=flops, matmul_elements=flops / intensity, matmul_dtype=dtype,
                   conv_narrowness=narrowness)


def test_the_host_curves_interpolate_in_log_size(calibration):
    host = cost.target("host", calibration)
    assert host.matmul_rate(_product(2e6)) == pytest.approx(1e10)
    assert host.matmul_rate(_product(2e12)) == pytest.approx(1e11)  # flat beyond the ends
    middle = math.sqrt(2e6 * 2e9)
    assert host.matmul_rate(_product(middle)) == pytest.approx(5.5e10)
    assert host.matmul_rate(_product(middle, "bf16")) == pytest.approx(2.75e10)  # its own, slower, curve
    assert host.matmul_rate(_product(middle, "f16")) == host.matmul_rate(_product(middle, "bf16"))
    assert host.peak_flops == 1e11


def test_thin_products_and_narrow_convolutions_run_slower(calibration):
    host = cost.target("host", calibration)
    assert host.matmul_rate(_product(2e9, intensity=10)) == pytest.approx(1e10)
    assert host.matmul_rate(_product(2e9, narrowness=27)) == pytest.approx(1e10)
    assert host.matmul_rate(_product(2e9, narrowness=576)) == pytest.approx(1e11)


def test_vector_work_gathers_and_reductions_add_up(calibration):
    host = cost.target("host", calibration)
    op = cost.Op("f", "fusion", elementwise=1e8, gathered=1e7, reductions=[(4e7, 4)])
    assert cost.op_seconds(op, host) == pytest.approx(1e8 / 1e10 + 1e7 / 1e9 + 4e7 / 1e9 + 1e-6)
    counted = cost.program_costs(jax.jit(lambda x, i: x[i].sum()).lower(jnp.ones(64), jnp.arange(8)))
    assert sum(op.gathered for op in counted.ops) == 8
    assert [length for op in counted.ops for _, length in op.reductions] == [8]


def test_the_host_pays_torchtpus_work_per_graph_and_per_array(calibration):
    host = cost.target("host", calibration)
    program = cost.Program("p", 0, 0, 0, {}, [], [8, 8], arguments=3)
    assert cost.program_seconds(program, host) == pytest.approx(5e-6 + 1e-4 + 5 * 1e-5)
    assert cost.program_seconds(program, cost.chip_target(HAND_MADE)) == cost.TPU_PROGRAM_SECONDS


def test_big_new_buffers_pay_for_their_pages():
    program = cost.Program("p", 0, 0, 0, {"temp": 64 << 20, "alias": 0}, [], [8 << 20, 40 << 20])
    assert program.fresh_bytes(32 << 20) == (64 << 20) + (40 << 20)  # the 8 MiB output is recycled
    assert program.fresh_bytes(1 << 40) == 0


def _tiny_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 32, device="tpu")

    @torch.compile(backend="tpu")
    def step(x):
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.detach()

    return step, x


def test_the_observer_captures_each_compiled_graph():
    torch._dynamo.reset()
    step, x = _tiny_step()
    with cost.Capture() as capture:
        for _ in range(3):
            step(x)
    names = [p.name for p in capture.programs]
    assert "forward" in names and "backward" in names
    assert len(names) == len(set(names))  # recompiles replace, they do not add a program per step
    assert all(p.flops > 0 and p.ops for p in capture.programs)
    step(x)  # after the capture closes, nothing is recorded
    assert [p.name for p in capture.programs] == names


def test_predict_gives_positive_consistent_figures(calibration):
    torch._dynamo.reset()
    step, x = _tiny_step()
    result = cost.predict(step, x, chip="v5e", steps=2, calibration=calibration)
    v5e = chips.chip("v5e")
    assert result.chip == "v5e" and result.flops > 2 * 16 * 32 * 64
    assert result.seconds == pytest.approx(sum(p.seconds for p in result.programs))
    assert result.mfu == pytest.approx(result.flops / (result.seconds * v5e.bf16_flops))
    assert 0 < result.mfu < 1 and result.peak_memory_bytes > 0
    host = cost.predict_programs([p for p in _programs_of(step, x)], "host", calibration)
    assert host.seconds > result.seconds  # the made-up host is far slower than a TPU
    assert "MFU" in result.summary()


def _programs_of(step, x):
    torch._dynamo.reset()
    with cost.Capture() as capture:
        step(x)
    return capture.programs


def test_predict_can_measure_the_step_too(calibration):
    torch._dynamo.reset()
    step, x = _tiny_step()
    result = cost.predict(step, x, chip="host", steps=2, measure=True, calibration=calibration)
    assert result.measured_seconds > 0 and "measured" in result.summary()


def test_predict_says_when_nothing_compiled():
    with pytest.raises(RuntimeError, match="no program was compiled"):
        cost.predict(lambda: torch.ones(2, device="tpu") + 1)


def test_a_bad_chip_name_is_a_clear_error(calibration):
    with pytest.raises(ValueError, match="unknown TPU generation 'v99'.*v5e"):
        cost.target("v99")
    with pytest.raises(ValueError, match="unknown TPU generation"):
        cost.predict_programs([], "tpu-v99", calibration)


SCRIPT = """
import torch, torchtpu
model = torch.nn.Linear(16, 16).to("tpu")
step = torch.compile(lambda x: model(x).relu().sum(), backend="tpu")
step(torch.ones(4, 16, device="tpu"))
"""


def test_the_command_prints_json(tmp_path, calibration):
    script = tmp_path / "step.py"
    script.write_text(SCRIPT)
    torch._dynamo.reset()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["tune", "cost", "--chip", "v6e", "--json", "--calibration", calibration, str(script)]) == 0
    results = json.loads(out.getvalue())
    assert set(results) == {"v6e", "host"}
    assert results["v6e"]["flops"] >= 2 * 4 * 16 * 16 and results["v6e"]["seconds"] > 0
    assert results["host"]["programs"][0]["name"] in ("forward", "inference")


def test_the_command_prints_the_calibration(calibration):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["tune", "cost", "--json", "--calibration", calibration]) == 0
    assert json.loads(out.getvalue()) == FAKE_HOST
    with pytest.raises(ValueError, match="unknown TPU generation"):
        cli.main(["tune", "cost", "--chip", "nope", "--calibration", calibration, "script.py"])


def test_a_transpose_moves_at_the_transpose_bandwidth(calibration):
    host = cost.target("host", calibration)
    (op,) = cost.program_costs(jax.jit(lambda x: x.T.copy()).lower(jnp.ones((64, 32)))).ops
    assert op.transposes and op.bytes == 2 * 4 * 64 * 32
    assert cost.op_seconds(op, host) == pytest.approx(op.bytes / 2e9 + 1e-6)
    (copy,) = cost.program_costs(jax.jit(lambda x: x * 2).lower(jnp.ones((64, 32)))).ops
    assert not copy.transposes
