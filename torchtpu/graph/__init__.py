"""FX graphs of ATen ops as pure jax functions (``fx.to_jax_function``), for torch.compile and fused eager."""

from . import flex_attention  # noqa: E402,F401  (registers its higher-order lowerings)
