"""vLLM's V1 GPU model runner on tpu: per-layer KV cache tensors, a compiled step per token bucket."""

from __future__ import annotations

import contextlib
import functools
import time

import torch
from vllm.config import CUDAGraphMode
from vllm.forward_context import BatchDescriptor
from vllm.logger import init_logger
from vllm.v1.kv_cache_interface import AttentionSpec, UniformTypeKVCacheSpecs
from vllm.v1.utils import CpuGpuBuffer
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.utils import bind_kv_cache

from .attention import kv_cache_shape, kv_storage_dtype, token_bucket

logger = init_logger(__name__)

MAX_STEP_PROGRAMS = 64


@contextlib.contextmanager
def cuda_api_on_tpu():
    """Point the ``torch.cuda`` stream and event names the runner's constructor uses at ``torch.tpu``."""
    names = ("Stream", "Event", "current_stream", "default_stream", "stream", "set_stream")
    saved = {name: getattr(torch.cuda, name) for name in names}
    try:
        for name in names:
            setattr(torch.cuda, name, getattr(torch.tpu, name))
        yield
    finally:
        for name, value in saved.items():
            setattr(torch.cuda, name, value)


def copy_whole_buffer(buffer: CpuGpuBuffer, n: int | None = None) -> torch.Tensor:
    """``CpuGpuBuffer.copy_to_gpu`` for tpu: upload the whole host buffer, not its first ``n`` rows.

    Writing a prefix of a device buffer is a program per ``n``; replacing the
    buffer is a plain transfer of a fixed size. The rows past ``n`` are unused
    by the step, whichever values they hold."""
    buffer.gpu.copy_(buffer.cpu)
    return buffer.gpu if n is None else buffer.gpu[:n]


class TpuModelRunner(GPUModelRunner):
    def __init__(self, vllm_config, device: torch.device):
        with cuda_api_on_tpu():
            super().__init__(vllm_config, device)
        for buffer in self._host_device_buffers():
            buffer.copy_to_gpu = functools.partial(copy_whole_buffer, buffer)

    def _host_device_buffers(self):
        """The runner's paired host/device buffers (inputs, positions, block tables, ...)."""
        owners = [self, self.input_batch, *self.input_batch.block_table.block_tables]
        for owner in owners:
            for value in vars(owner).values():
                if isinstance(value, CpuGpuBuffer):
                    yield value

    def load_model(self, *args, **kwargs) -> None:
        super().load_model(*args, **kwargs)
        if not self.model_config.enforce_eager:
            # The CUDA-graph equivalent: one XLA program per step shape (token
            # bucket, requests, pages), compiled at first use, then replayed.
            # Only forward is wrapped: vLLM reads the model's class to learn its tasks.
            self.model.forward = torch.compile(self.model.forward, backend="tpu", dynamic=False, fullgraph=True)
            # One program per token bucket: there can be more than Dynamo's default 8.
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, MAX_STEP_PROGRAMS)

    def _sync_device(self) -> None:
        torch.tpu.synchronize()

    def _to_list(self, sampled_token_ids: torch.Tensor) -> list[list[int]]:
        return sampled_token_ids.tolist()

    def token_buckets(self) -> list[int]:
        """Every padded token count a step can take: powers of two up to the batch budget."""
        limit = self.scheduler_config.max_num_batched_tokens
        return sorted({token_bucket(n, limit) for n in range(1, limit + 1)})

    def _get_slot_mappings(self, num_tokens_padded, num_reqs_padded, num_tokens_unpadded, ubatch_slices=None):
        # The forward context's slot mappings are read inside the compiled step:
        # pad them to the step's bucket too, or each token count is a new program.
        padded = token_bucket(num_tokens_unpadded, self.scheduler_config.max_num_batched_tokens)
        return super()._get_slot_mappings(padded, num_reqs_padded, num_tokens_unpadded, ubatch_slices)

    def _determine_batch_execution_and_padding(self, num_tokens, *args, **kwargs):
        # Pad every step to its token bucket, so each bucket's programs compile once.
        mode, descriptor, ubatch, across_dp, stats = super()._determine_batch_execution_and_padding(
            num_tokens, *args, **kwargs)
        padded = token_bucket(num_tokens, self.scheduler_config.max_num_batched_tokens)
        return CUDAGraphMode.NONE, BatchDescriptor(num_tokens=padded), ubatch, across_dp, stats

    def initialize_kv_cache_tensors(self, kv_cache_config, kernel_block_sizes, kv_cache_allocation_context=None):
        """One native-dtype tensor per layer, in the paged-attention kernel's layout."""
        kv_caches: dict[str, torch.Tensor] = {}
        for tensor in kv_cache_config.kv_cache_tensors:
            num_blocks = kv_cache_config.num_blocks_of(tensor)
            for layer_name in tensor.layers:
                spec = self._layer_spec(kv_cache_config, layer_name)
                kv_caches[layer_name] = torch.zeros(kv_cache_shape(num_blocks, spec),
                                                    dtype=kv_storage_dtype(spec.dtype), device=self.device)
        for layer_name, target_layer_name in self.shared_kv_cache_layers.items():
            kv_caches[layer_name] = kv_caches[target_layer_name]
        bind_kv_cache(kv_caches, self.compilation_config.static_forward_context, self.kv_caches,
                      kv_cache_groups=kv_cache_config.kv_cache_groups)
        return kv_caches

    @staticmethod
    def _layer_spec(kv_cache_config, layer_name: str) -> AttentionSpec:
        group = next(g for g in kv_cache_config.kv_cache_groups if layer_name in g.layer_names)
        spec = group.kv_cache_spec
        if isinstance(spec, UniformTypeKVCacheSpecs):
            spec = spec.kv_cache_specs[layer_name]
        if not isinstance(spec, AttentionSpec):
            raise NotImplementedError(f"torchtpu: KV cache of kind {type(spec).__name__} (layer {layer_name}) "
                                      "is not supported on tpu yet")
        return spec

    def warm_up_buckets(self) -> None:
        """Run every token bucket once, so serving compiles nothing new."""
        buckets = self.token_buckets()
        start = time.perf_counter()
        for i, n in enumerate(buckets, 1):
            self._dummy_run(n, force_attention=True)
            logger.info("torchtpu: warmed up token bucket %d (%d/%d, %.1f s)", n, i, len(buckets),
                        time.perf_counter() - start)
        torch.tpu.synchronize()
        self.compiles_after_warm_up = dict(torch.tpu.compile_stats())

    def recompiles(self) -> dict[str, int]:
        """Programs compiled since warm-up, by op: serving should compile none."""
        now = torch.tpu.compile_stats()
        before = getattr(self, "compiles_after_warm_up", {})
        return {op: n - before.get(op, 0) for op, n in now.items() if n > before.get(op, 0)}
