"""CI runs the vLLM smoke tests; the model matrix (marked ``slow``) runs with ``-m slow``
or TORCHTPU_VLLM_ALL=1, and ``scripts/vllm_matrix.sh`` writes its report."""

from __future__ import annotations

import os


def pytest_collection_modifyitems(config, items):
    if config.option.markexpr or os.environ.get("TORCHTPU_VLLM_ALL") == "1":
        return
    slow = [item for item in items if item.get_closest_marker("slow") and "tests/vllm/" in item.nodeid]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item not in slow]
