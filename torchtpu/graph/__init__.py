"""FX graphs of ATen ops as pure jax functions (``fx.to_jax_function``), for torch.compile and fused eager."""
