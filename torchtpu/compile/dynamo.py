"""The ``tpu`` Dynamo backend: AOTAutograd graphs, each compiled to one XLA program."""

from __future__ import annotations

import collections
import functools
import hashlib
import pathlib
import pkgutil
import time
import warnings
from typing import NamedTuple

import jax
import numpy as np
import torch
from torch._inductor.output_code import OutputCode
from torch._prims_common import is_non_overlapping_and_dense_or_false

from ..core import dtypes, tensor
from ..core.program import Program, abstract_value, unshared
from ..graph import fx
from ..ops import decompositions
from ..runtime import caches, compile_cache, context, metrics, precision, rng


# What Dynamo may trace into: user-level programs (tools, integrations), the helpers of
# torch.tpu that compiled user code calls (pallas's op wrappers, bucketing), and the
# device check torchtpu puts in front of PyTorch's flex attention, and the TorchTitan functions
# torchtpu replaces (TorchTitan compiles its blocks), which Dynamo traces.
TRACEABLE = ("tools", "integrations", "api.pallas", "api.bucketing", "dispatch.patches.flex_attention",
             "dispatch.patches.torchtitan_kernels")


def runtime_modules() -> list[str]:
    """torchtpu's runtime, which Dynamo must not trace into: our kernels run in eager
    mode between graphs (the backward after a graph break, say), and their frames
    are ours, not the user's.  That is every module and package of torchtpu but
    ``TRACEABLE``, found from the package's files (importing ``api`` here would
    reach above this layer); a package holding a traceable module is listed
    module by module."""
    root = pathlib.Path(__file__).resolve().parent.parent
    names = []

    def walk(package: str) -> None:
        for module in pkgutil.iter_modules([str(root.joinpath(*package.split(".")))]):
            name = f"{package}.{module.name}".lstrip(".")
            if name in TRACEABLE or module.name.startswith("_"):
                continue
            if any(traceable.startswith(name + ".") for traceable in TRACEABLE):
                walk(name)
            else:
                names.append(f"torchtpu.{name}")

    walk("")
    return names + ["jax", "jaxlib"]


def _skip_our_frames() -> None:
    from torch._dynamo import trace_rules

    for module in runtime_modules():
        trace_rules.add(module)


