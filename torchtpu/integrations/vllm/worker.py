"""vLLM's GPU worker, on this process's tpu chip."""

from __future__ import annotations

import contextlib
import os

import torch
from vllm import envs
from vllm.logger import init_logger
from vllm.platforms import current_platform
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment
from vllm.v1.worker.worker_base import CompilationTimes

from torchtpu import config
from torchtpu.runtime import compile_cache
from torchtpu.runtime.device import runtime_memory_stats

logger = init_logger(f"vllm.{__name__}")  # under vLLM's logger, which prints INFO

# XLA's CPU backend keeps "device" memory in host RAM and reports no limit of
# its own, so vLLM's gpu_memory_utilization (a fraction of all RAM) would take
# most of the machine: give the KV cache this much unless told otherwise.
HOST_KV_CACHE_BYTES = 512 << 20


class TpuWorker(Worker):
    def init_device(self):
        if not config.current.cache_dir and not envs.VLLM_DISABLE_COMPILE_CACHE:
            # XLA's persistent cache under vLLM's cache root: a second start skips XLA's compiles.
            compile_cache.enable_disk_cache(os.path.join(envs.VLLM_CACHE_ROOT, "torchtpu_xla_cache"))
        self.device = torch.device("tpu", self.local_rank)
        current_platform.set_device(self.device)
        current_platform.check_if_supports_dtype(self.model_config.dtype)
        init_worker_distributed_environment(self.vllm_config, self.rank, self.distributed_init_method,
                                            self.local_rank, current_platform.dist_backend)
        set_random_seed(self.model_config.seed)
        self._init_workspace_and_model_runner()

    def _make_model_runner(self):
        if self.use_v2_model_runner:
            raise NotImplementedError("torchtpu runs vLLM's V1 model runner; unset VLLM_USE_V2_MODEL_RUNNER")
        from .model_runner import TpuModelRunner

        return TpuModelRunner(self.vllm_config, self.device)

    def determine_available_memory(self) -> int:
        """Bytes for the KV cache: what the user asked, else a share of the chip's free memory."""
        if self.cache_config.kv_cache_memory_bytes is not None:
            return self.cache_config.kv_cache_memory_bytes
        if not runtime_memory_stats():
            return HOST_KV_CACHE_BYTES
        free, total = torch.tpu.mem_get_info()
        used = total - free
        return max(int(total * self.cache_config.gpu_memory_utilization) - used, 0)

    def compile_or_warm_up_model(self) -> CompilationTimes:
        self.model_runner.warm_up_buckets()
        set_random_seed(self.model_config.seed, self.parallel_config.data_parallel_index)
        return CompilationTimes(language_model=self.compilation_config.compilation_time,
                                encoder=self.compilation_config.encoder_compilation_time)

    def recompiles(self) -> dict[str, int]:
        """For ``LLM.collective_rpc("recompiles")``: programs compiled since warm-up, by op."""
        return self.model_runner.recompiles()

    def graph_fallbacks(self) -> dict[str, int]:
        """For ``LLM.collective_rpc("graph_fallbacks")``: compiled graphs that ran op by op instead, by reason."""
        return dict(torch.tpu.metrics()["graph_fallbacks"])

    def _maybe_get_memory_pool_context(self, tag: str):
        # vLLM's sleep-mode memory pool is CUDA's allocator; XLA owns tpu memory.
        return contextlib.nullcontext()

    def sleep(self, level: int = 1) -> None:
        logger.warning("torchtpu: sleep mode is not supported on tpu; ignored")

    def wake_up(self, tags=None) -> None:
        logger.warning("torchtpu: sleep mode is not supported on tpu; ignored")
