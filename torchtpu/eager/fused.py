"""Fused eager: ops are recorded into a pending graph and run as one program at a host sync.

The executor still does the per-op work (meta kernel, program key, output
tensors); instead of running an op's program, this launcher appends the
program with the values it reads, and hands back ``Deferred`` values for its
results.  ``flush`` composes the recorded programs into one function,
threading each value from the op that makes it to the ops that read it, and
jits that function once per graph structure: the graph's key is its sequence
of per-op programs (op, shapes, dtypes, static arguments) and its wiring, so
a training step that repeats compiles once.

A flush happens when anything needs real data (``Buffer.array``: ``.item()``,
``.cpu()``, printing, ``bool()``, data-dependent ops, the CPU fallback), at
``torch.tpu.synchronize()``, after each ``optimizer.step()``, when the graph
reaches ``max_fused_ops`` ops, and when the mode changes.  Each is counted by
cause in ``metrics.graph_breaks``.

Only values still held by a tensor's storage leave the program; temporaries
stay inside XLA's fusion.  Input arrays that the graph replaced and that
nothing else references are donated (``core.program.unshared``), so an
optimizer step updates its parameters in place instead of doubling their
memory.
"""

from __future__ import annotations

import sys
import warnings

import jax
from torch._guards import TracingContext

from .. import config
from ..core import dtypes, tensor
from ..core.program import abstract_value, unshared
from ..runtime import caches, metrics

_NUMBERS = (int, float, complex, bool)  # runtime scalars: op arguments, RNG seeds and offsets


def set_max_ops(n: int) -> None:
    """Flush the pending graph once it holds ``n`` ops (a bound on compile time and memory)."""
    if n < 1:
        raise ValueError("the fused graph size limit must be at least 1 op")
    config.update(max_fused_ops=int(n))


def get_max_ops() -> int:
    return config.current.max_fused_ops


class _Graph:
    """The pending ops: per-op programs, how their inputs are wired, and the values they make."""

    __slots__ = ("serial", "steps", "key", "externals", "external_ids", "values")
    _count = 0

    def __init__(self):
        _Graph._count += 1
        self.serial = _Graph._count
        self.steps = []  # (pure program, input refs, output positions, written slots)
        self.key = []  # (program, input refs) per op: what the compiled graph depends on
        self.externals = []  # arrays and numbers the graph reads from outside
        self.external_ids = {}  # id(array) -> index in externals, so a shared array is passed once
        self.values = []  # every Deferred the graph makes, by index

    def ref(self, value):
        """An input's place in the graph: ~index for a value made here, index into externals, or None."""
        if type(value) is tensor.Deferred:
            if value.graph != self.serial:
                raise RuntimeError("torchtpu: this tensor's fused graph failed earlier; its value is lost")
            return ~value.index
        if value is None:
            return None
        if type(value) not in _NUMBERS:  # an array: pass each one once
            index = self.external_ids.get(id(value))
            if index is not None:
                return index
            self.external_ids[id(value)] = len(self.externals)
        self.externals.append(value)
        return len(self.externals) - 1

    def new_value(self, shape, dtype) -> tensor.Deferred:
        value = tensor.Deferred(self.serial, len(self.values), tuple(shape), dtype)
        self.values.append(value)
        return value


