"""vLLM on tpu: a platform plugin, a worker and model runner, a paged-attention backend.

vLLM finds this package through two entry points (see pyproject.toml):

- ``vllm.platform_plugins`` -> :func:`platform_plugin`, asked once per process
  which platform to run; it answers torchtpu's platform unless the user opted
  out (``TORCHTPU_VLLM=0``; ``VLLM_TARGET_DEVICE=cpu`` also wins, in vLLM);
- ``vllm.general_plugins`` -> :func:`register`, run in every vLLM process,
  which registers the ``TORCHTPU`` attention backend and, when tpu is the
  platform, the mixture-of-experts method (``moe.py``).

Nothing here is imported by ``import torchtpu``.
"""

from __future__ import annotations

from .. import platform_unless_opted_out

ATTENTION_BACKEND = "TORCHTPU"
_PLATFORM = "torchtpu.integrations.vllm.platform.TpuPlatform"
_BACKEND_PATH = "torchtpu.integrations.vllm.attention.TpuAttentionBackend"


def platform_plugin() -> str | None:
    """The qualified name of torchtpu's vLLM platform, or None to stay out of the way."""
    return platform_unless_opted_out(_PLATFORM, "vllm")


def register() -> None:
    """Register the attention backend under its own name and tpu's MoE method (idempotent)."""
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    if ATTENTION_BACKEND not in AttentionBackendEnum.__members__:
        register_backend(ATTENTION_BACKEND, _BACKEND_PATH)
    # An out-of-tree op replaces vLLM's on every platform: only when tpu is the one.
    if current_platform.device_type == "tpu":
        from . import moe

        moe.register()
