"""The ``torch.tpu`` module: devices, synchronization, memory, RNG, streams, precision.

We present one logical device, ``tpu:0``, whatever the number of chips:
sharding spreads a tensor's data over chips, and ``device_count()`` stays 1,
which is what PyTorch's Python device guard supports.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import time
from dataclasses import dataclass

import jax
import torch

from .execution import debug as _debug
from .execution import fused as _fused
from .execution import modes as _modes
from .runtime import memory, rng, stats
from .runtime import precision as _runtime_precision

_initialized = False


@functools.lru_cache(maxsize=None)
def _devices():
    return tuple(jax.devices())


def _platform() -> str:
    return _devices()[0].platform


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return _initialized


def _lazy_init() -> None:
    global _initialized
    _devices()
    _initialized = True


def device_count() -> int:
    return 1


def current_device() -> int:
    return 0


def _index(device) -> int:
    if device is None:
        return 0
    if isinstance(device, int):
        index = device
    else:
        device = torch.device(device)
        if device.type != "tpu":
            raise ValueError(f"expected a tpu device, got {device}")
        index = device.index or 0
    if index != 0:
        raise RuntimeError(f"torchtpu presents one logical device, tpu:0; got tpu:{index}")
    return index


def set_device(device) -> None:
    _index(device)


class device:
    """Context manager that selects a tpu device (only tpu:0 exists)."""

    def __init__(self, device):
        self.idx = _index(device)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def get_device_name(device=None) -> str:
    _index(device)
    first = _devices()[0]
    if first.platform == "tpu":
        return first.device_kind if first.device_kind.startswith("TPU") else f"TPU {first.device_kind}"
    if first.platform == "gpu":
        return f"XLA GPU ({first.device_kind}; no TPU found)"
    return "XLA CPU (no TPU found)"


@dataclass(frozen=True)
class DeviceProperties:
    name: str
    platform: str
    total_memory: int
    chip_count: int


def get_device_properties(device=None) -> DeviceProperties:
    return DeviceProperties(get_device_name(device), _platform(), _total_memory(), len(_devices()))


def synchronize(device=None) -> None:
    """Wait for all queued work on the device.

    Every op's results land in a tpu storage, so waiting for the arrays
    stored since the last synchronize covers all of torchtpu's work, at a
    cost proportional to that work, not to every jax array in the process.
    """
    from . import tensor

    _index(device)
    stats.host_syncs["synchronize"] += 1
    _fused.flush("synchronize")
    tensor.wait_for_dispatched()


# ---- memory --------------------------------------------------------------------


def _runtime_stats():
    """PJRT's own memory statistics, summed over chips, or None where it has none."""
    per_chip = [d.memory_stats() for d in _devices()]
    if not per_chip or any(s is None for s in per_chip):
        return None
    total = {}
    for s in per_chip:
        for k, v in s.items():
            total[k] = total.get(k, 0) + v
    return total


def _total_memory() -> int:
    runtime = _runtime_stats()
    if runtime and "bytes_limit" in runtime:
        return int(runtime["bytes_limit"])
    try:
        import os

        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def memory_allocated(device=None) -> int:
    runtime = _runtime_stats()
    return int(runtime["bytes_in_use"]) if runtime and "bytes_in_use" in runtime else memory.allocated_bytes


def max_memory_allocated(device=None) -> int:
    runtime = _runtime_stats()
    if runtime and "peak_bytes_in_use" in runtime:
        return int(runtime["peak_bytes_in_use"])
    return memory.peak_bytes


def memory_reserved(device=None) -> int:
    runtime = _runtime_stats()
    if runtime and "bytes_reserved" in runtime:
        return int(runtime["bytes_reserved"])
    return memory_allocated(device)


def max_memory_reserved(device=None) -> int:
    return max(memory_reserved(device), max_memory_allocated(device))


def memory_stats(device=None) -> dict:
    return {
        "allocated_bytes.all.current": memory_allocated(device),
        "allocated_bytes.all.peak": max_memory_allocated(device),
        "reserved_bytes.all.current": memory_reserved(device),
        "source": "pjrt" if _runtime_stats() else "torchtpu live-buffer accounting",
    }


def reset_peak_memory_stats(device=None) -> None:
    memory.reset_peak()


