"""Prototype: a c10d backend "tpu" whose collectives are XLA programs over JAX's multi-process runtime.

One process per chip; each process's torchtpu device is tpu:0 and holds one JAX device.
A collective wraps each process's local jax array in a global array over a 1-D mesh of
one device per rank, runs a cached jitted shard_map, and writes the local shard back.
CPU tensors go to an internal ProcessGroupGloo.
"""

from __future__ import annotations

import datetime
import functools
import os
import socket

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.distributed as dist
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

ReduceOp = dist.ReduceOp
AXIS = "r"

_JAX_STARTED = False
_COORD_KEY = "tpu_pg/jax_coordinator"


def _tt():
    import torchtpu.core.tensor as tt  # public functions of torchtpu's tensor layer

    return tt


# --------------------------------------------------------------------------- JAX start-up


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _start_jax(store, rank: int, size: int) -> None:
    """jax.distributed.initialize once per process, coordinator address shared through the c10d store."""
    global _JAX_STARTED
    if _JAX_STARTED:
        return
    if rank == 0:
        host = os.environ.get("MASTER_ADDR", "127.0.0.1")
        store.set(_COORD_KEY, f"{host}:{_free_port()}")
    address = store.get(_COORD_KEY).decode()
    jax.distributed.initialize(coordinator_address=address, num_processes=size, process_id=rank)
    _JAX_STARTED = True


# --------------------------------------------------------------------------- Work


class _DoneWork(dist._Work):
    """A Work that is complete when returned: jax orders the device work by data dependence."""

    def __init__(self, result=None):
        super().__init__()
        self._result = list(result or [])
        self._fut = torch.futures.Future()
        self._fut.set_result(self._result)

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def get_future(self):
        return self._fut

    def result(self):
        return self._result


# --------------------------------------------------------------------------- programs


def _op_name(op) -> str:
    """The ReduceOp as a plain name; opts.reduceOp is a ReduceOp, whose .op is the RedOpType."""
    red = getattr(op, "op", op)
    if red == ReduceOp.RedOpType.PREMUL_SUM:
        factor = op.factor
        if isinstance(factor, torch.Tensor):
            factor = factor.item()  # a host sync; a traced factor would avoid it
        return f"PREMUL_SUM:{float(factor)!r}"
    for name in ("SUM", "AVG", "MAX", "MIN", "PRODUCT", "BAND", "BOR", "BXOR"):
        if red == getattr(ReduceOp.RedOpType, name):
            return name
    raise ValueError(f"unknown reduce op {op!r}")


def _reduce_body(op: str, n: int):
    def body(x):
        if op == "SUM":
            return jax.lax.psum(x, AXIS) if x.dtype != jnp.bool_ else jax.lax.pmax(x, AXIS)
        if op == "AVG":
            return (jax.lax.psum(x, AXIS) / n).astype(x.dtype)
        if op == "MAX":
            return jax.lax.pmax(x, AXIS)
        if op == "MIN":
            return jax.lax.pmin(x, AXIS)
        if op.startswith("PREMUL_SUM"):
            return jax.lax.psum(x * jnp.asarray(float(op.split(":")[1]), x.dtype), AXIS)
        if op == "PRODUCT":
            return jnp.prod(jax.lax.all_gather(x, AXIS), axis=0).astype(x.dtype)
        raise NotImplementedError(f"tpu process group: reduce op {op}")

    return body


class _Programs:
    """Cached jitted shard_maps over one mesh (one device per rank of the group)."""

    def __init__(self, devices):
        self.devices = list(devices)
        self.n = len(self.devices)
        self.mesh = Mesh(np.array(self.devices), (AXIS,))
        self.sharding = NamedSharding(self.mesh, P(AXIS))
        self.cache = {}

    def _shard_map(self, body, key):
        fn = self.cache.get(key)
        if fn is None:
            fn = jax.jit(jax.shard_map(body, mesh=self.mesh, in_specs=P(AXIS), out_specs=P(AXIS), check_vma=False))
            self.cache[key] = fn
        return fn

    def globalize(self, local: jax.Array) -> jax.Array:
        shape = (self.n * local.shape[0],) + tuple(local.shape[1:])
        return jax.make_array_from_single_device_arrays(shape, self.sharding, [local])

    @staticmethod
    def local(global_array: jax.Array) -> jax.Array:
        return global_array.addressable_shards[0].data

    def run(self, kind, local: jax.Array, out_shape=None, **params) -> jax.Array:
        """Run one collective on this process's block; returns this process's block of the result."""
        scalar = local.ndim == 0
        if scalar:
            local = local.reshape(1)
        key = (kind, local.shape, local.dtype, out_shape, tuple(sorted(params.items())))
        n = self.n
        if kind == "allreduce":
            body = _reduce_body(params["op"], n)
        elif kind == "ppermute":  # mesh position 0 sends its block to position 1

            def body(x):
                return jax.lax.ppermute(x, AXIS, perm=[(0, 1)])
        elif kind == "broadcast":
            root = params["root"]

            def body(x):  # bit exact: gather, keep the root's block
                return jax.lax.all_gather(x, AXIS)[root]
        elif kind == "allgather":  # out_shape: this process's output shape (world * input numel)

            def body(x):
                return jax.lax.all_gather(x.reshape(-1), AXIS, tiled=True).reshape(out_shape)
        elif kind == "reduce_scatter":
            op = params["op"]

            def body(x):
                flat = x.reshape(-1)
                if op in ("SUM", "AVG") or op.startswith("PREMUL_SUM"):
                    if op.startswith("PREMUL_SUM"):
                        flat = flat * jnp.asarray(float(op.split(":")[1]), flat.dtype)
                    y = jax.lax.psum_scatter(flat, AXIS, scatter_dimension=0, tiled=True)
                    if op == "AVG":
                        y = (y / n).astype(x.dtype)
                else:  # MAX/MIN/PRODUCT: reduce everything, keep own block
                    full = _reduce_body(op, n)(flat)
                    k = flat.shape[0] // n
                    y = jax.lax.dynamic_slice_in_dim(full, jax.lax.axis_index(AXIS) * k, k)
                return y.reshape(out_shape)
        else:
            raise ValueError(kind)
        with _tt().x64():
            fn = self._shard_map(body, key)
            out = self.local(fn(self.globalize(local)))
        return out.reshape(()) if scalar and kind != "allgather" else out