class FusedLauncher:
    name = "fused"
    defers = True  # programs join the pending graph; compiled graphs join it too

    def __init__(self):
        self.graph = _Graph()
        self.cut_requested = False  # the optimizer stepped: the next op starts a new graph
        self.compiled = caches.BoundedCache("fused graphs", maxsize=1024)  # graph key -> jitted composed function
        self.last_run = None  # (jitted function, its inputs' shapes) of the last graph run
        self._hook = None

    def pending_ops(self) -> int:
        return len(self.graph.steps)

    # ---- recording ------------------------------------------------------------------------

    def launch(self, program, dynamic):
        """Append the program to the pending graph and return Deferred results."""
        if self._hook is None:
            self._hook_optimizers()
        if _dynamo_is_tracing() and not any(type(v) is tensor.Deferred for v in dynamic):
            # Dynamo runs a few real ops while it traces (an optimizer creating its state at
            # the first compiled step): run them now, so that the first step's pending graph
            # is the same as every later step's and the step compiles once.
            return program(*dynamic)
        if self.cut_requested or len(self.graph.steps) >= config.current.max_fused_ops:
            self.flush("optimizer step" if self.cut_requested else "size limit")
            dynamic = [_materialized(v) for v in dynamic]
        if not program.traced:
            _trace_once(program, dynamic)
        graph = self.graph
        refs = tuple(graph.ref(v) for v in dynamic)
        outs, positions = [], []
        if program.fresh_outputs:
            for position, meta in enumerate(program.out_metas):
                if meta is None:
                    outs.append(None)
                else:
                    outs.append(graph.new_value(meta[0], dtypes.to_jax(meta[2])))
                    positions.append(position)
        written, written_slots = {}, []
        for slot, layout in program.written_layouts.items():
            dtype = program.written_dtypes[slot]
            if dtype is None:  # an empty write into a storage never written: it stays empty
                written[slot] = None
                continue
            written[slot] = graph.new_value(layout[0], dtype)
            written_slots.append(slot)
        graph.steps.append((program.pure, refs, tuple(positions), tuple(written_slots)))
        graph.key.append((program, refs))
        return outs, written

    def _hook_optimizers(self) -> None:
        """Done at the first recorded op: torch.optim cannot be imported while torch imports us."""
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._hook = register_optimizer_step_post_hook(self._after_optimizer_step)

    def _after_optimizer_step(self, optimizer, args, kwargs) -> None:
        """End the graph at each optimizer step, so every training step is the same graph.

        Without it, a loop that syncs rarely is cut only by the size limit, at a
        different op each step, and each cut is a new graph to compile.  The graph
        runs at the next op or sync rather than here, so that ``zero_grad()``
        drops the gradients first: a value no tensor holds never leaves the
        program, and the step does not write the gradients out.
        """
        if self.graph.steps:
            self.cut_requested = True

    # ---- running the pending graph ----------------------------------------------------------

    def flush(self, cause: str | None = None) -> None:
        """Run the pending graph, if any, and store its results in their buffers."""
        graph = self.graph
        if not graph.steps:
            return
        self.graph = _Graph()
        if self.cut_requested:  # whatever runs it, the optimizer step ended this graph
            cause, self.cut_requested = "optimizer step", False
        metrics.record(metrics.graph_breaks, cause if cause in _OWN_CAUSES else host_read_cause(cause), "graph_break")
        live = [v for v in graph.values if _holder(v) is not None]
        donate = _donatable(graph.externals, live)
        key = (tuple(graph.key), tuple(v.index for v in live), donate)
        fn = self.compiled.get(key)
        if fn is None:
            fn = self.compiled[key] = jax.jit(_compose(graph.steps, [v.index for v in live]), donate_argnums=donate)
        else:
            metrics.fused["graph cache hits"] += 1
        self.last_run = (fn, [jax.ShapeDtypeStruct(a.shape, a.dtype) if hasattr(a, "shape") else a
                              for a in graph.externals])
        metrics.fused["graphs run"] += 1
        metrics.fused["ops fused"] += len(graph.steps)
        metrics.fused["buffers donated"] += len(donate)
        with tensor.x64(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
            results = fn(*graph.externals)
        for value, array in zip(live, results):
            buffer = _holder(value)
            if buffer is not None:
                buffer.set(array, buffer.layout)

    def memory_analysis(self):
        """XLA's memory figures (arguments, outputs, aliased, temporaries) for the program of
        the last graph run, or None before the first: its peak device memory is
        ``argument + output - alias + temp`` bytes."""
        if self.last_run is None:
            return None
        fn, avals = self.last_run
        with tensor.x64():
            return fn.lower(*avals).compile().memory_analysis()


LAUNCHER = FusedLauncher()


def pending_ops() -> int:
    return LAUNCHER.pending_ops()


def memory_analysis():
    return LAUNCHER.memory_analysis()


def _dynamo_is_tracing() -> bool:
    return TracingContext.try_get() is not None


def _trace_once(program, dynamic) -> None:
    """Trace a program the first time it is recorded, so that a lowering's own checks
    (empty reductions, bad arguments) raise at the op, as in strict mode, not at the flush."""
    with tensor.x64():
        jax.eval_shape(program.pure, *map(abstract_value, dynamic))
    program.traced = True


def _materialized(value):
    """After a flush, the array that replaced a Deferred the op had already read from its buffer."""
    if type(value) is tensor.Deferred:
        return value.owner().value
    return value


def _holder(value):
    """The Buffer that still holds ``value``, or None if it was overwritten or freed."""
    owner = value.owner
    buffer = None if owner is None else owner()
    return buffer if buffer is not None and buffer.value is value else None


def _compose(steps, live):
    """One pure function running every recorded program in order; returns the live values."""

    def composed(*externals):
        metrics.fused["graphs compiled"] += 1  # runs only while jax traces, i.e. per compile
        metrics.compiles["fused graph"] += 1
        values = []
        for program, refs, positions, written_slots in steps:
            args = [None if r is None else (externals[r] if r >= 0 else values[~r]) for r in refs]
            outs, written = program(*args)
            values.extend(outs[p] for p in positions)
            values.extend(written[s] for s in written_slots)
        return [values[i] for i in live]

    return composed


def _donatable(externals, live) -> tuple:
    """Input arrays the graph may overwrite: unshared (the pending graph replaced their
    storages' values already), each matched to a result of its shape and dtype."""
    wanted = {}
    for value in live:
        aval = (value.shape, value.dtype)
        wanted[aval] = wanted.get(aval, 0) + 1
    donate = []
    for i in range(len(externals)):
        if type(externals[i]) in _NUMBERS:
            continue
        aval = (externals[i].shape, externals[i].dtype)
        if wanted.get(aval) and unshared(externals, i, owners=0):
            wanted[aval] -= 1
            donate.append(i)
    return tuple(donate)


# ---- what made us flush -------------------------------------------------------------

# Flushes that are never part of printing: no need to look at the stack.
_OWN_CAUSES = {"optimizer step", "synchronize", "size limit", "mode change"}
# Innermost torchtpu function on the stack -> the host sync it stands for.
_CAUSES = {
    "local_scalar_dense": "item",  # .item(), float(), int(), bool()
    "equal": "equal",
    "copy_": "cpu",  # .cpu(), .to("cpu"), .tolist(), .numpy() after .cpu()
    "to_copy": "cpu",
    "run_on_host": "cpu fallback",
    "synchronize": "synchronize",
}


def host_read_cause(given: str | None = None) -> str:
    """Name the host sync that is reading device data: printing, else ``given``, else from the stack."""
    frame = sys._getframe(1)
    named = None
    while frame is not None:
        code = frame.f_code
        if code.co_filename.endswith("_tensor_str.py"):
            return "print"
        if named is None and "torchtpu" in code.co_filename:
            named = _CAUSES.get(code.co_name)
        frame = frame.f_back
    return given or named or "host read"
