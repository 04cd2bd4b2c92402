"""Runtime: per-process device state.

The chips (``device``), the execution context with its launcher and
precision (``context``), live-buffer accounting (``memory``), the random
stream (``rng``), bounded program caches (``caches``), the disk cache and
recompile logging (``compile_cache``), and every counter (``metrics``).
Nothing here knows about tensors or ops; the layers above use it.
"""
