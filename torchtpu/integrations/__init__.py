"""Serving and training engines on tpu (vLLM, SGLang, TorchTitan): optional dependencies.

Each integration is a subpackage entered through its engine's own plugin
entry point; ``import torchtpu`` never imports this package, so torchtpu
works, and imports fast, where no engine is installed.
"""


def platform_unless_opted_out(platform: str, setting: str) -> str | None:
    """An engine's platform-plugin answer: ``platform`` (a qualified class name) while torchtpu imports and
    its ``setting`` (``torchtpu.config``) is on, else None so that the engine picks its own platform."""
    try:
        from torchtpu import config
    except Exception:  # torchtpu does not import here: stay out of the engine's way
        return None
    return platform if getattr(config.current, setting) else None
