"""Module conformance: every entry of PyTorch's ModuleInfo database on tpu, against CPU.

For each entry and each sample its ``module_inputs_func`` generates, in each
mode the entry has:

- ``train`` (and ``eval`` where the entry's modes differ): the module is
  built on the CPU, a deep copy moved to tpu, and both run forward on the
  same inputs. Outputs are compared, then the buffers after forward (running
  statistics, ``num_batches_tracked``), then the gradients of the inputs and
  parameters for one fixed upstream gradient.
- ``inference``: eval mode under ``torch.no_grad()``, forward only. This is
  where torch.nn takes its fused fast paths (``_transformer_encoder_layer_fwd``,
  ``_native_multi_head_attention``), on tpu as on CUDA.

A module whose CPU output changes with the seed (random) is checked for
structure, shape, dtype, statistics and determinism under a seed on tpu,
not for values. The CPU fallback stays off: only lowerings count.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import time

import torch
import torch.utils._pytree as pytree
from oracle import to_device

import torchtpu
from conformance.harness import (SampleFailure, assert_equal, assert_plausible, summarize, to_host,
                                 tolerance)

MODES = ("train", "eval", "inference")
DTYPE = torch.float32


@functools.cache
def modules_by_name() -> dict:
    from torch.testing._internal.common_modules import module_db

    return {info.name: info for info in module_db}


def checks_for(info) -> list[str]:
    """The modes an entry is checked in: eval only where it differs from train."""
    return [mode for mode in MODES if mode != "eval" or info.train_and_eval_differ]


@dataclasses.dataclass
class ModuleResult:
    module: str
    mode: str
    total: int = 0
    passed: int = 0
    reason: str = ""
    seconds: float = 0.0
    random: bool = False
    arbitrated: int = 0  # passing samples that missed CPU's float32 result and were judged by float64

    @property
    def ok(self) -> bool:
        return self.total > 0 and self.passed == self.total


def samples_for(info, mode: str) -> list:
    return list(info.module_inputs_func(info, device="cpu", dtype=DTYPE, requires_grad=mode != "inference",
                                        training=mode == "train"))


def build(info, sample, mode: str):
    """The module on the CPU, in ``mode``; a lazy one materialised by a first forward."""
    args, kwargs = sample.constructor_input.args, sample.constructor_input.kwargs
    module = info.module_cls(*args, **kwargs).to(DTYPE).train(mode == "train")
    if info.is_lazy:
        with torch.no_grad():
            module(*to_device(sample.forward_input.args, "cpu"), **to_device(sample.forward_input.kwargs, "cpu"))
    return module


def forward(module, sample, device: str, seed: int = 0):
    """The module's output for fresh leaf copies of the sample's inputs on ``device``, and the inputs."""
    args = to_device(sample.forward_input.args, device)
    kwargs = to_device(sample.forward_input.kwargs, device)
    torch.manual_seed(seed)
    return module(*args, **kwargs), (args, kwargs)


def is_random(info, sample, mode: str) -> bool:
    """Whether the CPU module's output changes with the seed."""
    module = build(info, sample, mode)
    with torch.no_grad():
        first, _ = forward(copy.deepcopy(module), sample, "cpu", seed=0)
        second, _ = forward(copy.deepcopy(module), sample, "cpu", seed=1)
    pairs = zip(pytree.tree_leaves(first), pytree.tree_leaves(second))
    return any(isinstance(a, torch.Tensor) and a.numel() and not torch.equal(a, b) for a, b in pairs)


def _differentiable(tree) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree)
            if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()]


def gradients(module, output, inputs, cotangents) -> list:
    """d(output . cotangents) / d(inputs, parameters), None where one does not flow."""
    wrt = _differentiable(inputs) + [p for p in module.parameters() if p.requires_grad]
    outputs = _differentiable(output)
    if not outputs or not wrt:
        return []
    device = outputs[0].device
    return list(torch.autograd.grad(outputs, wrt, [c.to(device) for c in cotangents], allow_unused=True))


def cotangents_for(output) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1234)
    return [torch.randn(t.shape, dtype=t.dtype, generator=generator) for t in _differentiable(output)]


def compare_buffers(tpu_module, cpu_module, tol) -> None:
    expected = dict(cpu_module.named_buffers())
    for name, buffer in tpu_module.named_buffers():
        try:
            assert_equal(to_host(buffer), expected[name], tol)
        except SampleFailure as e:
            raise SampleFailure(f"buffer {name}: {e}") from None


def _as_float64(tree):
    def widen(t):
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            return t.detach().double().requires_grad_(t.requires_grad)
        return t

    return pytree.tree_map(widen, tree)


def float64_run(module, sample, cotangents):
    """The sample's output and gradients with the module and inputs in float64: the arbiter."""
    module = module.double()
    args, kwargs = _as_float64(to_device((sample.forward_input.args, sample.forward_input.kwargs), "cpu"))
    torch.manual_seed(0)
    output = module(*args, **kwargs)
    grads = gradients(module, output, (args, kwargs), [c.double() for c in cotangents]) if cotangents else []
    return [t.detach() for t in _float_leaves(output)], grads