def mem_get_info(device=None) -> tuple:
    total = _total_memory()
    return (max(total - memory_reserved(device), 0), total)


def empty_cache() -> None:
    """Nothing to release: XLA frees a buffer as soon as its last tensor dies."""


# ---- RNG -----------------------------------------------------------------------


def manual_seed(seed: int) -> None:
    rng.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    rng.manual_seed(seed)


def seed() -> None:
    rng.manual_seed(time.time_ns() % (1 << 63))


def seed_all() -> None:
    seed()


def initial_seed() -> int:
    return rng.initial_seed()


def get_rng_state(device="tpu") -> torch.Tensor:
    return rng.get_state()


def set_rng_state(new_state: torch.Tensor, device="tpu") -> None:
    rng.set_state(new_state)


def get_rng_state_all() -> list:
    return [get_rng_state()]


def set_rng_state_all(new_states) -> None:
    set_rng_state(new_states[0])


# ---- streams and events ------------------------------------------------------


class Stream:
    """XLA orders a device's work itself; a stream is an ordering handle with CUDA's API.

    Work on every stream runs in dispatch order, which is a valid schedule for
    any CUDA stream program, so waits are no-ops and synchronize waits for all.
    """

    def __init__(self, device=None, priority=0, **kwargs):
        self.device = torch.device("tpu", _index(device))
        self.priority = priority

    def synchronize(self) -> None:
        synchronize()

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def __enter__(self):
        _stream_stack.append(self)
        return self

    def __exit__(self, *exc):
        _stream_stack.pop()
        return False

    def __eq__(self, other):
        return self is other

    def __hash__(self):
        return id(self)

    def __repr__(self):
        return f"<torch.tpu.Stream device={self.device} priority={self.priority}>"


_default_stream = None
_stream_stack: list = []


def default_stream(device=None) -> Stream:
    global _default_stream
    _index(device)
    if _default_stream is None:
        _default_stream = Stream()
    return _default_stream


def current_stream(device=None) -> Stream:
    _index(device)
    return _stream_stack[-1] if _stream_stack else default_stream()


def set_stream(s) -> None:
    """Make ``s`` the current stream (until the enclosing ``stream`` block ends)."""
    if _stream_stack:
        _stream_stack[-1] = s
    else:
        _stream_stack.append(s)


@contextlib.contextmanager
def stream(s):
    """Make ``s`` the current stream inside the block, like ``torch.cuda.stream``."""
    if s is None:
        yield
        return
    with s:
        yield s


