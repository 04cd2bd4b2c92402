import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402

import torchtpu  # noqa: E402,F401

# The engine tests CI runs are smoke tests; the long ones (marked ``slow``: vLLM's model matrix,
# TorchTitan on 4 processes) run with ``-m slow`` or the folder's variable set to 1
# (``scripts/vllm_matrix.sh`` runs the matrix and writes its report).
SLOW_FOLDERS = {"tests/vllm/": "TORCHTPU_VLLM_ALL", "tests/titan/": "TORCHTPU_TITAN_ALL",
                "tests/sglang/": "TORCHTPU_SGLANG_ALL"}


def pytest_collection_modifyitems(config, items):
    if config.option.markexpr:
        return
    slow = [item for item in items if item.get_closest_marker("slow")
            and any(folder in item.nodeid and os.environ.get(variable) != "1"
                    for folder, variable in SLOW_FOLDERS.items())]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item not in slow]