_skip_our_frames()


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
        # Op by op instead: a graph of views only (no program needed), or one that cannot be traced.
        self.eager = fx.only_views(gm)
        # Collectives (torch.ops._c10d_functional.*): the graph is one SPMD program over the
        # processes of its groups, planned by the handler distributed/ registers (graph/spmd.py).
        self.spmd = fx.spmd_plan(gm)
        self.fn = fx.to_jax_function(gm, self.spmd)
        self.mutated = fx.mutated_inputs(gm)
        self.out_metas = _output_metas(gm)
        self.out_strides = [_stride(m) if isinstance(m, torch.Tensor) else None for m in self.out_metas]  # once: slow
        self.programs = caches.BoundedCache("compiled graph programs", 64)  # signature -> (executable, constants)
        self.recorded = caches.BoundedCache("compiled graphs in fused graphs", 64)  # reads -> Program
        # Integer inputs (sizes Dynamo made symbolic, such as a cache position) are passed
        # to the program at run time, so a new value does not compile a new program; if
        # tracing needs one as a constant (a shape), they become constants instead.
        self.runtime_ints = not any(isinstance(m, (int, torch.SymInt)) for m in self.out_metas)
        # With dynamic shapes the graph also takes its tensors' sizes as integers: constants from the start.
        self.size_inputs = fx.tensor_size_inputs(gm)
        # Dynamo re-traces a frame when a static shape changes: the same code
        # comes back as a new graph, so recompiles are tracked by the code.
        self.code_key = (name, gm.code)
        metrics.tell("graph", (name, gm))  # torchtpu tune analyze reads its matrix products

    def __call__(self, *args):
        if self.eager:
            return self.gm(*args)
        inputs = [_device_value(a, self.name) for a in args]
        launcher = context.current().launcher
        if launcher.defers and self._record_safe(args, inputs):
            return self._record(launcher, args, inputs)
        if launcher.defers and self._spans_processes:  # the pending fused graph first; this one runs now
            context.current().flush("compiled graph with collectives")
        arrays = [tensor.read(a) for a in inputs if isinstance(a, torch.Tensor)]
        donated = self._donatable(inputs, arrays)
        runtime = [self._runtime(i, a) for i, a in enumerate(inputs)]
        signature = (tuple("int" if r else _signature(a) for r, a in zip(runtime, inputs)),
                     (f"precision={precision.current()}", f"donate={donated}"))
        entry = self.programs.get(signature)
        seed, offset = rng.next_seed_and_offset()
        numbers = [a for r, a in zip(runtime, inputs) if r] + [np.int64(seed), np.int64(offset)]
        if entry is None:
            retry = any(runtime)  # an integer may be used as a size: then as constants
            try:
                entry = self.programs[signature] = self._compile(inputs, arrays, numbers, signature, donated)
            except Exception as error:
                if not (retry or isinstance(error, _UNTRACEABLE)):
                    raise
                reason = f"{type(error).__name__}: {str(error).splitlines()[0]}"
            if entry is None:  # out of the except block, whose traceback holds the arrays the retry may donate
                del arrays
                if retry:
                    self.runtime_ints = False
                    return self(*args)
                _fall_back(self.name, reason)  # a data-dependent op, say: run this graph eagerly
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
        return [_wrap(o, meta, stride) for o, meta, stride in zip(outputs, self.out_metas, self.out_strides)]

    @property
    def _spans_processes(self) -> bool:
        return self.spmd is not None and self.spmd.spans_processes

    def _runtime(self, position, value) -> bool:
        return self.runtime_ints and type(value) is int and position not in self.size_inputs

    def _donatable(self, inputs, arrays) -> tuple:
        """The overwritten inputs whose arrays nothing else can see: alone in their storage,
        viewing all of it, and held by nothing but that storage (the donation policy)."""
        storages = collections.Counter(a.untyped_storage()._cdata for a in inputs if isinstance(a, torch.Tensor))
        array_position = {i: k for k, i in enumerate(i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor))}
        return tuple(
            i for i in self.mutated
            if storages[inputs[i].untyped_storage()._cdata] == 1 and tensor.holds_whole_buffer(inputs[i])
            and unshared(arrays, array_position[i], owners=1)
        )

    def _compile(self, inputs, arrays, numbers, signature, donated):
        compile_cache.log_recompile(self.name, _LAST_SIGNATURE.get(self.code_key), signature,
                                    retraced=not self.programs)
        _LAST_SIGNATURE[self.code_key] = signature
        runtime = [self._runtime(i, a) for i, a in enumerate(inputs)]
        statics = [None if isinstance(a, torch.Tensor) or r else a for r, a in zip(runtime, inputs)]
        order = [i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor)]
        order += [i for i, r in enumerate(runtime) if r]  # the order the program takes them
        constants = []

        def traced(*arrays_and_numbers):
            *dynamic, seed, offset = arrays_and_numbers
            values = list(statics)
            for i, value in zip(order, dynamic):
                values[i] = value
            outs, new_values = self.fn(values, seed, offset)
            constants[:] = [_ARRAY if isinstance(o, jax.Array) else o for o in outs]
            return [o for o in outs if isinstance(o, jax.Array)], new_values

        donate = tuple(k for k, i in enumerate(order) if i in donated)
        start = time.perf_counter()
        with tensor.x64():
            if self._spans_processes:  # one SPMD program: every process of the mesh runs it
                sharded, count = self.spmd.shard(traced, arrays, numbers, f"{self.name} graph {signature}"), len(arrays)
                lowered = jax.jit(sharded, donate_argnums=donate).lower(*sharded.to_global(arrays), *numbers)
            else:
                lowered = jax.jit(traced, donate_argnums=donate).lower(*arrays, *numbers)
            compile_cache.dump(f"{self.name}-graph", lowered)  # before compiling: a crash still leaves it
            program = lowered.compile()
        compile_cache.compiled(self.name, lowered, program, time.perf_counter() - start)
        if self._spans_processes:
            executable = program

            def program(*dynamic):
                return sharded.to_local(executable(*sharded.to_global(dynamic[:count]), *dynamic[count:]))
        metrics.compiles[f"compiled graph {self.name}"] += 1
        return program, constants

    # ---- fused eager: the graph joins the pending graph ----------------------------

    def _record_safe(self, args, inputs) -> bool:
        """Whether the call can be deferred: every input it overwrites is a tpu tensor
        with a storage of its own among the inputs (a CPU step count is a host write),
        and the graph has no collectives.  A graph with collectives is a program every
        process of its mesh must launch together, at the same point of their streams of
        work; it runs when called, after the pending fused graph (which keeps fusing
        the work around it), instead of joining it."""
        if self._spans_processes:  # an SPMD program runs now, in step with the other processes
            return False
        storages = collections.Counter(a.untyped_storage()._cdata for a in inputs if isinstance(a, torch.Tensor))
        return all(args[i] is inputs[i] and storages[inputs[i].untyped_storage()._cdata] == 1 for i in self.mutated)

    def _record(self, launcher, args, inputs):
        """Append this graph to the pending fused graph, so that the forward, the backward
        and the optimizer's graphs of a training step run as one program at the next sync."""
        buffers, slots, reads = [], {}, []
        for value in inputs:
            if not isinstance(value, torch.Tensor):
                reads.append(value)
                continue
            buffer = tensor.buffer_of(value)
            slot = slots.setdefault(id(buffer), len(buffers))
            if slot == len(buffers):
                buffers.append(buffer)
            reads.append(_Read(slot, buffer.layout, tensor.layout_of(value), dtypes.to_jax(value.dtype),
                               value.untyped_storage().nbytes(), buffer.storage_dtype))
        dynamic = [b.value for b in buffers] + list(rng.next_seed_and_offset())
        key = (tuple(reads), precision.current())
        entry = self.recorded.get(key)
        if entry is None:
            try:
                entry = self.recorded[key] = _recorded_program(self, reads, dynamic)
            except _UNTRACEABLE as error:
                _fall_back(self.name, f"{type(error).__name__}: {str(error).splitlines()[0]}")
                self.eager = True
                return self.gm(*args)
        program, constants = entry
        outs, written = launcher.launch(program, dynamic)
        for slot, value in written.items():
            buffers[slot].set(value, program.written_layouts[slot])
        for position in self.mutated:
            torch.autograd.graph.increment_version(args[position])
        outs = iter(outs)
        return [_wrap(next(outs), meta, stride) if c is _ARRAY else c
                for c, meta, stride in zip(constants, self.out_metas, self.out_strides)]