class Event:
    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.enable_timing = enable_timing
        self._time = None

    def record(self, stream=None) -> None:
        # A timing event needs the time the preceding work finished: wait for it.
        if self.enable_timing:
            synchronize()
        self._time = time.perf_counter()

    def synchronize(self) -> None:
        synchronize()

    def query(self) -> bool:
        return True

    def wait(self, stream=None) -> None:
        pass

    def elapsed_time(self, end_event) -> float:
        """Milliseconds between this event and ``end_event``, as CUDA reports."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._time is None or end_event._time is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._time - self._time) * 1000.0


# ---- precision and amp -------------------------------------------------------


class Precision(enum.Enum):
    DEFAULT = "default"  # bfloat16 passes on TPU: fastest
    HIGH = "high"  # three bfloat16 passes
    HIGHEST = "highest"  # full float32


def get_precision() -> Precision:
    return Precision(_runtime_precision.current)


@contextlib.contextmanager
def precision(value):
    """Compile the float32 matmuls and convolutions inside the block at ``value``.

    HIGHEST (full float32, matching CPU) is the default; DEFAULT and HIGH are
    faster bfloat16-based modes on TPU.  Programs are cached per precision.
    """
    value = Precision(value) if not isinstance(value, Precision) else value
    previous = _runtime_precision.current
    _runtime_precision.set_current(value.value)
    try:
        yield
    finally:
        _runtime_precision.set_current(previous)


def get_amp_supported_dtype() -> list:
    return [torch.bfloat16, torch.float16]


# torch.autocast("tpu") enables the AutocastPrivateUse1 dispatch key; PyTorch
# registers autocast kernels for its own devices only.  Like CUDA's policy:
# these ops run in the autocast dtype, these in float32, all others untouched.
AUTOCAST_LOWER_PRECISION = (
    "mm", "bmm", "matmul", "addmm", "addbmm", "baddbmm", "addmv", "addr", "mv", "dot", "vdot",
    "linear", "einsum", "chain_matmul", "linalg_multi_dot", "prelu",
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "convolution", "_convolution", "conv_tbc", "scaled_dot_product_attention",
)
AUTOCAST_FLOAT32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
    "rsqrt", "sinh", "tan", "pow", "softplus", "layer_norm", "group_norm", "norm", "nll_loss",
    "cross_entropy_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "binary_cross_entropy_with_logits",
    "softmax", "log_softmax", "cumsum", "cumprod", "sum", "prod", "dist", "cosine_similarity", "renorm",
)
_autocast_libraries = []
_AUTOCAST_KEY = torch._C.DispatchKey.AutocastPrivateUse1


def _autocast_cast(value, dtype):
    if isinstance(value, torch.Tensor):
        eligible = value.device.type == "tpu" and value.is_floating_point() and value.dtype != torch.float64
        return value.to(dtype) if eligible and value.dtype != dtype else value
    if isinstance(value, (list, tuple)):
        return type(value)(_autocast_cast(v, dtype) for v in value)
    return value


def _autocast_kernel(op, to_float32: bool):
    def kernel(*args, **kwargs):
        dtype = torch.float32 if to_float32 else torch.get_autocast_dtype("tpu")
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(_AUTOCAST_KEY)):
            return op(*_autocast_cast(args, dtype), **{k: _autocast_cast(v, dtype) for k, v in kwargs.items()})

    return kernel


def register_autocast() -> None:
    if _autocast_libraries:
        return
    kernels = torch.library.Library("aten", "IMPL", "AutocastPrivateUse1")
    _autocast_libraries.append(kernels)
    passthrough = torch.library.Library("_", "IMPL", "AutocastPrivateUse1")
    try:  # every other op passes through autocast unchanged, as on CUDA
        passthrough.fallback(torch.library.fallthrough_kernel)
        _autocast_libraries.append(passthrough)
    except RuntimeError as error:  # someone registered it already: that is all we need
        if "multiple backend fallbacks" not in str(error):
            raise
    for names, to_float32 in ((AUTOCAST_LOWER_PRECISION, False), (AUTOCAST_FLOAT32, True)):
        for name in names:
            packet = getattr(torch.ops.aten, name, None)
            if packet is None:
                continue
            for overload in packet.overloads():
                op = getattr(packet, overload)
                if op._schema.is_mutable or "out" in overload:
                    continue  # autocast leaves in-place and out= ops alone, like CUDA
                kernels.impl(op, _autocast_kernel(op, to_float32))


register_autocast()


def _is_in_bad_fork() -> bool:
    return False


def fallback_stats() -> dict:
    """How many times each op ran on the host through TORCHTPU_CPU_FALLBACK=1."""
    return dict(stats.cpu_fallbacks)


def compile_stats() -> dict:
    """How many programs were compiled for each op."""
    return dict(stats.compiles)


def host_sync_stats() -> dict:
    return dict(stats.host_syncs)


def compile_cache_stats() -> dict:
    """The compiled-program caches: requests, hits, misses and seconds spent compiling."""
    from .runtime import compile_cache

    return compile_cache.stats()


# ---- eager modes -------------------------------------------------------------

EagerMode = _modes.EagerMode
get_eager_mode = _modes.get_eager_mode
set_eager_mode = _modes.set_eager_mode
eager_mode = _modes.eager_mode
debug_checks = _debug.debug_checks
NonFiniteError = _debug.NonFiniteError
set_max_fused_ops = _fused.set_max_ops
get_max_fused_ops = _fused.get_max_ops


def graph_break_stats() -> dict:
    """Fused mode: how many times the pending graph ran, by cause ("item", "print", "size limit", ...)."""
    return dict(stats.graph_breaks)


def fused_stats() -> dict:
    """Fused mode: graphs compiled and run, cache hits, ops fused, input buffers donated."""
    return dict(stats.fused)


_modes.apply_env()  # TPU_LAUNCH_BLOCKING=1, TPU_DEFER_AND_FUSE=1, TPU_MAX_FUSED_OPS=n