# --------------------------------------------------------------------------- the process group


def _is_tpu(tensors) -> bool:
    kinds = {t.device.type for t in tensors}
    if len(kinds) > 1:
        raise RuntimeError(f"tpu process group: tensors on mixed devices {kinds}")
    return kinds == {"tpu"}


class TpuProcessGroup(dist.ProcessGroup):
    def __init__(self, store, rank, size, timeout, global_ranks):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._group_name = None
        self._group_desc = ""
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        self._global_ranks = list(global_ranks) or list(range(size))
        self._programs = None

    # -- identity
    def getBackendName(self):
        return "tpu"

    def getGroupName(self):
        return self._group_name

    def setGroupName(self, name):
        self._group_name = name

    def getGroupDesc(self):
        return self._group_desc

    def setGroupDesc(self, desc):
        self._group_desc = desc

    @property
    def programs(self) -> _Programs:
        if self._programs is None:
            by_process = {d.process_index: d for d in sorted(jax.devices(), key=lambda d: d.id)}
            self._programs = _Programs([by_process[r] for r in self._global_ranks])
        return self._programs

    # -- helpers
    @staticmethod
    def _read(t):
        return _tt().read(t)

    @staticmethod
    def _write(t, value):
        _tt().write(t, value)

    # -- collectives
    def allreduce(self, tensors, opts=None):
        if isinstance(opts, (ReduceOp, ReduceOp.RedOpType)) or opts is None:
            o = dist.AllreduceOptions()
            o.reduceOp = opts if opts is not None else ReduceOp.SUM
            opts = o
        if not _is_tpu(tensors):
            return self._gloo.allreduce(tensors, opts)
        op = _op_name(opts.reduceOp)
        for t in tensors:
            self._write(t, self.programs.run("allreduce", self._read(t), op=op))
        return _DoneWork(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        if not _is_tpu(tensors):
            return self._gloo.allreduce_coalesced(tensors, opts)
        o = dist.AllreduceOptions()
        o.reduceOp = opts.reduceOp
        return self.allreduce(tensors, o)

    def broadcast(self, tensors, opts):
        if not _is_tpu(tensors):
            return self._gloo.broadcast(tensors, opts)
        for t in tensors:
            self._write(t, self.programs.run("broadcast", self._read(t), root=opts.rootRank))
        return _DoneWork(tensors)

    def allgather(self, output_lists, input_tensors, opts=None):
        flat = [t for lst in output_lists for t in lst] + list(input_tensors)
        if not _is_tpu(flat):
            return self._gloo.allgather(output_lists, input_tensors, opts)
        n = self.size()
        for outs, inp in zip(output_lists, input_tensors):
            gathered = self.programs.run("allgather", self._read(inp), out_shape=(n, *inp.shape))
            for i, out in enumerate(outs):
                self._write(out, gathered[i])
        return _DoneWork([t for lst in output_lists for t in lst])

    def _gather_into(self, output, input):
        value = self.programs.run("allgather", self._read(input), out_shape=tuple(output.shape))
        self._write(output, value)

    def all_gather_single(self, output, input, opts=None):
        if not _is_tpu([output, input]):
            return self._gloo._allgather_base(output, input, opts)
        self._gather_into(output, input)
        return _DoneWork([output])

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        if not _is_tpu(list(outputs) + list(inputs)):
            return self._gloo.allgather_into_tensor_coalesced(outputs, inputs, opts)
        for o, i in zip(outputs, inputs):
            self._gather_into(o, i)
        return _DoneWork(outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def _scatter_into(self, output, input, opts):
        op = _op_name(opts.reduceOp)
        value = self.programs.run("reduce_scatter", self._read(input), out_shape=tuple(output.shape), op=op)
        self._write(output, value)

    def reduce_scatter_single(self, output, input, opts=None):
        if not _is_tpu([output, input]):
            return self._gloo._reduce_scatter_base(output, input, opts)
        self._scatter_into(output, input, opts)
        return _DoneWork([output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        if not _is_tpu(list(outputs) + list(inputs)):
            return self._gloo.reduce_scatter_tensor_coalesced(outputs, inputs, opts)
        for o, i in zip(outputs, inputs):
            self._scatter_into(o, i, opts)
        return _DoneWork(outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def reduce_scatter(self, outputs, input_lists, opts=None):
        if not _is_tpu(list(outputs) + [t for lst in input_lists for t in lst]):
            return self._gloo.reduce_scatter(outputs, input_lists, opts)
        for out, ins in zip(outputs, input_lists):
            stacked = jnp.stack([self._read(t) for t in ins])
            op = _op_name(opts.reduceOp)
            self._write(out, self.programs.run("reduce_scatter", stacked, out_shape=tuple(out.shape), op=op))
        return _DoneWork(outputs)

    def _pair(self, src: int, dst: int) -> _Programs:
        """Programs over the two-device mesh [src, dst] (group ranks)."""
        key = (src, dst)
        pairs = self.__dict__.setdefault("_pairs", {})
        if key not in pairs:
            devices = self.programs.devices
            pairs[key] = _Programs([devices[src], devices[dst]])
        return pairs[key]

    def send(self, tensors, dstRank, tag=0):
        if not _is_tpu(tensors):
            return self._gloo.send(tensors, dstRank, tag)
        pair = self._pair(self._rank, dstRank)
        for t in tensors:
            pair.run("ppermute", self._read(t)).block_until_ready()
        return _DoneWork(tensors)

    def recv(self, tensors, srcRank, tag=0):
        if not _is_tpu(tensors):
            return self._gloo.recv(tensors, srcRank, tag)
        pair = self._pair(srcRank, self._rank)
        for t in tensors:
            self._write(t, pair.run("ppermute", self._read(t)))
        return _DoneWork(tensors)

    def barrier(self, opts=None):
        # A device collective would start JAX's backend; the gloo group is enough to line processes up.
        return self._gloo.barrier(opts if opts is not None else dist.BarrierOptions())


# --------------------------------------------------------------------------- tracing (for the report)

TRACE = []  # (method, devices, option summary) for each call, when TPU_PG_TRACE=1


def _summarize(args):
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(f"T[{a.device.type}]")
        elif isinstance(a, (list, tuple)):
            out.append("[" + ",".join(_summarize(a)) + "]")
        elif type(a).__name__.endswith("Options"):
            fields = [f for f in ("reduceOp", "rootRank", "rootTensor", "asyncOp", "device") if hasattr(a, f)]
            shown = []
            for f in fields:
                v = getattr(a, f)
                if f == "reduceOp":
                    v = str(v.op).split(".")[-1] + (f"(factor={v.factor})" if v.op == ReduceOp.RedOpType.PREMUL_SUM else "")
                shown.append(f"{f}={v!s}")
            out.append(type(a).__name__ + "(" + ",".join(shown) + ")")
        else:
            out.append(repr(a))
    return out


def _traced(name, fn):
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        kw = [f"{k}={v}" for k, v in zip(kwargs, _summarize(list(kwargs.values())))]
        import traceback

        caller = "C++ or top"
        for frame in reversed(traceback.extract_stack()[:-1]):
            if "tpu_pg" not in frame.filename and "c10d_logger" not in frame.filename:
                caller = f"{os.path.basename(frame.filename)}:{frame.name}"
                break
        TRACE.append((name, " ".join(_summarize(args) + kw) + f"   <- {caller}"))
        return fn(self, *args, **kwargs)

    return wrapper


if os.environ.get("TPU_PG_TRACE"):
    for _name in ("allreduce", "allreduce_coalesced", "broadcast", "allgather", "all_gather_single", "_allgather_base",
                  "allgather_into_tensor_coalesced", "all_gather_single_coalesced", "reduce_scatter_single",
                  "_reduce_scatter_base", "reduce_scatter_tensor_coalesced", "reduce_scatter_single_coalesced",
                  "reduce_scatter", "barrier", "send", "recv"):
        setattr(TpuProcessGroup, _name, _traced(_name, getattr(TpuProcessGroup, _name)))


# --------------------------------------------------------------------------- registration


def _create(opts, backend_options=None):
    store, rank, size = opts.store, opts.group_rank, opts.group_size
    ranks = list(opts.global_ranks_in_group)
    if not _JAX_STARTED:
        if ranks and ranks != list(range(size)):
            raise RuntimeError("tpu process group: the first group must be the world group")
        _start_jax(store, rank, size)
    return TpuProcessGroup(store, rank, size, opts.timeout, ranks)


dist.Backend.register_backend("tpu", _create, extended_api=True, devices=["tpu"])
