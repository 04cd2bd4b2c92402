"""Module conformance in CI: every ModuleInfo entry in every mode (module_harness.py).

Known failures come from module_expected_failures.py and are
xfail(strict=True), so a fix shows up as an unexpected pass. The same checks,
with the report docs/module_coverage.md, are ./scripts/module_conformance.sh.
"""

from __future__ import annotations

import pytest

from conformance import harness, module_harness
from conformance.module_expected_failures import EXPECTED_FAILURES


def _params():
    params = []
    for name, info in module_harness.modules_by_name().items():
        for mode in module_harness.checks_for(info):
            reason = EXPECTED_FAILURES.get((name, mode))
            marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
            params.append(pytest.param(name, mode, marks=marks, id=f"{name}-{mode}"))
    return params


@pytest.mark.parametrize("name, mode", _params())
def test_module_conformance(name, mode):
    with harness.time_limit(300):
        result = module_harness.run_check(module_harness.modules_by_name()[name], mode)
    assert result.total > 0, f"{name} generated no samples"
    assert result.ok, f"{result.passed}/{result.total} samples pass; first failure: {result.reason}"


def test_a_wrong_tpu_result_fails_the_check(monkeypatch):
    """The check can fail: a tpu output off by 1e-3 is beyond float32 rounding, float64 arbiter included."""
    real_forward = module_harness.forward

    def off_on_tpu(module, sample, device, seed=0):
        output, inputs = real_forward(module, sample, device, seed)
        return (output + 1e-3 if device == "tpu" else output), inputs

    monkeypatch.setattr(module_harness, "forward", off_on_tpu)
    info = module_harness.modules_by_name()["nn.Linear"]
    sample = module_harness.samples_for(info, "train")[0]
    with pytest.raises(harness.SampleFailure, match="error against float64"):
        module_harness.check_sample(info, sample, "train", random=False)