ERROR_FACTOR = 4
ULPS = 16  # of the tensor's largest value: below this, a difference is float32 rounding


def _max_error(x, reference) -> float:
    return (x.double() - reference).abs().max().item() if x.numel() else 0.0


def assert_within_cpus_error(what, actual, expected, reference) -> None:
    """A float32 result that misses CPU's is still right when its error against the float64 result
    is within ERROR_FACTOR of CPU's own float32 error, or of a few float32 ulps of the tensor's
    largest value: both results carry rounding error, summed in a different order."""
    tpu_error, cpu_error = _max_error(actual, reference), _max_error(expected, reference)
    scale = reference.abs().max().item() if reference.numel() else 0.0
    allowed = ERROR_FACTOR * max(cpu_error, ULPS * torch.finfo(DTYPE).eps * scale)
    if not tpu_error <= allowed:
        raise SampleFailure(f"{what}: error against float64 {tpu_error:.2e}, CPU's float32 {cpu_error:.2e}, "
                            f"allowed {allowed:.2e}")


def _mismatch(actual, expected, tol) -> str:
    try:
        assert_equal(actual, expected, tol)
        return ""
    except SampleFailure as e:
        return str(e)


def check_sample(info, sample, mode: str, random: bool) -> bool:
    """One sample in one mode: raises SampleFailure (or the tpu error) unless tpu matches CPU.

    Results that differ from CPU's beyond the tolerance go to a float64 run of the same sample,
    which decides (assert_within_cpus_error); returns whether it had to."""
    tol = tolerance(info, DTYPE)
    cpu_module = build(info, sample, mode)
    pristine = copy.deepcopy(cpu_module)
    tpu_module = copy.deepcopy(cpu_module).to("tpu")
    with torch.set_grad_enabled(mode != "inference"):
        expected, cpu_inputs = forward(cpu_module, sample, "cpu")
        actual, tpu_inputs = forward(tpu_module, sample, "tpu")
    if random:
        assert_plausible(to_host(actual), expected)
        again, _ = forward(copy.deepcopy(pristine).to("tpu"), sample, "tpu")
        assert_equal(to_host(again), to_host(actual), {"atol": 0, "rtol": 0})
        return False
    compare_buffers(tpu_module, cpu_module, tol)
    pairs = [("output", to_host(actual), expected)]
    cotangents = []
    if mode != "inference":
        cotangents = cotangents_for(expected)
        expected_grads = gradients(cpu_module, expected, cpu_inputs, cotangents)
        actual_grads = gradients(tpu_module, actual, tpu_inputs, cotangents)
        for index, (a, e) in enumerate(zip(actual_grads, expected_grads)):
            if (a is None) != (e is None):
                raise SampleFailure(f"gradient {index}: tpu {'has none' if a is None else 'has one'}, CPU's differs")
            if e is not None:
                pairs.append((f"gradient {index}", to_host(a), e))
    mismatches = [(what, a, e, message) for what, a, e in pairs if (message := _mismatch(a, e, tol))]
    for what, _, _, message in mismatches:
        if "not close" not in message:  # structure, shape or dtype: no rounding explains it
            raise SampleFailure(f"{what}: {message}")
    if not mismatches:
        return False
    outputs, grads = float64_run(pristine, sample, cotangents)
    references = dict([("output", outputs)] + [(f"gradient {i}", g) for i, g in enumerate(grads)])
    for what, a, e, message in mismatches:
        if what == "output":
            for a_leaf, e_leaf, r_leaf in zip(_float_leaves(a), _float_leaves(e), references["output"]):
                assert_within_cpus_error(what, a_leaf, e_leaf, r_leaf)
        else:
            assert_within_cpus_error(what, a, e, references[what])
    return True


def _float_leaves(tree) -> list:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def run_check(info, mode: str, *, max_samples: int | None = None) -> ModuleResult:
    """Every sample of one entry in one mode, the CPU fallback off; counts what passes."""
    result = ModuleResult(info.name, mode)
    started = time.monotonic()
    try:
        samples = samples_for(info, mode)[:max_samples]
        result.random = any(is_random(info, s, mode) for s in samples[:3])
    except Exception as e:  # noqa: BLE001 - a broken sample generator fails the check
        result.total, result.reason = 1, "sample generation: " + summarize(e)
        return result
    for sample in samples:
        result.total += 1
        try:
            with torchtpu.config.override(host_runs_before_compile=0, cpu_fallback=False):
                result.arbitrated += check_sample(info, sample, mode, result.random)
            result.passed += 1
        except Exception as e:  # noqa: BLE001 - every failure is recorded, never raised
            result.reason = result.reason or f"{sample.desc or 'sample'}: {summarize(e)}"
    result.seconds = round(time.monotonic() - started, 2)
    return result
