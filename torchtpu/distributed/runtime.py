"""JAX's multi-process runtime under the c10d backend.

- ``start``: ``jax.distributed.initialize`` once per process, for the world
  group.  Rank 0 publishes a coordinator address through the c10d store.  It
  must run before any JAX backend starts, so ``init_process_group`` comes
  before the first tpu tensor.
- ``GroupMesh``: a 1-D mesh with one device per process of a group, in group
  rank order, and the conversion of this process's block to and from the
  global array a ``shard_map`` program takes.
- ``cached`` / ``build_program``: the bounded cache of jitted ``shard_map`` programs.
"""

from __future__ import annotations

import datetime
import functools
import socket

import jax
import numpy as np
import torch.distributed as dist
from jax._src import core  # the global array's abstract value, made once per shape
from jax._src.array import ArrayImpl
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ..core import tensor
from ..runtime import caches, metrics
from ..runtime import device as runtime_device

AXIS = "ranks"  # the mesh axis the ranks of a group lie along
_COORDINATOR_KEY = "torchtpu/jax_coordinator"

# (rank, size) of the world JAX's runtime serves, once started.  JAX cannot
# restart it after its backend ran a computation, so a later world (after
# destroy_process_group) must be the same one.
_world: tuple[int, int] | None = None


# ---- starting JAX's runtime -------------------------------------------------------------------


def start(store, rank: int, size: int, timeout: datetime.timedelta) -> None:
    """Connect this process to the others through ``jax.distributed`` (once per process)."""
    global _world
    if _world == (rank, size):
        return  # a new world group over the same processes: JAX's runtime serves it as it is
    if _world is not None:
        _restart_for_another_world(rank, size)
    if size == 1:
        _world = (rank, size)  # one process: its own device is the whole mesh
        return
    if jax.distributed.is_initialized():  # the user started it: it must be this world
        _check_jax_world(rank, size)
        _world = (rank, size)
        return
    if _backend_started():
        raise RuntimeError(
            "init_process_group('tpu') must come before this process creates tpu tensors or runs JAX "
            "computations: JAX's multi-process runtime (jax.distributed) can only start before its backend "
            "does. Call torch.distributed.init_process_group first.")
    address = _share_coordinator_address(store, rank, timeout)
    jax.distributed.initialize(coordinator_address=address, num_processes=size, process_id=rank,
                               initialization_timeout=max(1, int(timeout.total_seconds())))
    _world = (rank, size)


def _restart_for_another_world(rank: int, size: int) -> None:
    global _world
    old_rank, old_size = _world
    if _backend_started() and old_size > 1:
        raise RuntimeError(
            f"init_process_group('tpu'): this process already served a world of {old_size} processes as rank "
            f"{old_rank}, and JAX cannot restart its multi-process runtime once it ran a computation; a new "
            f"world must have the same size and rank (got rank {rank} of {size}). Start a new process.")
    if jax.distributed.is_initialized():
        jax.distributed.shutdown()
    _world = None


def _check_jax_world(rank: int, size: int) -> None:
    if (jax.process_index(), jax.process_count()) != (rank, size):
        raise RuntimeError(
            f"init_process_group('tpu'): jax.distributed was already started as process "
            f"{jax.process_index()} of {jax.process_count()}, but this is rank {rank} of {size}")


def _backend_started() -> bool:
    from jax._src import xla_bridge  # no public way to ask

    return xla_bridge.backends_are_initialized()


def _share_coordinator_address(store, rank: int, timeout: datetime.timedelta) -> str:
    """Rank 0 picks a free port on its host; every rank reads "host:port" from the store."""
    if rank == 0:
        store.set(_COORDINATOR_KEY, f"{_reachable_host(store)}:{_free_port()}")
    try:
        store.wait([_COORDINATOR_KEY], timeout)
    except Exception as error:  # noqa: BLE001 (the store's own timeout error type varies)
        raise RuntimeError(f"init_process_group('tpu'): rank 0 did not publish JAX's coordinator address "
                           f"within {timeout}: {error}") from error
    return store.get(_COORDINATOR_KEY).decode()


def _reachable_host(store) -> str:
    """An address of this host the other ranks can reach: the one it uses to reach the
    c10d store, which every rank reaches (127.0.0.1 on one host)."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    if isinstance(store, dist.TCPStore):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((store.host, store.port))  # UDP: picks the route, sends nothing
                return probe.getsockname()[0]
        except OSError:
            pass
    return socket.gethostbyname(socket.gethostname())


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def world() -> tuple[int, int] | None:
    """(rank, size) of the world JAX's runtime serves, or None before the first init."""
    return _world


# ---- meshes and global arrays ------------------------------------------------------------------


