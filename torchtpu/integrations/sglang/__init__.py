"""SGLang on tpu: a platform plugin and an attention backend for SGLang's runtime.

SGLang finds this package through two entry points (see pyproject.toml):

- ``sglang.srt.platforms`` -> :func:`activate`, asked once per process which
  platform to run; it answers torchtpu's platform unless the user opted out
  (``TORCHTPU_SGLANG=0``);
- ``sglang.srt.plugins`` -> :func:`register`, run in every SGLang process
  (SGLang spawns its scheduler and detokenizer), which registers the ``tpu``
  attention backend and adds it to the command line's choices.

Nothing here is imported by ``import torchtpu``.
"""

from __future__ import annotations

from .. import platform_unless_opted_out

ATTENTION_BACKEND = "tpu"
_PLATFORM = "torchtpu.integrations.sglang.platform.TpuSRTPlatform"


def activate() -> str | None:
    """The qualified name of torchtpu's SGLang platform, or None to stay out of the way."""
    return platform_unless_opted_out(_PLATFORM, "sglang")


def register() -> None:
    """Register the ``tpu`` attention backend and make ``--attention-backend tpu`` a valid choice (idempotent)."""
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend

    if ATTENTION_BACKEND not in ATTENTION_BACKEND_CHOICES:
        ATTENTION_BACKEND_CHOICES.append(ATTENTION_BACKEND)
    if ATTENTION_BACKEND not in ATTENTION_BACKENDS:
        register_attention_backend(ATTENTION_BACKEND)(_create_attention_backend)


def _create_attention_backend(runner):
    from .attention import TpuAttnBackend

    return TpuAttnBackend(runner)
