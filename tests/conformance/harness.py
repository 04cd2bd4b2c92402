"""Run PyTorch's OpInfo samples on tpu and on CPU and compare.

One *check* is an (OpInfo entry, kind, dtype) triple; it runs every sample
the OpInfo generates for that dtype and returns a ``Result``.  Kinds:

- ``forward``  the op's outputs (values, dtype, shape), per dtype;
- ``grad``     gradients of every input that requires grad (float32);
- ``inplace``  the in-place variant (``x.add_``), result and mutated input;
- ``out``      the ``out=`` variant, with freshly allocated outputs;
- ``errors``   OpInfo's error inputs raise the same exception type as CPU.

When CPU raises for a sample, tpu must raise the same exception type.  Random
ops (CPU results change with the seed) and ops with uninitialized outputs are
compared by shape, dtype and simple statistics only.  Tolerances are
``torch.testing.assert_close``'s per-dtype defaults, widened by any
``toleranceOverride`` the OpInfo entry carries.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import signal
import time

import torch
import torch.utils._pytree as pytree
from torch.testing._internal.common_device_type import toleranceOverride

import torchtpu
from torchtpu.runtime import metrics as stats

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
    "complex64": torch.complex64,
    "int64": torch.int64,
    "int32": torch.int32,
    "bool": torch.bool,
}
KINDS = ("forward", "grad", "inplace", "out", "errors")


def op_db():
    from torch.testing._internal.common_methods_invocations import op_db as db

    return db


def full_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


@functools.lru_cache(maxsize=None)
def ops_by_name() -> dict:
    return {full_name(op): op for op in op_db()}


@dataclasses.dataclass
class Result:
    op: str
    kind: str
    dtype: str
    total: int = 0
    passed: int = 0
    fallback_only: int = 0  # samples that pass only with TORCHTPU_CPU_FALLBACK=1
    reason: str = ""  # the first failure, summarized
    random: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.passed == self.total


class SampleFailure(Exception):
    """A sample's tpu result differs from CPU's."""


# ---------------------------------------------------------------------------
# Which checks apply to an OpInfo entry.


def checks_for(op, kinds=KINDS):
    """The (kind, dtype name) checks that apply to ``op`` on this machine's CPU."""
    supported = op.supported_dtypes("cpu")
    forward = [name for name, dt in DTYPES.items() if dt in supported]
    if not forward:
        return []
    variant_dtype = "float32" if "float32" in forward else forward[0]
    out = []
    for kind in kinds:
        if kind == "forward":
            out += [("forward", name) for name in forward]
        elif kind == "grad" and op.supports_autograd and torch.float32 in op.supported_backward_dtypes("cpu"):
            out.append(("grad", "float32"))
        elif kind == "inplace" and op.inplace_variant is not None:
            out.append(("inplace", variant_dtype))
        elif kind == "out" and op.supports_out:
            out.append(("out", variant_dtype))
        elif kind == "errors" and op.error_inputs_func is not None:
            out.append(("errors", "float32"))
    return out


# ---------------------------------------------------------------------------
# Moving samples between devices.


def _copy_to(device):
    def move(x):
        if not isinstance(x, torch.Tensor):
            return x
        copied = x.detach().to(device, copy=True)
        return copied.requires_grad_(x.requires_grad)

    return move


def sample_on(sample, device):
    """(input, args, kwargs) of ``sample`` as fresh leaf tensors on ``device``.

    A factory sample's ``device=`` argument names the device too."""
    inp, args, kwargs = pytree.tree_map(_copy_to(device), (sample.input, sample.args, sample.kwargs))
    if "device" in kwargs:
        kwargs["device"] = device
    return inp, args, kwargs


def _host(x):
    if isinstance(x, torch.Tensor):
        if x.device.type != "tpu":
            raise SampleFailure(f"result is on {x.device}, not tpu")
        return x.detach().cpu()
    return x


def to_host(tree):
    return pytree.tree_map(_host, tree)


