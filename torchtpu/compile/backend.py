"""The ``tpu`` Dynamo backend: AOTAutograd graphs, each compiled to one XLA program."""

from __future__ import annotations

import collections
import functools
import time
import warnings

import jax
import numpy as np
import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false

from .. import dtypes, tensor
from ..execution import graph
from ..ops.registry import LOWERINGS
from ..runtime import compile_cache, precision, rng, stats

# torchtpu's runtime, which Dynamo must not trace into: our kernels run in eager
# mode between graphs (the backward after a graph break, say), and their frames
# are ours, not the user's.  The demo, the CLI and the user-facing helpers
# (pallas.py's op wrappers, bucketing) stay traceable.
_RUNTIME_MODULES = ("torchtpu.backend", "torchtpu.device", "torchtpu.dtypes", "torchtpu.tensor", "torchtpu.modules",
                    "torchtpu.serialization", "torchtpu.execution", "torchtpu.ops", "torchtpu.runtime",
                    "torchtpu.compile", "jax", "jaxlib")


def _skip_our_frames() -> None:
    from torch._dynamo import trace_rules

    for module in _RUNTIME_MODULES:
        trace_rules.add(module)


_skip_our_frames()


@functools.cache
def _decompositions() -> dict:
    """PyTorch's decompositions for the ops the lowering table lacks, applied while tracing."""
    table = {}
    for op, decomposition in torch._decomp.decomposition_table.items():
        if op in LOWERINGS or not isinstance(op, torch._ops.OpOverload) or op.is_view:
            continue
        if getattr(decomposition, "__module__", "").startswith("torch._refs"):
            continue  # references lower to prims, which have no lowerings
        table[op] = decomposition
    return table


def _output_metas(gm):
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in output.args[0]]


def _signature(value):
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.dtype)
    return value


class CompiledGraph:
    """One AOTAutograd graph: a jitted program per input signature (shapes, dtypes, sizes).

    Inputs the graph overwrites (an optimizer's parameters and state) are
    updated in place after the call, and their old arrays are donated to the
    program when nothing else can see them, so memory does not double.
    """

    def __init__(self, gm: torch.fx.GraphModule, name: str):
        self.name = name
        self.gm = gm
        self.eager = False  # set when the graph cannot be traced: it then runs op by op
        self.fn = graph.to_jax_function(gm)
        self.mutated = graph.mutated_inputs(gm)
        self.out_metas = _output_metas(gm)
        self.programs = {}  # signature -> (compiled program, constant outputs)
        # Dynamo re-traces a frame when a static shape changes: the same code
        # comes back as a new graph, so recompiles are tracked by the code.
        self.code_key = (name, gm.code)

    def __call__(self, *args):
        if self.eager:
            return self.gm(*args)
        inputs = [_device_value(a) for a in args]
        donated = _donatable(inputs, self.mutated)
        signature = (tuple(_signature(a) for a in inputs), (f"precision={precision.current}", f"donate={donated}"))
        entry = self.programs.get(signature)
        arrays = [tensor.read(a) for a in inputs if isinstance(a, torch.Tensor)]
        seed, offset = rng.next_seed_and_offset()
        numbers = (np.int64(seed % (1 << 32)), np.int64(offset))
        if entry is None:
            try:
                entry = self.programs[signature] = self._compile(inputs, arrays, numbers, signature, donated)
            except _UNTRACEABLE as error:  # a data-dependent op, say: run this graph eagerly
                _fall_back(self.name, f"{type(error).__name__}: {str(error).splitlines()[0]}")
                self.eager = True
                return self.gm(*args)
        else:
            compile_cache.record_hit()
        program, constants = entry
        with tensor.x64():
            results, new_values = program(*arrays, *numbers)
        compile_cache.record_donations(len(donated))
        for position, array in zip(self.mutated, new_values):
            _write_back(args[position], inputs[position], array)
        results = iter(results)
        outputs = [next(results) if c is _ARRAY else c for c in constants]
        return [_wrap(o, meta) for o, meta in zip(outputs, self.out_metas)]

    def _compile(self, inputs, arrays, numbers, signature, donated):
        previous = _LAST_SIGNATURE.get(self.code_key)
        if previous is not None and compile_cache.log_recompiles():
            compile_cache.log.warning("torchtpu: recompiling the %s graph: %s", self.name,
                                      compile_cache.describe_change(previous, signature))
        _LAST_SIGNATURE[self.code_key] = signature
        statics = [None if isinstance(a, torch.Tensor) else a for a in inputs]
        constants = []

        def traced(*arrays_and_numbers):
            *arrays, seed, offset = arrays_and_numbers
            values = iter(arrays)
            outs, new_values = self.fn([next(values) if s is None else s for s in statics], seed, offset)
            constants[:] = [_ARRAY if isinstance(o, jax.Array) else o for o in outs]
            return [o for o in outs if isinstance(o, jax.Array)], new_values

        array_positions = [i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor)]
        donate = tuple(k for k, i in enumerate(array_positions) if i in donated)
        start = time.perf_counter()
        with tensor.x64():
            lowered = jax.jit(traced, donate_argnums=donate).lower(*arrays, *numbers)
            compile_cache.dump(f"{self.name}-graph", lowered)
            program = lowered.compile()
        compile_cache.record_miss(time.perf_counter() - start)
        stats.compiles[f"compiled graph {self.name}"] += 1
        return program, constants