class _Read(NamedTuple):
    """How a recorded graph reads one tensor input from its storage's value."""

    slot: int
    storage_layout: tuple
    layout: tuple
    dtype: object
    nbytes: int
    storage_dtype: object


def _recorded_program(compiled: CompiledGraph, reads, dynamic):
    """A compiled graph as one step of the fused graph: a Program that reads its inputs
    through their views and writes the inputs it overwrites back into their storages,
    inside the program; and the graph's constant outputs."""
    writes = {reads[i].slot: reads[i] for i in compiled.mutated}
    constants = []

    def pure(*dynamic):
        *storages, seed, offset = dynamic
        values = [tensor.view_of(storages[r.slot], r.storage_layout, r.layout, r.dtype, r.nbytes)
                  if isinstance(r, _Read) else r for r in reads]
        outs, new_values = compiled.fn(values, seed, offset)
        constants[:] = [_ARRAY if isinstance(o, jax.Array) else o for o in outs]
        written = {
            r.slot: tensor.with_view_written(storages[r.slot], r.storage_layout, r.layout, new, r.nbytes)
            for r, new in zip(writes.values(), new_values)
        }
        return [o for o in outs if isinstance(o, jax.Array)], written

    with tensor.x64():
        arrays, _ = jax.eval_shape(pure, *map(abstract_value, dynamic))
    metas = [m for c, m in zip(constants, compiled.out_metas) if c is _ARRAY]
    out_metas = [(a.shape, _stride(m), m.dtype) for a, m in zip(arrays, metas)]
    written_layouts, written_dtypes = {}, {}
    for slot, r in writes.items():
        layout, dtype = tensor.written_layout(r.storage_dtype, r.storage_layout, r.layout, r.dtype, r.nbytes)
        written_layouts[slot], written_dtypes[slot] = layout, dtype
    return Program(f"compiled {compiled.name} graph", pure, out_metas, written_layouts, written_dtypes), constants