# ---------------------------------------------------------------------------
# Comparing.


def tolerance(op, dtype):
    """assert_close's defaults for ``dtype``, widened by the OpInfo's toleranceOverride."""
    atol = rtol = None
    for info in op.decorators:
        for decorator in getattr(info, "decorators", [info]):
            if isinstance(decorator, toleranceOverride) and dtype in decorator.d:
                tol = decorator.d[dtype]
                atol, rtol = max(atol or 0, tol.atol), max(rtol or 0, tol.rtol)
    if atol is None:
        return {}
    default_rtol, default_atol = torch.testing._comparison.default_tolerances(dtype)
    return {"atol": max(atol, default_atol), "rtol": max(rtol, default_rtol)}


def assert_equal(actual, expected, tol):
    try:
        torch.testing.assert_close(actual, expected, equal_nan=True, check_device=False, **tol)
    except AssertionError as e:
        raise SampleFailure(_first_line(e)) from None


def _first_line(e) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    detail = next((line for line in lines if line.startswith("Greatest")), "")
    return " ".join(x for x in (lines[0] if lines else "", detail) if x)[:200]


def assert_plausible(actual, expected):
    """Random or uninitialized outputs: same structure, shape and dtype; similar statistics."""
    a_leaves, a_spec = pytree.tree_flatten(actual)
    e_leaves, e_spec = pytree.tree_flatten(expected)
    if a_spec != e_spec:
        raise SampleFailure(f"output structure {a_spec} != {e_spec}")
    for a, e in zip(a_leaves, e_leaves):
        if not isinstance(e, torch.Tensor):
            continue
        if a.shape != e.shape or a.dtype != e.dtype:
            raise SampleFailure(f"shape/dtype {tuple(a.shape)} {a.dtype} != {tuple(e.shape)} {e.dtype}")
        _assert_similar_statistics(a, e)


def _assert_similar_statistics(a, e):
    """tpu's quartiles lie within CPU's 5%-95% range: robust for heavy tails and 0/1 draws."""
    if e.numel() < 64 or e.dtype == torch.bool or e.is_complex():
        return
    a, e = a.double().flatten(), e.double().flatten()
    if bool(e.isfinite().all()) and not bool(a.isfinite().all()):
        raise SampleFailure("random output has non-finite values where CPU's has none")
    if not bool(e.isfinite().all()):
        return
    lo, hi = torch.quantile(e, torch.tensor([0.05, 0.95], dtype=torch.double)).tolist()
    q1, q3 = torch.quantile(a, torch.tensor([0.25, 0.75], dtype=torch.double)).tolist()
    if q1 < lo or q3 > hi:
        raise SampleFailure(f"random output quartiles [{q1:.3g}, {q3:.3g}] outside CPU's 5-95% range [{lo:.3g}, {hi:.3g}]")


# ---------------------------------------------------------------------------
# Running one sample.


def call(fn, device, inp, args, kwargs, **extra):
    """``fn(inp, *args, **kwargs)``; a factory call with no tensor argument makes ``device`` its default."""
    if any(isinstance(t, torch.Tensor) for t in pytree.tree_leaves((inp, args, kwargs))):
        return fn(inp, *args, **kwargs, **extra)
    with torch.device(device):
        return fn(inp, *args, **kwargs, **extra)


def _run_both(cpu_fn, tpu_fn):
    """CPU's result (or exception), then tpu's; a CPU exception must be matched in type."""
    try:
        expected = cpu_fn()
    except Exception as e:  # noqa: BLE001 - CPU's error is the oracle
        try:
            tpu_fn()
        except Exception as tpu_error:  # noqa: BLE001
            if isinstance(tpu_error, type(e)):
                return None, None
            raise SampleFailure(f"CPU raised {type(e).__name__}, tpu raised {type(tpu_error).__name__}: {tpu_error}") from None
        raise SampleFailure(f"CPU raised {type(e).__name__}: {str(e)[:80]}; tpu did not raise") from None
    return expected, tpu_fn()


