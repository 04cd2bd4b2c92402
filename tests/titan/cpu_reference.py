"""TorchTitan's trainer on the CPU with gloo: the oracle of test_torchtitan.py, run as ``python cpu_reference.py FLAGS``.

TorchTitan 0.2.2 has no CPU mode: its device lookup falls back to CUDA. Here
the lookup answers "cpu", ``torch.cpu`` gets the device-module calls TorchTitan
makes that it lacks (names, memory statistics, an index from current_device),
FSDP reduce-scatters gradients with SUM and scales them afterwards, as gloo
has no PREMUL_SUM (the same gradients), and ``torch.histc`` counts integer
expert ids in their own dtype (the MoE router's; CUDA's histc takes integers,
the CPU's only floats). None of this is needed on tpu.
"""

import os
import runpy
import types

import torch
import torch._utils
from torch.distributed.fsdp import FSDPModule

torch._utils._get_available_device_type = lambda: "cpu"
_memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
torch.cpu.get_device_name = lambda device=None: "cpu"
torch.cpu.get_device_properties = lambda device=None: types.SimpleNamespace(total_memory=_memory)
torch.cpu.current_device = lambda: 0
torch.cpu.reset_peak_memory_stats = lambda device=None: None
torch.cpu.empty_cache = lambda: None
torch.cpu.memory_stats = lambda device=None: {"active_bytes.all.peak": 0, "reserved_bytes.all.peak": 0,
                                             "num_alloc_retries": 0, "num_ooms": 0}

_histc = torch.histc


def _histc_of_integers(input, bins=100, min=0, max=0, *, out=None):
    if input.is_floating_point() or out is not None:
        return _histc(input, bins, min, max, out=out)
    return _histc(input.float(), bins, min, max).to(input.dtype)  # counts in the input's dtype, as on CUDA


torch.histc = _histc_of_integers

_set_divide_factor = FSDPModule.set_gradient_divide_factor


def _set_divide_factor_summing(self, factor):
    _set_divide_factor(self, factor)
    self.set_force_sum_reduction_for_comms(True)


FSDPModule.set_gradient_divide_factor = _set_divide_factor_summing

if __name__ == "__main__":
    runpy.run_module("torchtitan.train", run_name="__main__")