def _write_back(original, on_device, array) -> None:
    """Store an overwritten input's new value, as the graph's ``copy_`` would have."""
    if original is on_device:
        tensor.write(original, array)
        torch.autograd.graph.increment_version(original)
    else:  # a CPU scalar, such as a non-capturable optimizer's step count: a host sync
        original.copy_(tensor.from_array(array, original.dtype))


_LAST_SIGNATURE: dict = {}  # (graph kind, graph code) -> the signature it last compiled for
_ARRAY = object()  # marks a graph output that the program returns as an array


def _device_value(value, name):
    """A graph input on the device: a 0-dim CPU tensor may join a tpu program, as in eager."""
    if isinstance(value, torch.Tensor):
        return tensor.device_operand(value, f"the compiled {name} graph")
    return value


def _stride(meta):
    """The stride an output gets: the graph's own when it is dense and known, else contiguous
    (with dynamic shapes the graph's strides are symbolic)."""
    stride = tuple(meta.stride())
    if all(type(s) is int for s in stride) and is_non_overlapping_and_dense_or_false(meta):
        return stride
    return None


def _wrap(value, meta, stride):
    if not isinstance(meta, torch.Tensor) or not isinstance(value, (jax.Array, tensor.Deferred)):
        return value
    return tensor.from_array(value, meta.dtype, stride)


_UNTRACEABLE = (fx.UnsupportedGraph, jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError,
                jax.errors.TracerIntegerConversionError, jax.errors.TracerArrayConversionError)


def _fall_back(kind, reason):
    metrics.count(metrics.graph_fallbacks, reason)
    warnings.warn(f"torchtpu: {reason}; this {kind} graph runs op by op in eager mode instead")


# The node metadata a cached graph keeps: the values' shapes and dtypes, and where in the
# user's code each node came from (``torchtpu tune analyze`` reports it).
_PICKLED_META = ("val", "stack_trace")


class GraphCode(OutputCode):
    """One AOTAutograd graph as AOTAutograd's cache stores it: the graph itself (pickled with
    ``GraphPickler``), turned into a :class:`CompiledGraph` when first called.  A new process
    that finds the entry skips Dynamo's graph going through AOTAutograd (its functionalization,
    decomposition and partitioning: seconds for a training step); XLA's programs come from
    XLA's own disk cache (``TORCHTPU_CACHE_DIR``) or are compiled again."""

    def __init__(self, gm: torch.fx.GraphModule, kind: str, graph=None):
        self.gm, self.kind = gm, kind
        self._graph = graph  # CompiledGraph, or the graph module itself where it runs op by op
        # Called with the list of inputs.  An instance attribute: torch._dynamo.disable, which
        # wraps the backward, copies the instance's __dict__ onto its wrapper.
        self._boxed_call = True

    def __call__(self, args):
        if self._graph is None:
            self._graph = _compiled_graph(self.gm, self.kind)
        return self._graph(*args)

    def __copy__(self):  # the cache copies an entry before saving it: no pickling round trip
        return GraphCode(self.gm, self.kind, self._graph)

    def prepare_for_serialization(self) -> None:
        self._graph = None

    def post_compile(self, example_inputs, constants, graph_kwargs) -> None:
        pass

    def __getstate__(self):
        from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache
        from torch.fx._graph_pickler import GraphPickler, Options

        nodes = list(self.gm.graph.nodes)
        metas = [node.meta for node in nodes]
        try:  # with only the metadata torchtpu reads: the rest (provenance, module stacks) took seconds
            for node, meta in zip(nodes, metas):
                node.meta = {key: meta[key] for key in _PICKLED_META if key in meta}
            graph = GraphPickler.dumps(self.gm, Options(ops_filter=None))
        except Exception as error:  # an opaque Python object in the graph (a Pallas kernel, say)
            raise BypassAOTAutogradCache(f"torchtpu: the {self.kind} graph cannot be pickled: {error}") from error
        finally:
            for node, meta in zip(nodes, metas):
                node.meta = meta
        return {"gm": graph, "kind": self.kind}

    def __setstate__(self, state):
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx._graph_pickler import GraphPickler
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        # A shape environment for the symbolic sizes of a dynamic graph (vLLM's steps, say)
        gm = GraphPickler.loads(state["gm"], FakeTensorMode(shape_env=ShapeEnv()))
        gm.recompile()  # its forward, which a graph run op by op calls
        self.__init__(gm, state["kind"])