def _seeds_itself(op) -> bool:
    """OpInfo wraps random ops in ``wrapper_set_seed``, which reseeds on every call."""
    code = getattr(op.op, "__code__", None)
    return code is not None and "wrapper_set_seed" in code.co_names


def is_random(op, sample) -> bool:
    """Uninitialized outputs, a seeded wrapper, or CPU results that change with the seed."""
    if op.has_nondeterministic_output or _seeds_itself(op):
        return True
    results = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        inp, args, kwargs = sample_on(sample, "cpu")
        try:
            results.append(pytree.tree_leaves(op(inp, *args, **kwargs)))
        except Exception:  # noqa: BLE001 - an erroring sample says nothing about randomness
            return False
    for a, b in zip(*results):
        if isinstance(a, torch.Tensor) and a.numel() and not torch.equal(a.detach(), b.detach()):
            return True
    return False


def compare(op, dtype, random, actual, expected):
    """tpu's ``actual`` against CPU's ``expected``: values, or plausibility for random ops."""
    actual = to_host(actual)
    if random:
        assert_plausible(actual, expected)
    else:
        assert_equal(actual, expected, tolerance(op, dtype))


def check_forward(op, sample, dtype, random):
    def run(device):
        inp, args, kwargs = sample_on(sample, device)
        with torch.no_grad():
            return call(op, device, inp, args, kwargs)

    expected, actual = _run_both(lambda: run("cpu"), lambda: run("tpu"))
    if expected is not None:
        compare(op, dtype, random, actual, expected)


def check_inplace(op, sample, dtype, random):
    def run(device):
        inp, args, kwargs = sample_on(sample, device)
        with torch.no_grad():
            result = call(op.inplace_variant, device, inp, args, kwargs)
        if result is not inp:
            raise SampleFailure("in-place variant did not return its input")
        return inp

    expected, actual = _run_both(lambda: run("cpu"), lambda: run("tpu"))
    if expected is not None:
        compare(op, dtype, random, actual, expected)


def _empty_like_tree(tree, device):
    return pytree.tree_map(
        lambda t: torch.empty(0, dtype=t.dtype, device=device) if isinstance(t, torch.Tensor) else t, tree
    )


def check_out(op, sample, dtype, random):
    inp, args, kwargs = sample_on(sample, "cpu")
    with torch.no_grad():
        try:
            reference = op(inp, *args, **kwargs)
        except Exception:  # noqa: BLE001 - the forward check covers erroring samples
            return
    if not all(isinstance(t, torch.Tensor) for t in pytree.tree_leaves(reference)):
        return
    if isinstance(reference, list):
        return  # out= takes a tuple; list-returning ops have no out= to compare

    def run(device):
        inp, args, kwargs = sample_on(sample, device)
        out = _empty_like_tree(reference, device)
        with torch.no_grad():
            result = call(op, device, inp, args, kwargs, out=out)
        return out if result is None else result

    expected, actual = _run_both(lambda: run("cpu"), lambda: run("tpu"))
    if expected is not None:
        compare(op, dtype, random, actual, expected)


def _grad_inputs(tree):
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor) and t.requires_grad]


def _differentiable_outputs(output):
    return [
        t for t in pytree.tree_leaves(output)
        if isinstance(t, torch.Tensor) and t.requires_grad and (t.is_floating_point() or t.is_complex())
    ]


def _gradients(op, sample, device, cotangents):
    inp, args, kwargs = sample_on(sample, device)
    leaves = _grad_inputs((inp, args, kwargs))
    output = sample.output_process_fn_grad(call(functools.partial(op.gradcheck_wrapper, op.get_op()), device, inp, args, kwargs))
    outputs = _differentiable_outputs(output)
    if not outputs or not leaves:
        return None, outputs
    if cotangents is None:
        generator = torch.Generator().manual_seed(0)
        cotangents = [torch.randn(o.shape, dtype=o.dtype, generator=generator) for o in outputs]
    grads = torch.autograd.grad(
        outputs, leaves, [c.to(device) for c in cotangents], allow_unused=True
    )
    return list(grads), cotangents


