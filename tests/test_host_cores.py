"""Several processes on one CPU host: each pins itself to its own share of the cores (runtime/device.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from torchtpu import config
from torchtpu.runtime import device

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")


def _affinity_after_import(**env) -> list[int]:
    """The CPU affinity of a fresh process after ``import torchtpu``, under torchrun-like ``env``."""
    code = "import os, torchtpu; print(sorted(os.sched_getaffinity(0)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "JAX_PLATFORMS": "cpu", **env})
    assert out.returncode == 0, out.stderr[-2000:]
    return eval(out.stdout.strip().splitlines()[-1])


def test_each_local_process_gets_its_own_cores():
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("one core: nothing to share")
    shares = [_affinity_after_import(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2") for rank in (0, 1)]
    assert shares == [cores[:len(cores) // 2], cores[len(cores) // 2:]]


def test_one_process_or_the_setting_off_leaves_the_affinity_alone():
    cores = sorted(os.sched_getaffinity(0))
    assert _affinity_after_import(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1") == cores
    assert _affinity_after_import(LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", TORCHTPU_SHARE_HOST_CORES="0") == cores


@pytest.mark.parametrize("processes, expected", [
    (2, [[0, 1], [2, 3]]),
    (3, [[0], [1], [2, 3]]),
    (4, [[0], [1], [2], [3]]),
    (6, [[0], [1], [2], [3], [0], [1]]),  # more processes than cores: they share cores round-robin
])
def test_shares_of_four_cores(monkeypatch, processes, expected):
    pinned = []
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, share: pinned.append(sorted(share)))
    monkeypatch.setattr(device, "_cpu_backend_expected", lambda: True)
    for rank in range(processes):
        device.share_host_cores(config.Config(chip=rank, local_chips=processes))
    assert pinned == expected


def test_a_tpu_or_gpu_host_is_left_alone(monkeypatch):
    pinned = []
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, share: pinned.append(share))
    monkeypatch.setattr(device, "_cpu_backend_expected", lambda: False)
    device.share_host_cores(config.Config(chip=1, local_chips=2))
    assert pinned == []
