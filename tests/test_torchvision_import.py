"""``import torchvision`` works beside our CPU torch even when it is PyPI's CUDA build (SGLang imports it).

``scripts/setup_engines.sh`` installs that build; torchtpu's ``torchvision_ops``
patch defines the two op schemas its import needs when its C++ library did not load.
"""

import subprocess
import sys

import pytest
import torch


def test_torchvision_imports_and_its_unloaded_ops_raise_clearly():
    torchvision = pytest.importorskip("torchvision", reason="torchvision is not installed (setup_engines.sh adds it)")
    import transformers.image_utils  # noqa: F401  transformers' vision helpers import torchvision

    boxes, scores = torch.tensor([[0.0, 0.0, 1.0, 1.0]]), torch.tensor([1.0])
    if torchvision.extension._has_ops():  # a CPU build: its real kernels run
        assert torchvision.ops.nms(boxes, scores, 0.5).tolist() == [0]
    else:  # torchvision's own message, and PyTorch's for the bare op
        with pytest.raises(RuntimeError, match="Couldn't load custom C\\+\\+ ops"):
            torchvision.ops.nms(boxes, scores, 0.5)
        with pytest.raises(NotImplementedError, match="Could not run 'torchvision::nms'"):
            torch.ops.torchvision.nms(boxes, scores, 0.5)


def test_torchvision_imports_before_torchtpu_is_imported_by_name():
    # `import torch` loads torchtpu through its autoload entry point, so the patch is in place first.
    pytest.importorskip("torchvision", reason="torchvision is not installed (setup_engines.sh adds it)")
    code = "import torch, torchvision, sys; sys.exit('torchtpu' not in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
