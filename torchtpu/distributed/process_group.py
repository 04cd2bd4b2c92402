"""The c10d backend "tpu": a ``ProcessGroup`` whose collectives are XLA programs.

One process drives one chip.  A collective reads this process's tensor
(``core.tensor.read``), wraps it as its shard of a global array over the
group's mesh (``runtime.GroupMesh``), runs a cached jitted ``shard_map`` of a
body from ``collectives.py``, and writes this process's block of the result
back through the tensor's view (``core.tensor.write``).  Tensors that are not
on tpu go to a gloo group made from the same store.

Checks.  The first time a program is compiled for a signature (collective,
shapes, dtypes, parameters), the ranks compare their signatures through the
c10d store, within the group's timeout: a shape mismatch raises an error that
names the collective and both ranks, and a rank that never arrives (exited,
hung) makes the others raise when the timeout ends, instead of hanging in
XLA.  Later calls with a known signature skip the check (no host round trip).

Asynchrony.  A call returns once XLA has the program; JAX orders later work
on the tensor after it, so the returned ``Work`` and its future are complete
at once, as a CUDA stream makes NCCL's look.  ``wait()`` on a handle from
``async_op=True`` (and on a recv) blocks until the results are computed.
"""

from __future__ import annotations

import collections
import datetime
import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d  # every options type (torch.distributed lacks some)

from ..core import dtypes, tensor
from ..runtime import context
from . import collectives, runtime, watchdog
from .runtime import AXIS

_RedOpType = dist.ReduceOp.RedOpType
_REDUCE_OP_NAMES = {
    _RedOpType.SUM: "sum", _RedOpType.AVG: "avg", _RedOpType.PRODUCT: "product", _RedOpType.MIN: "min",
    _RedOpType.MAX: "max", _RedOpType.PREMUL_SUM: "premul_sum", _RedOpType.BAND: "band", _RedOpType.BOR: "bor",
    _RedOpType.BXOR: "bxor",
}


# ---- Work ---------------------------------------------------------------------------------------


class CollectiveWork(dist._Work):
    """A collective handed to XLA.  Its future holds the output tensors and is complete:
    every later op on them runs after the collective.  ``wait()`` blocks until the
    results are computed when ``blocking`` (an async handle the user waits on)."""

    def __init__(self, name: str, tensors, arrays=(), blocking: bool = False):
        super().__init__()
        self._name = name
        self._tensors = list(tensors)
        self._arrays = list(arrays)
        self._blocking = blocking
        self._future = None  # made on request: most callers never ask

    def wait(self, timeout=None):
        if self._blocking:
            try:
                jax.block_until_ready(self._arrays)
            except Exception as error:  # noqa: BLE001 (XLA's error types vary by platform)
                raise RuntimeError(f"{self._name}: the collective failed while running: {error}") from error
        return True

    def is_completed(self):
        return all(a.is_deleted() or a.is_ready() for a in self._arrays)  # fused mode may donate them

    def is_success(self):
        return True

    def exception(self):
        return None

    def result(self):
        return self._tensors

    def get_future(self):
        if self._future is None:
            self._future = torch.futures.Future()
            self._future.set_result(self._tensors)
        return self._future


# ---- helpers ------------------------------------------------------------------------------------


def _reduce_op(reduce_op) -> tuple[str, object]:
    """(op name, premul factor or None) from a c10d ReduceOp or RedOpType."""
    kind = getattr(reduce_op, "op", reduce_op)
    name = _REDUCE_OP_NAMES.get(kind)
    if name is None:
        raise ValueError(f"tpu process group: unknown reduce op {reduce_op!r}")
    return name, (reduce_op.factor if name == "premul_sum" else None)


@functools.lru_cache(maxsize=64)
def _device_scalar(value: float) -> jax.Array:
    """A float factor as a device array, made once per value (FSDP passes the same one each step)."""
    with tensor.x64():
        return jnp.asarray(np.float64(value))


def _factor_operand(factor) -> jax.Array:
    """PREMUL_SUM's factor as a program operand: a new factor is no new program, and a
    tensor factor is never read on the host."""
    if isinstance(factor, torch.Tensor):
        if factor.device.type == "tpu":
            return tensor.read(factor)
        with tensor.x64():
            return jnp.asarray(dtypes.torch_to_numpy(factor.detach()))
    return _device_scalar(float(factor))