def _device_of_each_process() -> dict:
    """process index -> the device a process's tpu tensors live on (its first local device)."""
    devices = {}
    for device in sorted(jax.devices(), key=lambda d: d.id):
        devices.setdefault(device.process_index, device)
    return devices


class GroupMesh:
    """One device per process of a group, in group-rank order, as a 1-D mesh along ``AXIS``."""

    def __init__(self, global_ranks):
        self.ranks = tuple(global_ranks)
        if _world is not None and _world[1] == 1:
            devices = [jax.local_devices()[0]]
        else:
            by_process = _device_of_each_process()  # process index == global rank: start() made it so
            devices = [by_process[r] for r in self.ranks]
        self.size = len(devices)
        self.mesh = Mesh(np.array(devices, dtype=object), (AXIS,))
        self.sharding = NamedSharding(self.mesh, PartitionSpec(AXIS))
        self.own_device = devices[self.ranks.index(_world[0])] if _world else devices[0]

    def globalize(self, local: jax.Array) -> jax.Array:
        """This process's block as its shard of a global array (no copy; 0-dim becomes (1,))."""
        if local.ndim == 0:
            local = local.reshape(1)
        if local.devices() == {self.own_device}:
            fast = _wrap_shard(self._global_aval(local.shape, local.dtype), self.sharding, local)
            if fast is not None:
                return fast
        else:  # the block lives elsewhere (another local device): move it once
            local = jax.device_put(local, self.own_device)
        shape = (self.size * local.shape[0], *local.shape[1:])
        return jax.make_array_from_single_device_arrays(shape, self.sharding, [local])

    @functools.lru_cache(maxsize=256)  # noqa: B019 (meshes live as long as their process group)
    def _global_aval(self, block_shape, dtype):
        shape = (self.size * block_shape[0], *block_shape[1:])
        return core.update_aval_with_sharding(core.ShapedArray(shape, dtype, weak_type=False), self.sharding)

    @staticmethod
    def local(global_array: jax.Array) -> jax.Array:
        return global_array.addressable_data(0)  # this process holds one shard


def _wrap_shard(aval, sharding, local: jax.Array):
    """``jax.make_array_from_single_device_arrays`` for the one-shard case, without its
    per-call shape and device checks (``globalize`` made them), which cost as much as a
    small collective; None where this JAX lacks the constructor."""
    try:
        return ArrayImpl(aval, sharding, [local], committed=True, _skip_checks=True)
    except TypeError:
        return None


# ---- programs ----------------------------------------------------------------------------------

# Jitted shard_map programs by (collective, parameters, operand signature, mesh ranks).
PROGRAMS = caches.BoundedCache("collective programs")


def cached(key):
    return PROGRAMS.get(key)


def build_program(key, name: str, mesh: GroupMesh, body, operands: int, outputs: int):
    """A jitted shard_map of ``body`` (blocks in, a block or tuple of blocks out) over ``mesh``."""
    out_specs = PartitionSpec(AXIS) if outputs == 1 else (PartitionSpec(AXIS),) * outputs
    program = jax.jit(jax.shard_map(body, mesh=mesh.mesh, in_specs=(PartitionSpec(AXIS),) * operands,
                                    out_specs=out_specs, check_vma=False))
    PROGRAMS[key] = program
    metrics.count(metrics.compiles, f"collective {name}")
    return program


def local_program(key, name: str, fn):
    """A jitted function of this process's arrays only (packing for all_to_all), cached alike."""
    program = PROGRAMS.get(key)
    if program is None:
        program = PROGRAMS[key] = jax.jit(fn)
        metrics.count(metrics.compiles, f"collective {name}")
    return program


# XLA's CPU client runs a program whose inputs are ready at once, in the calling
# thread, and defers one whose inputs are still being computed: two collectives
# could then run in different orders on two ranks and their gloo messages cross
# (seen in fused mode).  Waiting for the inputs first keeps every rank's
# collectives in the order they were issued.  TPU and GPU run in issue order.
@functools.lru_cache(maxsize=None)
def inputs_first() -> bool:
    return runtime_device.platform() == "cpu"


def wait_for_inputs(arrays) -> None:
    """Before a program with collectives: wait for its inputs where the platform could reorder it."""
    if inputs_first() and not all(a.is_ready() for a in arrays):
        jax.block_until_ready(arrays)


def run(program, mesh: GroupMesh, operands) -> list:
    """Run ``program`` on this process's blocks; this process's block of each output."""
    wait_for_inputs(operands)
    with tensor.x64():  # int64 stays int64 while tracing
        outputs = program(*[mesh.globalize(a) for a in operands])
    if not isinstance(outputs, (tuple, list)):
        outputs = (outputs,)
    return [mesh.local(o) for o in outputs]
