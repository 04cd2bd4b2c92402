"""torchtpu's SGLang platform: how SGLang's runtime sees the ``tpu`` device."""

from __future__ import annotations

import logging
import os

import torch
from sglang.srt.platforms.device_mixin import DeviceCapability, PlatformEnum
from sglang.srt.platforms.interface import PlatformCapabilities, SRTPlatform

from torchtpu import config  # importing torchtpu registers the device

from . import ATTENTION_BACKEND

logger = logging.getLogger(__name__)

# The decode batch sizes compiled at start-up; a batch runs padded to the next one.
DECODE_BATCH_BUCKETS = [1, 2, 4, 8, 16, 32]


class TpuSRTPlatform(SRTPlatform):
    _enum = PlatformEnum.OOT
    device_name: str = "tpu"
    device_type: str = "tpu"
    # No Triton on tpu: SGLang's allocator and request-to-token writers take their torch paths.
    # Decode steps run compiled per batch-size bucket (graph_runner.py).
    capabilities = PlatformCapabilities(graph_capture=True)

    # --- the device --------------------------------------------------------------------------

    def get_device(self, device_id: int = 0) -> torch.device:
        return torch.device("tpu", device_id)

    def set_device(self, device: torch.device) -> None:
        torch.tpu.set_device(device)

    def get_device_name(self, device_id: int = 0) -> str:
        return torch.tpu.get_device_name(device_id)

    def get_device_uuid(self, device_id: int = 0) -> str:
        return f"tpu-{config.current.chip}"

    def get_device_capability(self, device_id: int = 0) -> DeviceCapability | None:
        return None  # no CUDA compute capability: SGLang's capability-gated kernels stay off

    def get_device_total_memory(self, device_id: int = 0) -> int:
        return int(torch.tpu.get_device_properties(device_id).total_memory)

    def get_current_memory_usage(self, device=None) -> float:
        return float(torch.tpu.memory_allocated(device))

    def get_available_memory(self, device_id: int = 0) -> tuple[int, int]:
        return torch.tpu.mem_get_info(device_id)

    def empty_cache(self) -> None:
        torch.tpu.empty_cache()

    def synchronize(self) -> None:
        torch.tpu.synchronize()

    def is_pin_memory_available(self, device=None) -> bool:
        return False

    def get_torch_distributed_backend_str(self) -> str:
        return "tpu"

    def get_group_coordinator_device(self, local_rank: int) -> torch.device:
        return torch.device("tpu", local_rank)

    @classmethod
    def seed_everything(cls, seed: int | None = None) -> None:
        if seed is not None:
            torch.manual_seed(seed)
            torch.tpu.manual_seed_all(seed)

    @classmethod
    def inference_mode(cls):
        # Inference tensors would refuse the in-place KV-cache writes torchtpu makes on their storages.
        return torch.no_grad()

    def get_torch_profiler_activity_str(self) -> str:
        return "CPU"

    def get_torch_profiler_activity(self) -> torch.profiler.ProfilerActivity:
        return torch.profiler.ProfilerActivity.CPU

    def init_backend(self) -> None:
        """Once per SGLang worker: XLA's persistent cache under SGLang's cache folder (a second start
        skips XLA's compiles), unless ``TORCHTPU_CACHE_DIR`` already chose one."""
        if not config.current.cache_dir:
            from sglang.srt.environ import envs

            from torchtpu.runtime import compile_cache

            compile_cache.enable_disk_cache(os.path.join(os.path.expanduser(envs.SGLANG_CACHE_DIR.get()),
                                                         "torchtpu_xla_cache"))

    # --- SGLang's subsystems -----------------------------------------------------------------

    def post_load_model(self, model: torch.nn.Module) -> None:
        from .weights import store_linear_weights_in_out

        restored = store_linear_weights_in_out(model)
        if restored:
            logger.info("torchtpu: %d linear weights stored [in, out] (XLA:CPU's fast bfloat16 layout)", restored)

    def get_kv_pool_cls(self, *, kind: str) -> type | None:
        """Where the ragged paged-attention kernel runs, SGLang's MHA pool in the kernel's layout."""
        from .attention import kernel_wanted

        if kind == "mha" and kernel_wanted():
            from .kv_pool import InterleavedKVPool

            return InterleavedKVPool
        return None

    def get_default_attention_backend(self) -> str:
        return ATTENTION_BACKEND

    def get_graph_runner_cls(self) -> type:
        from .graph_runner import TpuGraphRunner

        return TpuGraphRunner

    def get_compile_backend(self, mode: str | None = None) -> str:
        return "tpu"

    def get_dispatch_key_name(self) -> str:
        return "native"  # SGLang's fused ops run their forward_native (torch ops) on tpu

    def apply_server_args_defaults(self, server_args) -> None:
        """Settings SGLang's CUDA defaults would get wrong on tpu."""
        server_args.sampling_backend = "pytorch"
        server_args.disable_overlap_schedule = True  # one host thread drives the chip
        # With --enable-torch-compile, decode is compiled per batch-size bucket (graph_runner.py); without it,
        # and always for prefill, the model runs op by op.
        from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, with_phase

        graphs = server_args.cuda_graph_config
        locked = getattr(server_args, "_cuda_graph_config_locked", set())
        if (Phase.DECODE, "bs") not in locked:
            graphs = with_phase(graphs, Phase.DECODE, bs=DECODE_BATCH_BUCKETS)
        if (Phase.DECODE, "backend") not in locked and not server_args.enable_torch_compile:
            graphs = with_phase(graphs, Phase.DECODE, backend=Backend.DISABLED)
        if (Phase.PREFILL, "backend") not in locked:
            graphs = with_phase(graphs, Phase.PREFILL, backend=Backend.DISABLED)
        server_args.cuda_graph_config = graphs
        from .attention import KERNEL_PAGE_SIZE, kernel_wanted

        if kernel_wanted() and server_args.page_size is None:  # None: not given (SGLang's own default, 1, comes later)
            server_args.page_size = KERNEL_PAGE_SIZE
        if server_args.attention_backend is None:
            server_args.attention_backend = ATTENTION_BACKEND
        for name in ("prefill_attention_backend", "decode_attention_backend"):
            if getattr(server_args, name, None) is None:
                setattr(server_args, name, server_args.attention_backend)