def check_grad(op, sample, dtype, random):
    if random:
        return  # gradients of random ops depend on the draw
    expected, cotangents = _gradients(op, sample, "cpu", None)
    if expected is None:
        return
    actual, _ = _gradients(op, sample, "tpu", cotangents)
    assert_equal(to_host(actual), expected, tolerance(op, torch.float32))


def check_error(op, error_input):
    sample = error_input.sample_input
    inp, args, kwargs = sample_on(sample, "tpu")
    try:
        call(op, "tpu", inp, args, kwargs)
    except Exception as e:  # noqa: BLE001
        if isinstance(e, error_input.error_type):
            return
        raise SampleFailure(f"raised {type(e).__name__} ({str(e)[:80]}), CPU raises {error_input.error_type.__name__}") from None
    raise SampleFailure(f"did not raise; CPU raises {error_input.error_type.__name__}")


_RUNNERS = {"forward": check_forward, "grad": check_grad, "inplace": check_inplace, "out": check_out}


# ---------------------------------------------------------------------------
# Running one check (every sample).


def samples_for(op, kind, dtype):
    if kind == "errors":
        return list(op.error_inputs("cpu"))
    requires_grad = kind == "grad"
    return list(op.sample_inputs("cpu", DTYPES[dtype], requires_grad=requires_grad))


def summarize(e: BaseException) -> str:
    if isinstance(e, SampleFailure):
        return f"mismatch: {e}"
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if isinstance(e, NotImplementedError) and "has no tpu lowering" in text:
        return "no lowering: " + text.split("'")[1]
    return f"{type(e).__name__}: {text}"[:200]


def _passes_with_fallback(run) -> bool:
    before = sum(stats.cpu_fallbacks.values())
    with torchtpu.config.override(cpu_fallback=True):
        try:
            run()
        except Exception:  # noqa: BLE001
            return False
    return sum(stats.cpu_fallbacks.values()) > before


def run_check(op, kind, dtype, *, max_samples=None, fallback_telemetry=False) -> Result:
    """Run every sample of one check with the CPU fallback off; count what passes."""
    result = Result(full_name(op), kind, dtype)
    started = time.monotonic()
    try:
        samples = samples_for(op, kind, dtype)
    except Exception as e:  # noqa: BLE001 - a broken sample generator is a failure of the check
        result.total, result.reason = 1, "sample generation: " + summarize(e)
        return result
    samples = samples[:max_samples] if max_samples else samples
    if kind != "errors":
        result.random = any(is_random(op, s) for s in samples[:3])
    for sample in samples:
        if kind == "errors":
            run = lambda s=sample: check_error(op, s)  # noqa: E731
        else:
            run = lambda s=sample: _RUNNERS[kind](op, s, DTYPES[dtype], result.random)  # noqa: E731
        result.total += 1
        try:
            # The lowerings under test: a new shape's first calls would otherwise run CPU's own kernel.
            with torchtpu.config.override(host_runs_before_compile=0):
                run()
            result.passed += 1
        except Exception as e:  # noqa: BLE001 - every failure is recorded, never raised
            result.reason = result.reason or summarize(e)
            if fallback_telemetry and "no lowering" in summarize(e) and _passes_with_fallback(run):
                result.fallback_only += 1
    result.seconds = round(time.monotonic() - started, 2)
    return result


class CheckTimeout(BaseException):
    """Not an Exception, so that it escapes the per-sample handlers."""


@contextlib.contextmanager
def time_limit(seconds):
    """Raise CheckTimeout in the main thread after ``seconds`` (SIGALRM; POSIX only)."""
    if not seconds:
        yield
        return

    def expire(signum, frame):
        raise CheckTimeout(f"timed out after {seconds}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