def _compiled_graph(gm, kind):
    """A graph's CompiledGraph, or the graph module itself (op by op) where it cannot be one."""
    try:
        return CompiledGraph(gm, kind)
    except fx.UnsupportedGraph as error:
        _fall_back(kind, str(error).removeprefix("torchtpu: "))
        return gm


def _compiler(kind, cached: bool):
    """The compiler of one kind of AOTAutograd graph; ``cached``: one AOTAutograd's cache can store."""
    from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler

    def compile_graph(gm, example_inputs):
        return GraphCode(gm, kind, _compiled_graph(gm, kind))

    return SerializableAOTDispatchCompiler(GraphCode, compile_graph) if cached else compile_graph


@functools.cache
def _sources_digest() -> str:
    """A digest of torchtpu's sources, which decide how graphs are traced (custom ops, autograd kernels)."""
    digest = hashlib.sha256()
    root = pathlib.Path(__file__).resolve().parent.parent
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _cache_tag(table: dict) -> str:
    """What AOTAutograd's cache key must add for torchtpu's graphs: its sources and the
    decompositions they are traced with (to the user's own tag, if any)."""
    ops = hashlib.sha256(" ".join(sorted(map(str, table))).encode()).hexdigest()[:16]
    return "/".join(t for t in (torch.compiler.config.cache_key_tag, f"torchtpu-{_sources_digest()}-{ops}") if t)


def tpu_backend(gm, example_inputs, **kwargs):
    """The Dynamo backend: ``torch.compile(model, backend="tpu")``.

    With torchtpu's disk cache on (``TORCHTPU_CACHE_DIR``), AOTAutograd's own disk cache serves
    it too, as it serves inductor (switched off the same way: ``TORCHINDUCTOR_AUTOGRAD_CACHE=0``),
    each entry bundling its graphs (:class:`GraphCode`), with torchtpu's sources in the key.
    Only then: storing a training step's graphs costs its first process seconds."""
    from torch._dynamo.backends.common import aot_autograd

    cached = compile_cache.disk_cache_dir() is not None
    table = decompositions.for_graphs()
    backend = aot_autograd(
        fw_compiler=_compiler("forward", cached),
        bw_compiler=_compiler("backward", cached),
        inference_compiler=_compiler("inference", cached),
        decompositions=table,
        keep_inference_input_mutations=True,  # the graph updates its inputs itself (CompiledGraph)
    )
    if not cached:
        return backend(gm, example_inputs, **kwargs)
    # The backward's graph is made with the forward's (not at the first backward, outside this
    # context), so that the entry is saved here, bundled.
    with torch._functorch.config.patch(bundled_autograd_cache=True, force_non_lazy_backward_lowering=True), \
            torch.compiler.config.patch(cache_key_tag=_cache_tag(table)):
        return backend(gm, example_inputs, **kwargs)
