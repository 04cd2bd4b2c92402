"""The executors: strict, debug and fused eager, and FX graphs as jax functions (see ARCHITECTURE.md)."""
