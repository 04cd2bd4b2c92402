"""Collectives inside compiled graphs: ``torch.compile(backend="tpu")`` with functional collectives.

Dynamo and AOTAutograd leave the functional collectives
(``torch.ops._c10d_functional.all_reduce``, ``all_gather_into_tensor``,
``reduce_scatter_tensor``, ``all_to_all_single``, ``broadcast``, their
``_coalesced`` forms, ``wait_tensor``; ``_c10d_functional_autograd.*``; DTensor's
``_dtensor.shard_dim_alltoall``) as nodes of the graph.  ``register()``
makes this module the handler of those namespaces in ``graph/spmd.py``, so
such a graph compiles to ONE XLA program with its collectives inside:

- The graph's groups (names resolved by c10d) give a mesh.  Each group must
  be the ranks ``first + i * stride`` in group-rank order, as the groups of a
  ``DeviceMesh``'s dims are; the strides and sizes of all of them cut the
  ranks into mesh axes (a 2x2 DeviceMesh's rows and columns are two axes),
  and each group's collectives run over its axes.  The mesh spans the ranks
  reachable from this one along those axes, so a graph that only uses the TP
  groups of a 2x2 mesh is one program over each TP pair.
- The graph's jax function (``graph/fx.py``) runs inside a ``jax.shard_map``
  over that mesh: every array is one process's block of a global array along
  dim 0 (``PartitionSpec(all axes)``), numbers (sizes, the RNG seed) are
  replicated, and every output is again this process's block.
- The collective nodes lower to the bodies of ``collectives.py`` with their
  group's axes; ``wait_tensor`` is the identity (XLA orders the program).

Before the first compile of each program, the processes of the mesh compare
what they are about to compile through the c10d store: a rank that compiles
another graph, other shapes, or never arrives raises a clear error instead of
hanging in XLA.  Numbers an op takes as an operand may differ: a shard's own
index range (``ids >= 64`` on rank 1 where rank 0 has ``ids >= 0``, as vLLM's
vocabulary-parallel embedding bakes in) becomes an input of the one program,
each process's block holding its own value.

What falls back (the graph runs op by op, counted in
``torch.tpu.metrics()["graph_fallbacks"]`` with the reason): groups that are
not strided rank ranges, groups whose strides do not nest into mesh axes,
point-to-point ops (``isend``, ``irecv``, ``batch_p2p_ops``),
``all_to_all_single`` with unequal or symbolic splits, and the out= and
in-place forms.  (AOTAutograd rejects the in-place forms, ``all_reduce_``
and ``broadcast_``, before any backend sees the graph: it cannot
functionalize a custom op whose output aliases an input.)
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json

import jax
import numpy as np
import torch
import torch.distributed as dist
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ..graph import fx, spmd
from . import collectives, runtime

NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd", "_dtensor")
_UNIT_AXIS = "one"  # a size-1 axis for groups of one rank


def register() -> None:
    """Lower the functional collectives in compiled graphs (idempotent; no JAX work)."""
    for namespace in NAMESPACES:
        spmd.register(namespace, HANDLER)


def registered() -> bool:
    """Whether ``register()`` ran (``distributed.register()`` calls it)."""
    return spmd.handler_of(torch.ops._c10d_functional.wait_tensor.default) is HANDLER


# ---- the mesh of a graph's groups ---------------------------------------------------------------


class GraphMesh:
    """The mesh of a set of groups around this rank: named axes, major (largest stride) first.

    ``ranks`` lists the mesh's ranks in row-major order of the axes (the order
    of the global arrays' blocks); ``axes_of[group]`` names the axes a group's
    collectives run over, major first, so that the index along them is the
    group rank.
    """

    def __init__(self, groups: tuple[tuple[int, ...], ...], rank: int):
        intervals, unit, spanning = [], False, [g for g in groups if len(g) > 1]
        # Coordinates count from rank 0, as a DeviceMesh lays its ranks out; a graph with one
        # group (any new_group of strided ranks) is a mesh of that group alone.
        origin = spanning[0][0] if len(spanning) == 1 else 0
        for ranks in groups:
            if len(ranks) == 1:
                unit = True
                continue
            stride = ranks[1] - ranks[0]
            if stride <= 0 or list(ranks) != [ranks[0] + i * stride for i in range(len(ranks))]:
                raise fx.UnsupportedGraph(
                    f"torchtpu: the group of ranks {list(ranks)} is not a strided rank range in group-rank order "
                    f"(as a DeviceMesh dim's group is), so it is no mesh axis")
            intervals.append((stride, stride * len(ranks)))
        bounds = sorted({b for interval in intervals for b in interval})
        axes = []  # (stride, size), minor first
        for low, high in zip(bounds, bounds[1:]):
            if any(lo <= low and high <= hi for lo, hi in intervals):
                if high % low:
                    raise fx.UnsupportedGraph(f"torchtpu: groups {[list(g) for g in groups]} do not nest into "
                                              f"mesh axes (strides {low} and {high})")
                if axes and low % (axes[-1][0] * axes[-1][1]):
                    raise fx.UnsupportedGraph(f"torchtpu: groups {[list(g) for g in groups]} do not nest into "
                                              f"mesh axes")
                axes.append((low, high // low))
        self.axes = [(f"stride{s}", s, n) for s, n in reversed(axes)]  # major first
        if unit or not self.axes:
            self.axes.append((_UNIT_AXIS, 1, 1))
        self.names = tuple(name for name, _, _ in self.axes)
        base = rank - sum((((rank - origin) // s) % n) * s for _, s, n in self.axes)
        coords = np.indices([n for _, _, n in self.axes]).reshape(len(self.axes), -1).T
        self.ranks = tuple(int(base + sum(int(c) * s for c, (_, s, _) in zip(row, self.axes))) for row in coords)
        self.axes_of = {}
        for ranks in groups:
            if len(ranks) == 1:
                self.axes_of[ranks] = (_UNIT_AXIS,)
                continue
            stride, end = ranks[1] - ranks[0], (ranks[1] - ranks[0]) * len(ranks)
            names = tuple(name for name, s, n in self.axes if stride <= s and s * n <= end)
            first = rank - sum((((rank - origin) // s) % n) * s for name, s, n in self.axes if name in names)
            if rank not in ranks or first != ranks[0]:
                raise fx.UnsupportedGraph(f"torchtpu: this rank ({rank}) is not where group {list(ranks)} "
                                          f"places it on the mesh")
            self.axes_of[ranks] = names
        self.size = len(self.ranks)
        self._jax = None

    @property
    def jax_mesh(self) -> Mesh:
        """The jax mesh (made at first use: it needs JAX's backend)."""
        if self._jax is None:
            devices = runtime.GroupMesh(self.ranks).mesh.devices.reshape([n for _, _, n in self.axes])
            self._jax = Mesh(devices, self.names)
        return self._jax

    def describe(self) -> str:
        return "x".join(f"{name}={n}" for name, _, n in self.axes) + f" over ranks {list(self.ranks)}"


@functools.lru_cache(maxsize=64)
def _graph_mesh(groups, rank) -> GraphMesh:
    return GraphMesh(groups, rank)


# ---- a graph's plan ----------------------------------------------------------------------------


def _argument(node: torch.fx.Node, name: str):
    """A node's argument by schema name, from its args or kwargs."""
    names = [a.name for a in node.target._schema.arguments]
    index = names.index(name)
    return node.args[index] if index < len(node.args) else node.kwargs.get(name)


def _group_ranks(group) -> tuple[int, ...]:
    """The global ranks of a graph's group (a c10d group name), in group-rank order."""
    try:
        pg = group if isinstance(group, dist.ProcessGroup) else dist.distributed_c10d._resolve_process_group(group)
        return tuple(dist.get_process_group_ranks(pg))
    except Exception as error:  # noqa: BLE001 (c10d raises ValueError, KeyError or RuntimeError)
        raise fx.UnsupportedGraph(f"torchtpu: the graph's group {group!r} is no process group of this process: "
                                  f"{error}") from error


def _op_name(op) -> str:
    return op._schema.name.split("::")[1]


class GraphPlan:
    """The plan of one graph's collectives (a ``graph.spmd.Plan``)."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.node_groups = {}  # node -> group ranks
        names = {}  # group name -> group ranks
        unsupported = set()
        for node in gm.graph.nodes:
            if node.op != "call_function" or spmd.handler_of(node.target) is not HANDLER:
                continue
            op = node.target
            name = _op_name(op)
            if name not in _LOWERINGS or op._overloadname != "default":
                unsupported.add(str(op))
                continue
            if name in _LOCAL:
                continue
            group = _argument(node, "group_name")
            self.node_groups[node] = _group_ranks(group)
            if isinstance(group, str):
                names[group] = self.node_groups[node]
            problem = _check(node, name, len(self.node_groups[node]))
            if problem:
                unsupported.add(f"{op} ({problem})")
        if unsupported:
            raise fx.UnsupportedGraph("torchtpu: no lowering in a compiled graph for " + ", ".join(sorted(unsupported)))
        self.spans_processes = bool(self.node_groups)
        self.mesh = None
        if self.spans_processes and runtime.world() is None:
            raise fx.UnsupportedGraph("torchtpu: the graph's collectives need JAX's multi-process runtime, which "
                                      "init_process_group('tpu') (or 'cpu:gloo,tpu:tpu') starts")
        if self.spans_processes:
            groups = tuple(sorted(set(self.node_groups.values())))
            self.mesh = _graph_mesh(groups, dist.get_rank())
        self.code = _fingerprint(gm, {name: self.mesh.axes_of[ranks] for name, ranks in names.items()})
        self.numbers = [(node, name, value) for node in gm.graph.nodes for name, value in _operands(node).items()]
        self.varying = {}  # node -> {argument: index in rank_values}: its operands that differ between processes
        self.rank_values = []  # this process's values of those numbers
        self._traced_rank_values = None  # their traced values while the program is traced

    # -- lowering

    def arguments(self, node):
        """The node's ``(args, kwargs)`` in the program: a number that differs between the processes
        (a shard's own vocabulary range, say) is this process's value, passed in at run time."""
        replace = self.varying.get(node)
        if not replace or self._traced_rank_values is None:
            return node.args, node.kwargs
        return _with_operands(node, {name: self._traced_rank_values[i] for name, i in replace.items()})

    @contextlib.contextmanager
    def tracing(self, rank_values):
        self._traced_rank_values = rank_values
        try:
            yield
        finally:
            self._traced_rank_values = None

    def lower(self, node, args, kwargs):
        name = _op_name(node.target)
        if name in _LOCAL:
            return _LOWERINGS[name](None, *args, **kwargs)
        axes = self.mesh.axes_of[self.node_groups[node]]
        return _LOWERINGS[name](axes if len(axes) > 1 else axes[0], *args, **kwargs)

    # -- the SPMD program

    def shard(self, fn, arrays, numbers, label):
        mine = [value for _, _, value in self.numbers]
        every = _agree(self.mesh, f"{label} code={self.code} mesh={self.mesh.describe()}", mine)
        self.varying, self.rank_values = {}, []
        for i, (node, name, value) in enumerate(self.numbers):
            if any(json.dumps(theirs[i]) != json.dumps(value) for theirs in every):
                self.varying.setdefault(node, {})[name] = len(self.rank_values)
                self.rank_values.append(value)
        return Sharded(self.mesh, fn, arrays, numbers, self)


class Sharded:
    """A graph's function as a ``shard_map`` over the mesh, and the conversions around it."""

    def __init__(self, mesh: GraphMesh, fn, arrays, numbers, plan: GraphPlan):
        self.mesh = mesh
        self.spec = PartitionSpec(mesh.names)
        self.sharding = NamedSharding(mesh.jax_mesh, self.spec)
        self.device = mesh.jax_mesh.devices.flat[mesh.ranks.index(dist.get_rank())]
        shapes = [tuple(a.shape) for a in arrays]
        self.scalar_outputs = []  # per output leaf: 0-dim (it travels as (1,))

        # The numbers that differ between processes travel as arrays: one block of one value per process.
        self.rank_values = [np.asarray([v], np.int64 if isinstance(v, int) else np.float64) for v in plan.rank_values]
        self._global_rank_values = None
        arrays_in = len(shapes) + len(self.rank_values)

        def body(*values):
            blocks = [b.reshape(shape) for b, shape in zip(values, shapes)]
            with plan.tracing([v.reshape(()) for v in values[len(shapes):arrays_in]]):
                results = fn(*blocks, *values[arrays_in:])
            leaves, tree = jax.tree.flatten(results)
            self.scalar_outputs = [leaf.ndim == 0 for leaf in leaves]
            return jax.tree.unflatten(tree, [leaf.reshape(1) if leaf.ndim == 0 else leaf for leaf in leaves])

        in_specs = (self.spec,) * arrays_in + (PartitionSpec(),) * len(numbers)
        self.fn = jax.shard_map(body, mesh=mesh.jax_mesh, in_specs=in_specs, out_specs=self.spec, check_vma=False)

    def __call__(self, *values):
        return self.fn(*values)

    def to_global(self, arrays) -> list:
        runtime.wait_for_inputs(arrays)  # collectives in issue order on every rank (see runtime.run)
        if self._global_rank_values is None:
            self._global_rank_values = [self._globalize(jax.device_put(v, self.device)) for v in self.rank_values]
        return [self._globalize(a) for a in arrays] + self._global_rank_values

    def _globalize(self, local):
        if local.ndim == 0:
            local = local.reshape(1)
        shape = (self.mesh.size * local.shape[0], *local.shape[1:])
        try:
            return jax.make_array_from_single_device_arrays(shape, self.sharding, [local])
        except ValueError:  # the block lives on another local device: move it once
            return jax.make_array_from_single_device_arrays(shape, self.sharding, [jax.device_put(local, self.device)])

    def to_local(self, results):
        leaves, tree = jax.tree.flatten(results)
        blocks = [leaf.addressable_data(0) for leaf in leaves]
        blocks = [b.reshape(()) if scalar else b for b, scalar in zip(blocks, self.scalar_outputs)]
        return jax.tree.unflatten(tree, blocks)


class _Handler:
    """The ``graph.spmd.Handler`` of the functional collectives."""

    def plan(self, gm):
        return GraphPlan(gm)


HANDLER = _Handler()


# ---- agreeing on what to compile ---------------------------------------------------------------

_sequence: dict = {}  # mesh ranks -> SPMD programs this process compiled over them


def _agree(mesh: GraphMesh, mine: str, numbers: list) -> list[list]:
    """Every process of the mesh is about to compile the same program: checked through the
    c10d store (the store's timeout bounds the wait), so a mismatch is an error, not a hang.
    Returns every process's ``numbers`` (its graph's operands, ``_operands``), in mesh order."""
    if mesh.size == 1:
        return [numbers]
    _sequence[mesh.ranks] = count = _sequence.get(mesh.ranks, 0) + 1
    prefix = f"torchtpu/compiled_graph/{'-'.join(map(str, mesh.ranks))}/{count}"
    store = dist.distributed_c10d._get_default_store()
    rank = dist.get_rank()
    store.set(f"{prefix}/{rank}", json.dumps([mine, numbers]))
    keys = [f"{prefix}/{r}" for r in mesh.ranks]
    try:
        store.wait(keys)
    except Exception as error:  # noqa: BLE001 (a timeout, or the store's host is gone)
        absent = [r for r, k in zip(mesh.ranks, keys) if not store.check([k])]
        raise RuntimeError(f"torchtpu: rank(s) {absent} did not reach the compile of the SPMD program #{count} over "
                           f"ranks {list(mesh.ranks)} ({mine}) within the store's timeout: {error}") from error
    every = []
    for r, key in zip(mesh.ranks, keys):
        theirs, their_numbers = json.loads(store.get(key).decode())
        every.append(their_numbers)
        if theirs != mine:
            raise RuntimeError(
                f"torchtpu: ranks compile different programs over ranks {list(mesh.ranks)} (program #{count}): "
                f"rank {rank} has {mine}; rank {r} has {theirs}. Every rank of a group must run the same "
                f"compiled graphs with the same shapes, in the same order")
    return every


def _operands(node: torch.fx.Node) -> dict[str, int | float]:
    """The numbers an op node takes as operands (a ``Tensor``, ``Scalar`` or ``float`` argument: the
    bound in ``ids >= 64``, a scale), by argument name. Numbers that are sizes, dims or indices are
    not operands: a rank whose graph has others runs a program of another shape."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return {}
    found = {}
    for i, argument in enumerate(node.target._schema.arguments):
        value = node.args[i] if i < len(node.args) else node.kwargs.get(argument.name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) \
                and str(argument.type).rstrip("?") in ("Tensor", "number", "float"):
            found[argument.name] = value
    return found


def _with_operands(node: torch.fx.Node, values: dict[str, object]):
    """The node's ``(args, kwargs)`` with the operands named in ``values`` replaced."""
    names = [a.name for a in node.target._schema.arguments]
    args = tuple(values.get(names[i], a) for i, a in enumerate(node.args))
    return args, {name: values.get(name, a) for name, a in node.kwargs.items()}


def _fingerprint(gm, axes_of_name) -> str:
    """The graph as the processes of its mesh must agree on it: its nodes, with each group
    named by its mesh axes (ranks on different rows of a mesh name their groups apart), the
    numbers its ops take as operands by their type only (each rank's shard may bake in its own),
    and the tpu device without its index (each process's chip is its own ``tpu:k``)."""

    def canonical(a):
        if isinstance(a, torch.fx.Node):
            return a.name
        if isinstance(a, str) and a in axes_of_name:
            return f"group{axes_of_name[a]}"
        if isinstance(a, torch.device) and a.type == "tpu":
            return "device(tpu)"
        return a

    def text(node):
        operands = {name: type(value).__name__ for name, value in _operands(node).items()}
        arguments = _with_operands(node, operands) if operands else (node.args, node.kwargs)
        return f"{node.op} {node.target} {torch.fx.node.map_aggregate(arguments, canonical)}"

    return hashlib.sha1("\n".join(text(n) for n in gm.graph.nodes).encode()).hexdigest()[:16]


# ---- the lowerings ------------------------------------------------------------------------------


def _check(node, name: str, size: int) -> str:
    """Why a collective node cannot be lowered as it stands ("" when it can)."""
    if "group_size" in [a.name for a in node.target._schema.arguments]:
        given = _argument(node, "group_size")
        if type(given) is int and given != size:
            return f"group_size {given} for a group of {size}"
    if name == "all_to_all_single":
        x = node.args[0].meta.get("val")
        splits = [_argument(node, "output_split_sizes"), _argument(node, "input_split_sizes")]
        for sizes in splits:
            if sizes and (not all(type(s) is int for s in sizes) or len(set(sizes)) != 1):
                return f"splits {list(sizes)} are not equal and static"
        if x is not None and (type(x.shape[0]) is not int or x.shape[0] % size):
            return f"dim 0 of size {x.shape[0]} is not a multiple of the group's {size}"
    if name == "shard_dim_alltoall":
        x = node.args[0].meta.get("val")
        dim = _argument(node, "shard_dim")
        if x is not None and (type(x.shape[dim]) is not int or x.shape[dim] % size):
            return f"the shard dim's size {x.shape[dim]} is not a multiple of the group's {size}"
    return ""


def _all_reduce(axis, x, reduce_op, group_name):
    collectives.check_reduce_op("all_reduce", reduce_op, x.dtype)
    return collectives.all_reduce(x, axis, reduce_op)


def _all_reduce_coalesced(axis, inputs, reduce_op, group_name):
    return [_all_reduce(axis, x, reduce_op, group_name) for x in inputs]


def _all_gather(axis, x, group_size, group_name):
    gathered = collectives.all_gather(x, axis)  # (n, *x.shape)
    return gathered.reshape((-1, *x.shape[1:])) if x.ndim else gathered


def _all_gather_coalesced(axis, inputs, group_size, group_name):
    return [_all_gather(axis, x, group_size, group_name) for x in inputs]


def _reduce_scatter(axis, x, reduce_op, group_size, group_name):
    collectives.check_reduce_op("reduce_scatter_tensor", reduce_op, x.dtype)
    return collectives.reduce_scatter(x, axis, reduce_op)


def _reduce_scatter_coalesced(axis, inputs, reduce_op, group_size, group_name):
    return [_reduce_scatter(axis, x, reduce_op, group_size, group_name) for x in inputs]


def _all_to_all_single(axis, x, output_split_sizes, input_split_sizes, group_name):
    return collectives.all_to_all(x, axis)


def _broadcast(axis, x, src, group_name):
    return collectives.broadcast(x, axis, src)  # src: the root's rank in the group, as c10d's rootRank


def _shard_dim_alltoall(axis, x, gather_dim, shard_dim, group_name):
    """DTensor's Shard(gather_dim) -> Shard(shard_dim): all ranks' blocks joined along
    ``gather_dim``, this rank's chunk of that along ``shard_dim``."""
    gather_dim, shard_dim = gather_dim % max(x.ndim, 1), shard_dim % max(x.ndim, 1)
    return lax.all_to_all(x, axis, shard_dim, gather_dim, tiled=True)


def _identity(axis, x):
    return x


_LOWERINGS = {
    "all_reduce": _all_reduce,
    "all_reduce_coalesced": _all_reduce_coalesced,
    "all_gather_into_tensor": _all_gather,
    "all_gather_into_tensor_coalesced": _all_gather_coalesced,
    "reduce_scatter_tensor": _reduce_scatter,
    "reduce_scatter_tensor_coalesced": _reduce_scatter_coalesced,
    "all_to_all_single": _all_to_all_single,
    "broadcast": _broadcast,
    "shard_dim_alltoall": _shard_dim_alltoall,
    "wait_tensor": _identity,
    "_wrap_tensor_autograd": _identity,
}
_LOCAL = {"wait_tensor", "_wrap_tensor_autograd"}  # no group: the same value
