"""The public ``torch.tpu`` surface, declared in one table.

``torch.tpu`` is built from this table and holds nothing else, so a module
imported for internal use never becomes public by accident.
``tests/test_public_api.py`` snapshots the surface: adding or removing a
public name is a deliberate change to this table and to that snapshot.
"""

# submodule of torchtpu.api -> the names it makes public in torch.tpu
PUBLIC_API = {
    "device": (
        "is_available", "is_initialized", "device_count", "current_device", "set_device", "device",
        "get_device_name", "get_device_properties", "DeviceProperties", "synchronize",
    ),
    "memory": (
        "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved", "memory_stats",
        "reset_peak_memory_stats", "mem_get_info", "empty_cache",
    ),
    "random": (
        "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state", "set_rng_state",
        "get_rng_state_all", "set_rng_state_all",
    ),
    "streams": ("Stream", "StreamContext", "Event", "default_stream", "current_stream", "set_stream", "stream"),
    "precision": ("Precision", "get_precision", "precision", "get_amp_supported_dtype"),
    "execution": (
        "EagerMode", "get_eager_mode", "set_eager_mode", "eager_mode", "debug_checks", "NonFiniteError",
        "set_max_fused_ops", "get_max_fused_ops",
    ),
    "metrics": (
        "metrics", "reset_metrics", "fallback_stats", "compile_stats", "host_sync_stats", "compile_cache_stats",
        "graph_break_stats", "fused_stats",
    ),
    "bucketing": ("bucket_size", "pad_to_bucket"),
}

# Public submodules: torch.tpu.pallas is torchtpu.api.pallas.
PUBLIC_SUBMODULES = ("pallas",)

# Names PyTorch itself calls on a device module (torch.utils.backend_registration, the
# autograd engine, torch.random's fork_rng): present, but not part of the documented surface.
PYTORCH_PROTOCOL = {"device": ("_lazy_init", "_is_in_bad_fork")}
