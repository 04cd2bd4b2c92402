"""torchtpu's vLLM platform: how vLLM sees the ``tpu`` device."""

from __future__ import annotations

import torch
from vllm.logger import init_logger
from vllm.platforms.interface import Platform, PlatformEnum

from torchtpu import config  # importing torchtpu registers the device

from . import ATTENTION_BACKEND

logger = init_logger(f"vllm.{__name__}")  # under vLLM's logger, which prints INFO

# A KV cache page holds this many tokens unless the user says otherwise; the TPU
# paged-attention kernel wants a multiple of 8 sublanes.
DEFAULT_BLOCK_SIZE = 16


class TpuPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "tpu"
    device_type: str = "tpu"
    dispatch_key: str = "PrivateUse1"
    ray_device_key: str = "TPU"
    device_control_env_var: str = "TORCHTPU_CHIP"
    dist_backend: str = "tpu"
    simple_compile_backend: str = "tpu"

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def check_if_supports_dtype(cls, dtype: torch.dtype) -> None:
        if dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"torchtpu: vLLM models run in bfloat16, float16 or float32 on tpu, not {dtype}")

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None) -> str:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        if attn_selector_config.use_mla or attn_selector_config.use_sparse:
            raise NotImplementedError("torchtpu's vLLM platform has no MLA or sparse attention backend yet")
        if selected_backend is not None and selected_backend.name != ATTENTION_BACKEND:
            logger.info("torchtpu: attention backend %s does not run on tpu; using %s", selected_backend.name,
                        ATTENTION_BACKEND)
        return AttentionBackendEnum[ATTENTION_BACKEND].get_path()

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return torch.tpu.get_device_name(device_id)

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return torch.tpu.get_device_properties(device_id).total_memory

    @classmethod
    def get_current_memory_usage(cls, device=None) -> float:
        return float(torch.tpu.memory_allocated(device))

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        torch.tpu.set_device(device)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.tpu.manual_seed_all(seed)

    @classmethod
    def inference_mode(cls):
        return torch.no_grad()

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def import_kernels(cls) -> None:
        """vLLM's compiled kernels (``vllm._C``) are CUDA/CPU code: tpu needs none of them."""

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        from vllm.triton_utils.dispatcher import register_kernels

        from .kernels import TRITON_KERNEL_OVERRIDES

        register_kernels(TRITON_KERNEL_OVERRIDES)

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return "vllm.distributed.device_communicators.base_device_communicator.DeviceCommunicatorBase"

    @classmethod
    def get_punica_wrapper(cls) -> str:
        raise NotImplementedError("LoRA is not supported by torchtpu's vLLM platform yet")

    @classmethod
    def supports_structured_output(cls) -> bool:
        return True

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        from vllm.config import CompilationMode, CUDAGraphMode

        from .moe import check_config as check_moe_config

        check_moe_config(vllm_config)
        cache_config = vllm_config.cache_config
        if not cache_config.user_specified_block_size:
            cache_config.block_size = DEFAULT_BLOCK_SIZE

        parallel_config = vllm_config.parallel_config
        if parallel_config.worker_cls == "auto":
            parallel_config.worker_cls = "torchtpu.integrations.vllm.worker.TpuWorker"
        parallel_config.disable_custom_all_reduce = True
        if parallel_config.world_size > 1:
            # One worker process per chip, as under torchrun: each names its own
            # chip tpu:<local rank> among this many (LOCAL_WORLD_SIZE's role).
            config.set_for_child_processes("TORCHTPU_LOCAL_CHIPS", str(parallel_config.world_size))
        if parallel_config.enable_dbo:
            logger.warning_once("torchtpu: dual-batch overlap does not apply on tpu; disabled")
            parallel_config.enable_dbo = False

        # The model runner pads every step to a token-count bucket and compiles
        # it with torchtpu's own torch.compile backend, one XLA program per
        # bucket; vLLM's own compilation (inductor, CUDA graphs) does not apply.
        compilation_config = vllm_config.compilation_config
        compilation_config.mode = CompilationMode.NONE
        compilation_config.cudagraph_mode = CUDAGraphMode.NONE
        compilation_config.cudagraph_capture_sizes = []
        compilation_config.max_cudagraph_capture_size = 0
        vllm_config.profiler_config.torch_profiler_dump_cuda_time_total = False

        # A forked child of a process whose JAX runtime started deadlocks in its
        # first compile (XLA's thread pools do not survive fork), and vLLM's front
        # end starts it when it asks for the chip's memory: start workers fresh.
        config.set_for_child_processes("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