def _block_shape(shape) -> tuple:
    """The shape of a tensor's block in a program: 0-dim tensors travel as (1,)."""
    return tuple(shape) if len(shape) else (1,)


def _store(t: torch.Tensor, value: jax.Array) -> None:
    if tuple(value.shape) != tuple(t.shape):
        value = value.reshape(t.shape)
    tensor.write(t, value)


def _flat(blocks):
    return jnp.concatenate([b.reshape(-1) for b in blocks]) if len(blocks) > 1 else blocks[0].reshape(-1)


def _describe(operands, params) -> str:
    seen = []
    for a in operands:
        text = f"shape {tuple(a.shape)} {a.dtype}"
        if text not in seen:
            seen.append(text)
    return ", ".join(seen + [f"{k}={v}" for k, v in params])


def _check_same_dtype(name: str, tensors) -> None:
    kinds = {t.dtype for t in tensors}
    if len(kinds) > 1:
        raise TypeError(f"{name}: tensors of different dtypes {sorted(map(str, kinds))} in one call")


def _check_numel(name: str, what: str, t: torch.Tensor, expected: int) -> None:
    if t.numel() != expected:
        raise ValueError(f"{name}: {what} has {t.numel()} elements (shape {tuple(t.shape)}), expected {expected}")


def _options(opts, default_type):
    """c10d passes an options object; older call forms pass a ReduceOp or nothing."""
    if isinstance(opts, default_type):
        return opts
    options = default_type()
    if opts is not None and hasattr(options, "reduceOp"):
        options.reduceOp = opts
    return options


# ---- the process group ---------------------------------------------------------------------------


