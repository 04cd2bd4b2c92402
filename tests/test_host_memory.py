"""On XLA's CPU backend, freed large buffers stay in the process for the next run
(runtime/device.py: reuse_host_memory) instead of being mapped afresh, one page fault per page."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from torchtpu import config
from torchtpu.runtime import device

# Each step makes 32 MiB results (above what a malloc arena of an XLA thread can hold) and frees them.
_STEPS = """
import resource, statistics, torch, torchtpu
x = torch.randn(8192, 1024, device="tpu")
w = torch.randn(1024, 1024, device="tpu") / 32
def step():
    y = torch.tanh(x @ w)
    torch.tpu.synchronize()
faulted = []
for _ in range(25):  # the heap grows now and then, mostly over the first ten steps or so
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    faulted.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) * resource.getpagesize())
print(torchtpu.runtime.device.host_memory_reused, statistics.median(faulted[5:]) / 2**20)
"""


def _fresh_memory_per_step(**env) -> tuple[bool, float]:
    """Whether a fresh process made malloc keep its memory, and the MiB it page-faulted in a median step."""
    out = subprocess.run([sys.executable, "-c", _STEPS], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "JAX_PLATFORMS": "cpu", **env})
    assert out.returncode == 0, out.stderr[-2000:]
    applied, mib = out.stdout.split()[-2:]
    return applied == "True", float(mib)


@pytest.mark.skipif(device._glibc() is None, reason="malloc's settings are glibc's")
def test_freed_results_are_reused_rather_than_faulted_in_again():
    applied, mib = _fresh_memory_per_step()
    applied_off, mib_off = _fresh_memory_per_step(TORCHTPU_REUSE_HOST_MEMORY="0")
    assert (applied, applied_off) == (True, False)
    assert mib_off > 16, "the setting off: each step maps its 32 MiB result afresh"
    # Alone it is 0 MiB; on a loaded host (CI's other worker) the heap grew in more steps once (16 MiB).
    assert mib < mib_off / 4, f"the setting on: {mib:.1f} MiB of new memory per step, off: {mib_off:.1f}"


def test_a_tpu_or_gpu_host_keeps_mallocs_defaults(monkeypatch):
    monkeypatch.setattr(device, "_cpu_backend_expected", lambda: False)
    monkeypatch.setattr(device, "_glibc", lambda: pytest.fail("malloc must not be touched"))
    assert device.reuse_host_memory(config.Config()) is False
