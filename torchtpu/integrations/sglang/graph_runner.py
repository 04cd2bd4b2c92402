"""SGLang's graph-runner slot on tpu: decode steps compiled with ``torch.compile(backend="tpu")``.

Active with ``--enable-torch-compile`` (SGLang's switch for compiled decode on
CPU). SGLang's CPU graph runner already does what a CUDA graph does for CPU: it
pads a decode batch to the next captured batch size and runs a compiled forward
for that size. This runner reuses it and changes what is compiled: the model's
forward through torchtpu's own backend, one set of XLA programs per batch-size
bucket, all compiled at start-up. Prefill and mixed batches run op by op.

SGLang 0.5.23's decoder layers build and change ``msgspec.Struct`` objects
(the residual stream's ``Contribution``, an FFN's ``ExitDecision``), which
Dynamo can neither construct nor mutate: each broke the forward into a few
graphs per layer.  While compiling, this runner swaps those classes for plain
Python classes with the same fields and methods (``use_plain_structs``), so a
decode step is one graph.
"""

from __future__ import annotations

import bisect
import dataclasses
import importlib
import logging
import sys
import time
import types
from unittest import mock

import msgspec

import torch
import torch._dynamo.config
from sglang.srt.model_executor import cpu_graph_runner
from sglang.srt.model_executor.cpu_graph_runner import CPUGraphRunner

logger = logging.getLogger(__name__)


# The Structs a decoder layer builds or changes while it runs, by defining module.
_FORWARD_STRUCTS = {
    "sglang.srt.layers.layer_boundary.residual.stream": ("Contribution", "OwedOutput", "DeclaredSum"),
    "sglang.srt.layers.layer_boundary.exit": ("ExitDecision",),
}


def plain_class(struct: type) -> type:
    """A plain Python class with ``struct``'s fields (in order, with their defaults) and methods.
    Equality is identity, as the residual stream's checks (``is``) assume."""
    fields = struct.__struct_fields__
    defaults = dict(zip(fields[len(fields) - len(struct.__struct_defaults__):], struct.__struct_defaults__))
    spec = [(name, object, dataclasses.field(default=defaults[name])) if name in defaults else (name, object)
            for name in fields]
    methods = {name: value for name, value in vars(struct).items()
               if name not in fields and isinstance(value, (types.FunctionType, property, staticmethod, classmethod))}
    namespace = {**methods, "__module__": struct.__module__, "__doc__": struct.__doc__}
    return dataclasses.make_dataclass(struct.__name__, spec, namespace=namespace, eq=False)


def use_plain_structs() -> None:
    """Replace each forward Struct, wherever an SGLang module holds it, with its plain class."""
    for module_name, names in _FORWARD_STRUCTS.items():
        module = importlib.import_module(module_name)
        for name in names:
            struct = getattr(module, name)
            if not issubclass(struct, msgspec.Struct):
                continue  # replaced already
            plain = plain_class(struct)
            for holder in list(sys.modules.values()):
                if getattr(holder, "__name__", "").startswith("sglang"):
                    for attr, value in list(vars(holder).items()):
                        if value is struct:
                            setattr(holder, attr, plain)


class TpuGraphRunner(CPUGraphRunner):
    def __init__(self, model_runner):
        use_plain_structs()
        # One compiled entry per bucket on the model's forward: Dynamo's default limit (8) is too few.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        # The CPU runner's compile set-up registers fake kernels for sgl_kernel's CPU ops and configures
        # inductor: neither exists or applies here.
        with mock.patch.object(cpu_graph_runner, "register_fake_ops", lambda tp_size: None), \
                mock.patch.object(cpu_graph_runner, "set_torch_compile_config", lambda: None):
            super().__init__(model_runner)

    def _capture(self) -> None:
        forward = torch.compile(torch.no_grad()(self.model_runner.model.forward), backend="tpu", dynamic=False)
        for bs in reversed(self.capture_bs):
            start = time.perf_counter()
            graph, output = self.capture_one_batch_size(bs, forward, skip_cross_attention=True)
            self.graphs[bs] = graph
            self.output_buffers[bs] = output
            logger.info("torchtpu: compiled the decode step for batch size %d in %.1f s", bs,
                        time.perf_counter() - start)

    def prepare_replay(self, forward_batch, skip: bool = False):
        # The attention metadata is built on the host from the padded batch's sequence lengths.
        raw_bs = forward_batch.batch_size
        if raw_bs not in self.graphs:
            bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
            seq_lens = torch.full((bs,), self.seq_len_fill_value, dtype=torch.int64)
            seq_lens[:raw_bs] = forward_batch.seq_lens_cpu
            self.captured_forward_batches[bs].seq_lens_cpu = seq_lens
        return super().prepare_replay(forward_batch, skip)