class TpuProcessGroup(dist.ProcessGroup):
    """The "tpu" process group of ``group_size`` processes, one chip each."""

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta, global_ranks=(),
                 group_name: str = ""):
        super().__init__(rank, size)
        self._rank, self._size = rank, size  # the C++ getters cost as much as a small collective's checks
        self._store = dist.PrefixStore("torchtpu/", store)
        self._timeout = timeout
        self._global_ranks = tuple(global_ranks) or tuple(range(size))
        self._group_name = group_name
        self._group_desc = ""
        # CPU tensors take torch's own path; its keys live apart from ours in the store.
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", self._store), rank, size, timeout)
        self._mesh = None  # built at the first tpu collective: building it starts JAX's backend
        self._pair_meshes = {}
        self._sequence = 0  # collectives run on this group: the same count on every rank
        self._pair_sequence = collections.Counter()  # (src, dst) -> point-to-point transfers
        self._lock = threading.RLock()  # keeps the sequence in call order when threads share the group

    # -- identity (c10d requires these)

    def rank(self):
        return self._rank

    def size(self):
        return self._size

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

    def abort(self):
        self._close(abort=True)

    def shutdown(self):
        self._close(abort=False)

    def _close(self, abort: bool) -> None:
        """Let go of the store and the gloo group now, not when this object dies: a caught
        collective error keeps it alive (its traceback holds it).  JAX's runtime stays up
        for the process (it cannot restart); runtime.start reuses it for the same world."""
        if self._gloo is not None and abort:
            self._gloo.abort()
        elif self._gloo is not None:
            self._gloo.shutdown()
        self._gloo = self._store = self._mesh = None
        self._pair_meshes.clear()

    @property
    def _cpu_group(self):
        if self._gloo is None:
            raise RuntimeError(f"process group {self._group_name!r} was shut down")
        return self._gloo

    # -- meshes

    @property
    def mesh(self) -> runtime.GroupMesh:
        if self._mesh is None:
            self._mesh = runtime.GroupMesh(self._global_ranks)
        return self._mesh

    def _pair_mesh(self, src: int, dst: int) -> runtime.GroupMesh:
        """A two-device mesh [src, dst] (group ranks) for one point-to-point transfer."""
        mesh = self._pair_meshes.get((src, dst))
        if mesh is None:
            mesh = self._pair_meshes[(src, dst)] = runtime.GroupMesh(
                (self._global_ranks[src], self._global_ranks[dst]))
        return mesh

    @staticmethod
    def _on_gloo_each(outputs, works):
        """Coalesced calls gloo has no single form for: one gloo call per tensor, all waited."""
        for work in works:
            work.wait()
        return CollectiveWork("coalesced (gloo)", outputs)

    # -- running programs

    @staticmethod
    def _on_tpu(name: str, tensors) -> bool:
        """True if the call's tensors are on tpu, False if none is (gloo runs it)."""
        kinds = {t.device.type for t in tensors}
        if "tpu" not in kinds:
            return False
        if len(kinds) > 1:
            raise RuntimeError(f"{name}: tensors on {' and '.join(sorted(kinds))} in one call; all of a call's "
                               f"tensors must be on tpu (XLA collectives) or all on cpu (gloo)")
        return True

    def _launch(self, name: str, body, params: tuple, operands, outputs: int = 1, pair=None) -> list:
        """Run ``body`` over the group's mesh (or the ``pair`` [src, dst]); this rank's output blocks."""
        if self._store is None:
            raise RuntimeError(f"{name}: process group {self._group_name!r} was shut down")
        mesh = self._pair_mesh(*pair) if pair else self.mesh
        signature = tuple((a.shape, a.dtype) for a in operands)  # cheap to build and hash: no strings
        key = (name, params, signature, mesh.ranks)
        with self._lock:
            if pair:
                self._pair_sequence[pair] += 1
                check_key, ranks = f"p2p/{pair[0]}-{pair[1]}/{self._pair_sequence[pair]}", list(pair)
            else:
                self._sequence += 1
                check_key, ranks = f"collective/{self._sequence}", list(range(self.size()))
            program = runtime.cached(key)
            if program is None:
                self._agree(name, check_key, ranks, _describe(operands, params))
                program = runtime.build_program(key, name, mesh, body, len(operands), outputs)
            watched = watchdog.issued(f"{name} on process group {self._group_name!r}",
                                      self._timeout.total_seconds())
            try:
                outputs = runtime.run(program, mesh, operands)
            except Exception as error:  # noqa: BLE001 (XLA raises ValueError or JaxRuntimeError)
                watchdog.abandon(watched)
                raise RuntimeError(f"{name} on process group {self._group_name!r}: the XLA collective failed "
                                   f"(has a rank exited?): {error}") from error
            watchdog.returned(watched, outputs)
            return outputs

    def _agree(self, name: str, check_key: str, ranks, mine: str) -> None:
        """Compare this call's signature with the other ranks' through the store, within the timeout."""
        if len(ranks) == 1:
            return
        keys = [f"{check_key}/{r}" for r in ranks]
        self._store.set(f"{check_key}/{self.rank()}", mine)
        try:
            self._store.wait(keys, self._timeout)
        except Exception as error:  # noqa: BLE001 (a timeout, or the store's host is gone)
            raise RuntimeError(
                f"{name}: rank(s) {self._absent(keys, ranks)} of process group {self._group_name!r} did not "
                f"reach this collective within {self._timeout} (exited, hung, or running another "
                f"collective): {error}") from error
        signatures = [v.decode() for v in self._store.multi_get(keys)]
        for rank, theirs in zip(ranks, signatures):
            if theirs != signatures[0]:
                raise RuntimeError(f"{name}: rank {rank} has {theirs} but rank {ranks[0]} has {signatures[0]}")

    def _absent(self, keys, ranks) -> str:
        try:
            return str([r for r, k in zip(ranks, keys) if not self._store.check([k])])
        except Exception:  # noqa: BLE001 (the store itself is unreachable)
            return "(unknown: the store is unreachable)"

    # -- reductions

    def allreduce(self, tensors, opts=None):
        opts = _options(opts, c10d.AllreduceOptions)
        if not self._on_tpu("all_reduce", tensors):
            return self._cpu_group.allreduce(tensors, opts)
        return self._all_reduce("all_reduce", tensors, opts.reduceOp, opts.asyncOp)

    def allreduce_coalesced(self, tensors, opts=None):
        opts = _options(opts, c10d.AllreduceCoalescedOptions)
        if not self._on_tpu("all_reduce_coalesced", tensors):
            return self._cpu_group.allreduce_coalesced(tensors, opts)
        return self._all_reduce("all_reduce_coalesced", tensors, opts.reduceOp, opts.asyncOp)

    def _all_reduce(self, name, tensors, reduce_op, async_op, root=None):
        """All-reduce the tensors in one program; with ``root``, only that rank stores the result."""
        op, factor = _reduce_op(reduce_op)
        for t in tensors:
            collectives.check_reduce_op(name, op, dtypes.to_jax(t.dtype))
        operands = [tensor.read(t) for t in tensors]
        count = len(operands)
        if op == "premul_sum":
            operands.append(_factor_operand(factor))

        def body(*blocks):
            factor_block = blocks[count] if op == "premul_sum" else None
            results = tuple(collectives.all_reduce(b, AXIS, op, factor_block) for b in blocks[:count])
            return results if count > 1 else results[0]

        params = (("op", op),) if root is None else (("op", op), ("root", root))
        results = self._launch(name, body, params, operands, outputs=count)
        if root is None or root == self.rank():
            for t, value in zip(tensors, results):
                _store(t, value)
        return CollectiveWork(name, tensors, results, async_op)

    def reduce(self, tensors, opts=None):
        opts = _options(opts, c10d.ReduceOptions)
        if not self._on_tpu("reduce", tensors):
            return self._cpu_group.reduce(tensors, opts)
        return self._all_reduce("reduce", tensors, opts.reduceOp, opts.asyncOp, root=opts.rootRank)

    def reduce_scatter_single(self, output, input, opts=None):
        opts = _options(opts, c10d.ReduceScatterOptions)
        if not self._on_tpu("reduce_scatter_tensor", [output, input]):
            return self._cpu_group._reduce_scatter_base(output, input, opts)
        return self._reduce_scatter("reduce_scatter_tensor", [output], [[input]], opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = _options(opts, c10d.ReduceScatterOptions)
        if not self._on_tpu("reduce_scatter_tensor_coalesced", [*outputs, *inputs]):
            return self._on_gloo_each(outputs, [self._cpu_group._reduce_scatter_base(o, i, opts)
                                                for o, i in zip(outputs, inputs)])
        return self._reduce_scatter("reduce_scatter_tensor_coalesced", outputs, [[i] for i in inputs], opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def reduce_scatter(self, outputs, input_lists, opts=None):
        opts = _options(opts, c10d.ReduceScatterOptions)
        if not self._on_tpu("reduce_scatter", [*outputs, *(t for ts in input_lists for t in ts)]):
            return self._cpu_group.reduce_scatter(outputs, input_lists, opts)
        for ins in input_lists:
            if len(ins) != self.size():
                raise ValueError(f"reduce_scatter: expected {self.size()} input tensors, got {len(ins)}")
        return self._reduce_scatter("reduce_scatter", outputs, input_lists, opts)

    def _reduce_scatter(self, name, outputs, input_lists, opts):
        """Output i is this rank's block of the reduction of input_lists[i] (its pieces
        concatenated, flat), all in one program."""
        op, factor = _reduce_op(opts.reduceOp)
        n = self.size()
        for out, ins in zip(outputs, input_lists):
            _check_same_dtype(name, [out, *ins])
            collectives.check_reduce_op(name, op, dtypes.to_jax(out.dtype))
            _check_numel(name, "the input", ins[0], out.numel() * (n if len(ins) == 1 else 1))
        operands = [tensor.read(t) for ins in input_lists for t in ins]
        if op == "premul_sum":
            operands.append(_factor_operand(factor))
        pieces = [len(ins) for ins in input_lists]
        out_blocks = tuple(_block_shape(out.shape) for out in outputs)

        def body(*blocks):
            factor_block = blocks[-1] if op == "premul_sum" else None
            results, start = [], 0
            for count, out_block in zip(pieces, out_blocks):
                flat = _flat(blocks[start:start + count])
                start += count
                results.append(collectives.reduce_scatter(flat, AXIS, op, factor_block).reshape(out_block))
            return tuple(results) if len(results) > 1 else results[0]

        results = self._launch(name, body, (("op", op), ("outputs", out_blocks)), operands, outputs=len(outputs))
        for out, value in zip(outputs, results):
            _store(out, value)
        return CollectiveWork(name, outputs, results, opts.asyncOp)

    # -- gathers

    def allgather(self, output_lists, input_tensors, opts=None):
        opts = _options(opts, c10d.AllgatherOptions)
        if not self._on_tpu("all_gather", [*input_tensors, *(t for ts in output_lists for t in ts)]):
            return self._cpu_group.allgather(output_lists, input_tensors, opts)
        results = []
        for outs, inp in zip(output_lists, input_tensors):
            results += self._gather_list("all_gather", outs, inp)
        return CollectiveWork("all_gather", [t for ts in output_lists for t in ts], results, opts.asyncOp)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """output_lists[r][j] = rank r's input_list[j]."""
        opts = _options(opts, c10d.AllgatherOptions)
        if not self._on_tpu("all_gather_coalesced", [*input_list, *(t for ts in output_lists for t in ts)]):
            return self._cpu_group.allgather_coalesced(output_lists, input_list, opts)
        results = []
        for j, inp in enumerate(input_list):
            results += self._gather_list("all_gather_coalesced", [outs[j] for outs in output_lists], inp)
        return CollectiveWork("all_gather_coalesced", [t for ts in output_lists for t in ts], results, opts.asyncOp)

    def _gather_list(self, name, outputs, input, root=None) -> list:
        """Every rank's ``input`` into ``outputs`` (one per rank); with ``root``, only there."""
        if root is None or root == self.rank():
            if len(outputs) != self.size():
                raise ValueError(f"{name}: expected {self.size()} output tensors, got {len(outputs)}")
            _check_same_dtype(name, [input, *outputs])
            for out in outputs:
                _check_numel(name, "an output", out, input.numel())
        n = self.size()

        def body(block):
            gathered = collectives.all_gather(block, AXIS)
            return tuple(gathered[i] for i in range(n)) if n > 1 else gathered[0]

        params = () if root is None else (("root", root),)
        results = self._launch(name, body, params, [tensor.read(input)], outputs=n)
        if root is None or root == self.rank():
            for out, value in zip(outputs, results):
                _store(out, value)
        return results

    def all_gather_single(self, output, input, opts=None):
        opts = _options(opts, c10d.AllgatherOptions)
        if not self._on_tpu("all_gather_into_tensor", [output, input]):
            return self._cpu_group._allgather_base(output, input, opts)
        return self._all_gather_into("all_gather_into_tensor", [output], [input], opts)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        opts = _options(opts, c10d.AllgatherOptions)
        if not self._on_tpu("all_gather_into_tensor_coalesced", [*outputs, *inputs]):
            return self._on_gloo_each(outputs, [self._cpu_group._allgather_base(o, i, opts)
                                                for o, i in zip(outputs, inputs)])
        return self._all_gather_into("all_gather_into_tensor_coalesced", outputs, inputs, opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def _all_gather_into(self, name, outputs, inputs, opts):
        for out, inp in zip(outputs, inputs):
            _check_same_dtype(name, [out, inp])
            _check_numel(name, "the output", out, inp.numel() * self.size())
        out_blocks = tuple(_block_shape(out.shape) for out in outputs)

        def body(*blocks):
            results = tuple(collectives.all_gather(b, AXIS).reshape(shape) for b, shape in zip(blocks, out_blocks))
            return results if len(results) > 1 else results[0]

        results = self._launch(name, body, (("outputs", out_blocks),), [tensor.read(t) for t in inputs],
                               outputs=len(outputs))
        for out, value in zip(outputs, results):
            _store(out, value)
        return CollectiveWork(name, outputs, results, opts.asyncOp)

    def gather(self, output_lists, input_tensors, opts=None):
        """output_lists is [gather_list] on the root and [] elsewhere."""
        opts = _options(opts, c10d.GatherOptions)
        if not self._on_tpu("gather", [*input_tensors, *(t for ts in output_lists for t in ts)]):
            return self._cpu_group.gather(output_lists, input_tensors, opts)
        outputs = output_lists[0] if output_lists else []
        results = self._gather_list("gather", outputs, input_tensors[0], root=opts.rootRank)
        return CollectiveWork("gather", outputs, results, opts.asyncOp)

    # -- data movement

    def broadcast(self, tensors, opts=None):
        opts = _options(opts, c10d.BroadcastOptions)
        if not self._on_tpu("broadcast", tensors):
            return self._cpu_group.broadcast(tensors, opts)
        root = opts.rootRank
        count = len(tensors)

        def body(*blocks):
            results = tuple(collectives.broadcast(b, AXIS, root) for b in blocks)
            return results if count > 1 else results[0]

        results = self._launch("broadcast", body, (("root", root),), [tensor.read(t) for t in tensors], count)
        if self.rank() != root:  # the root's tensors already hold the value
            for t, value in zip(tensors, results):
                _store(t, value)
        return CollectiveWork("broadcast", tensors, results, opts.asyncOp)

    def scatter(self, output_tensors, input_lists, opts=None):
        """input_lists is [scatter_list] on the root and [] elsewhere."""
        opts = _options(opts, c10d.ScatterOptions)
        if not self._on_tpu("scatter", [*output_tensors, *(t for ts in input_lists for t in ts)]):
            return self._cpu_group.scatter(output_tensors, input_lists, opts)
        out, root, n = output_tensors[0], opts.rootRank, self.size()
        if self.rank() == root:
            pieces = input_lists[0]
            if len(pieces) != n:
                raise ValueError(f"scatter: expected {n} input tensors on the source rank, got {len(pieces)}")
            _check_same_dtype("scatter", [out, *pieces])
            for piece in pieces:
                _check_numel("scatter", "an input", piece, out.numel())
            operands = [tensor.read(t) for t in pieces]
        else:  # only the shape matters: the other ranks' blocks are never read
            with tensor.x64():
                operands = [jnp.zeros(tuple(out.shape), dtypes.to_jax(out.dtype))] * n
        out_block = _block_shape(out.shape)

        def body(*blocks):
            return collectives.scatter(_flat(blocks), AXIS, root).reshape(out_block)

        results = self._launch("scatter", body, (("root", root),), operands)
        _store(out, results[0])
        return CollectiveWork("scatter", [out], results, opts.asyncOp)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = _options(opts, c10d.AllToAllOptions)
        if not self._on_tpu("all_to_all_single", [output, input]):
            return self._cpu_group.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)
        _check_same_dtype("all_to_all_single", [output, input])
        if output_split_sizes or input_split_sizes:
            return self._all_to_all_split("all_to_all_single", [output], [input],
                                          self._splits("the input", input, input_split_sizes),
                                          self._splits("the output", output, output_split_sizes), opts)
        n = self.size()
        _check_numel("all_to_all_single", "the output", output, input.numel())
        if input.numel() % n:
            raise ValueError(f"all_to_all_single: the input's {input.numel()} elements do not split into {n} "
                             f"equal parts")
        out_block = _block_shape(output.shape)

        def body(block):
            return collectives.all_to_all(block.reshape(-1), AXIS).reshape(out_block)

        results = self._launch("all_to_all_single", body, (("output", out_block),), [tensor.read(input)])
        _store(output, results[0])
        return CollectiveWork("all_to_all_single", [output], results, opts.asyncOp)

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        """input_tensors[j] goes to rank j; output_tensors[i] comes from rank i (any shapes)."""
        opts = _options(opts, c10d.AllToAllOptions)
        if not self._on_tpu("all_to_all", [*output_tensors, *input_tensors]):
            return self._cpu_group.alltoall(output_tensors, input_tensors, opts)
        _check_same_dtype("all_to_all", [*output_tensors, *input_tensors])
        n = self.size()
        if len(input_tensors) != n or len(output_tensors) != n:
            raise ValueError(f"all_to_all: expected {n} input and {n} output tensors, got "
                             f"{len(input_tensors)} and {len(output_tensors)}")
        return self._all_to_all_split("all_to_all", output_tensors, input_tensors,
                                      [t.numel() for t in input_tensors], [t.numel() for t in output_tensors],
                                      opts, rows_of_elements=True)

    def _splits(self, what: str, t: torch.Tensor, sizes) -> list[int]:
        n = self.size()
        if sizes:
            if len(sizes) != n or sum(sizes) != (t.shape[0] if t.ndim else 1):
                raise ValueError(f"all_to_all_single: {what}'s split sizes {list(sizes)} must be {n} numbers "
                                 f"summing to its first dimension ({tuple(t.shape)})")
            return [int(s) for s in sizes]
        rows = t.shape[0] if t.ndim else 1
        if rows % n:
            raise ValueError(f"all_to_all_single: {what}'s {rows} rows do not split into {n} equal parts")
        return [rows // n] * n

    def _all_to_all_split(self, name, outputs, inputs, in_splits, out_splits, opts, rows_of_elements=False):
        """Unequal splits: pad every (source, destination) piece to one agreed length, run an
        equal all_to_all, drop the padding.  The pad length is agreed through gloo (host
        numbers, no device sync) and rounded up to a power of two, so split sizes that
        change each step reuse a few programs.

        A row is a slice along dim 0 (all_to_all_single), or one element when the tensors
        are flattened (all_to_all's list form)."""
        n = self.size()
        row = 1 if rows_of_elements else int(np.prod(inputs[0].shape[1:], dtype=np.int64))
        longest = torch.tensor([max(max(in_splits), max(out_splits), 1)], dtype=torch.int64)
        options = c10d.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.MAX
        self._cpu_group.allreduce([longest], options).wait()
        pad = 1 << (int(longest.item()) - 1).bit_length()
        in_shapes = tuple(tuple(t.shape) for t in inputs)
        out_shapes = tuple(tuple(t.shape) for t in outputs)
        dtype = dtypes.to_jax(inputs[0].dtype)

        positions = np.concatenate([j * pad + np.arange(s) for j, s in enumerate(in_splits)]).astype(np.int32)
        pack = runtime.local_program(("all_to_all pack", in_shapes, row, n * pad, str(dtype)), "all_to_all pack",
                                     functools.partial(_pack, rows=n * pad, row=row))
        sources = np.concatenate([i * pad + np.arange(s) for i, s in enumerate(out_splits)]).astype(np.int32)
        unpack = runtime.local_program(("all_to_all unpack", n * pad, row, out_shapes, str(dtype)),
                                       "all_to_all unpack", functools.partial(_unpack, shapes=out_shapes))
        with tensor.x64():
            packed = pack([tensor.read(t) for t in inputs], positions)
        received = self._launch(name, lambda block: collectives.all_to_all(block, AXIS), (), [packed])[0]
        with tensor.x64():
            values = unpack(received, sources)
        for out, value in zip(outputs, values):
            _store(out, value)
        return CollectiveWork(name, outputs, [received], opts.asyncOp)

    # -- point to point

    def send(self, tensors, dstRank, tag=0):
        """Pairs must match: the n-th send from a to b meets the n-th recv on b from a,
        with the same shape and dtype (tags are not used)."""
        if not self._on_tpu("send", tensors):
            return self._cpu_group.send(tensors, dstRank, tag)
        for t in tensors:
            self._transfer("send", t, self.rank(), dstRank)
        return CollectiveWork("send", tensors)

    def recv(self, tensors, srcRank, tag=0):
        if not self._on_tpu("recv", tensors):
            return self._cpu_group.recv(tensors, srcRank, tag)
        results = []
        for t in tensors:
            value = self._transfer("recv", t, srcRank, self.rank())
            _store(t, value)
            results.append(value)
        return CollectiveWork("recv", tensors, results, blocking=True)

    def recv_anysource(self, tensors, tag=0):
        if not self._on_tpu("recv", tensors):
            return self._cpu_group.recv_anysource(tensors, tag)
        raise RuntimeError("recv from any source is not supported on tpu tensors (XLA transfers need both "
                           "ends known); pass src=")

    def _transfer(self, name, t, src: int, dst: int) -> jax.Array:
        if src == dst:
            raise ValueError(f"{name}: rank {src} cannot send to itself")
        body = functools.partial(collectives.permute, axis=AXIS, pairs=((0, 1),))
        return self._launch("send/recv", body, (), [tensor.read(t)], pair=(src, dst))[0]

    # -- synchronization

    def barrier(self, opts=None):
        """Wait for this process's queued device work, then for every rank (through gloo)."""
        context.current().flush("barrier")
        tensor.wait_for_dispatched()
        return self._cpu_group.barrier(opts if opts is not None else c10d.BarrierOptions())


def _pack(arrays, positions, rows: int, row: int):
    """The inputs as (rows, row), each piece at its padded slot (positions: one per input row)."""
    flat = jnp.concatenate([a.reshape(-1, row) for a in arrays]) if len(arrays) > 1 else arrays[0].reshape(-1, row)
    return jnp.zeros((rows, row), flat.dtype).at[positions].set(flat)


def _unpack(received, sources, shapes):
    """The rows at ``sources``, cut into the output shapes."""
    flat = received[sources].reshape(-1)
    values, start = [], 0
    for shape in shapes:
        size = int(np.prod(shape, dtype=np.int64))
        values.append(flat[start:start + size].reshape(shape))
        start += size
    return values


def create(opts, backend_options=None) -> TpuProcessGroup:
    """c10d's creator for "tpu": the world group starts JAX's runtime, subgroups reuse it."""
    ranks = list(opts.global_ranks_in_group)
    if not ranks:  # the world group (c10d passes no ranks for it)
        runtime.start(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    elif runtime.world() is None:
        raise RuntimeError("a 'tpu' subgroup needs a 'tpu' world group: call "
                           "torch.distributed.init_process_group('tpu') (or 'cpu:gloo,tpu:tpu') first")
    return TpuProcessGroup(opts.store, opts.group_rank, opts.group_size, opts.timeout, ranks, opts.group_id)