def _write_back(original, on_device, array) -> None:
    """Store an overwritten input's new value, as the graph's ``copy_`` would have."""
    if original is on_device:
        tensor.write(original, array)
        torch.autograd.graph.increment_version(original)
    else:  # a CPU scalar, such as a non-capturable optimizer's step count: a host sync
        original.copy_(tensor.from_array(array, original.dtype))


def _donatable(inputs, mutated) -> tuple:
    """The overwritten inputs whose arrays only they can see: alone in their storage, viewing all of it."""
    storages = collections.Counter(a.untyped_storage()._cdata for a in inputs if isinstance(a, torch.Tensor))
    return tuple(
        i for i in mutated
        if storages[inputs[i].untyped_storage()._cdata] == 1 and tensor.holds_whole_buffer(inputs[i])
    )


_LAST_SIGNATURE: dict = {}  # (graph kind, graph code) -> the signature it last compiled for
_ARRAY = object()  # marks a graph output that the program returns as an array


def _device_value(value):
    if isinstance(value, torch.Tensor) and value.device.type != "tpu":
        if value.dim() == 0:  # a 0-dim CPU tensor may join a tpu program, as in eager
            return tensor.from_host(value)
        raise RuntimeError(f"torchtpu: a compiled tpu graph got an input on {value.device}")
    return value


def _wrap(value, meta):
    if not isinstance(meta, torch.Tensor) or not isinstance(value, jax.Array):
        return value
    stride = tuple(meta.stride()) if is_non_overlapping_and_dense_or_false(meta) else None
    return tensor.from_array(value, meta.dtype, stride)


_UNTRACEABLE = (graph.UnsupportedGraph, jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError,
                jax.errors.TracerIntegerConversionError, jax.errors.TracerArrayConversionError)


def _fall_back(kind, reason):
    compile_cache.graph_fallbacks[reason] += 1
    warnings.warn(f"torchtpu: {reason}; this {kind} graph runs op by op in eager mode instead")


def _compiler(kind):
    from functorch.compile import make_boxed_compiler

    @make_boxed_compiler
    def compile_graph(gm, example_inputs):
        try:
            return CompiledGraph(gm, kind)
        except graph.UnsupportedGraph as error:
            _fall_back(kind, str(error).removeprefix("torchtpu: "))
            return gm

    return compile_graph


def tpu_backend(gm, example_inputs, **kwargs):
    """The Dynamo backend: ``torch.compile(model, backend="tpu")``."""
    from torch._dynamo.backends.common import aot_autograd

    backend = aot_autograd(
        fw_compiler=_compiler("forward"),
        bw_compiler=_compiler("backward"),
        inference_compiler=_compiler("inference"),
        decompositions=_decompositions(),
        keep_inference_input_mutations=True,  # the graph updates its inputs itself (CompiledGraph)
    )
    return backend(gm, example_inputs, **kwargs)
