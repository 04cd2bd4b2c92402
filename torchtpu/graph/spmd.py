"""Graph ops that span processes (collectives): the extension point the layers above fill.

The lowering table (``ops/``) lowers an op from its operands alone.  A
collective in a graph (``torch.ops._c10d_functional.all_reduce``, say) also
needs the processes it runs with: a mesh, the mesh axis of its group, and a
program that every process of the mesh runs together.  That knowledge lives
in ``distributed/``, above this layer, so ``graph/`` and ``compile/`` reach
it through this registry: a ``Handler`` registered for an op namespace
(``register("_c10d_functional", handler)``) plans each graph whose nodes
use that namespace.

A graph with such nodes gets a ``Plan`` (``fx.spmd_plan(gm)``):

- ``lower(node, args, kwargs)`` gives a node's value inside the program;
- ``arguments(node)`` gives any node's arguments inside it (numbers that differ
  between processes, such as a shard's own index range, become run-time values);
- when ``spans_processes``, the graph's jax function runs as SPMD: ``shard``
  wraps it (a function of this process's arrays) into a ``Sharded``: a
  function of global arrays, one block per process along dim 0 (a
  ``shard_map``), whose ``to_global`` / ``to_local`` convert this process's
  arrays to and from those global arrays around the call.
  ``compile/dynamo.py`` jits it as one program, as it jits any graph.

A handler that cannot plan a graph raises ``fx.UnsupportedGraph`` with the
reason, and the graph runs op by op instead (counted in
``torch.tpu.metrics()["graph_fallbacks"]``).
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch


class Plan(Protocol):
    """How one graph's process-spanning ops run."""

    spans_processes: bool  # False: the ops are local (``wait_tensor`` alone), the graph runs as any other

    def lower(self, node: torch.fx.Node, args, kwargs):
        """The node's value (jax), traced inside the program ``shard`` makes."""

    def arguments(self, node: torch.fx.Node):
        """Any node's ``(args, kwargs)`` inside the program: its own, or with the numbers that
        differ between the processes (each rank's shard bakes in its own) as run-time values."""

    def shard(self, fn: Callable, arrays: list, numbers: list, label: str) -> "Sharded":
        """``fn(*arrays, *numbers) -> pytree of arrays`` on this process's blocks, as one SPMD
        program over the plan's processes.  ``label`` names the graph and its signature in
        errors (processes that disagree on what to compile)."""


class Sharded(Protocol):
    """A graph's function as an SPMD program, and the conversions around it."""

    def __call__(self, *global_arrays_and_numbers):
        """The jittable program: global arrays (``to_global``) and numbers in, global arrays out."""

    def to_global(self, arrays: list) -> list:
        """This process's arrays as its blocks of the global arrays the program takes."""

    def to_local(self, results):
        """This process's blocks of the program's global results (same pytree)."""


class Handler(Protocol):
    def plan(self, gm: torch.fx.GraphModule) -> Plan:
        """The plan for a graph holding ops of this handler's namespaces; raises
        ``fx.UnsupportedGraph`` with the reason when it cannot run them."""


_HANDLERS: dict[str, Handler] = {}


def register(namespace: str, handler: Handler) -> None:
    """Lower every op of ``torch.ops.<namespace>`` in graphs through ``handler`` (idempotent)."""
    _HANDLERS[namespace] = handler


def handler_of(op) -> Handler | None:
    """The handler registered for ``op``'s namespace, if any."""
    if not isinstance(op, torch._ops.OpOverload):
        return None
    return _HANDLERS.get(op.namespace)


def handlers_in(gm: torch.fx.GraphModule) -> list[Handler]:
    """The distinct handlers of ``gm``'s process-spanning ops, in graph order."""
    found = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and (h := handler_of(node.target)) is not None:
            found.setdefault(id(h), h)
    return list(found.values())
