"""A minimal standalone 'tpu' PrivateUse1 Python backend for the spike (independent of torchtpu)."""
import types
import torch
import torch.utils.backend_registration as br

_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_SET_STORAGE = torch.ops.aten.set_.source_Storage_storage_offset._handle
_next = [1 << 44]


def next_address(nbytes):
    a = _next[0]
    _next[0] += (nbytes // 256 + 1) * 256
    return a


class Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self):
        return True

    def has_primary_context(self, dev_id):
        return True

    def is_built(self):
        return True


class PyGuard(torch._C._acc.DeviceGuard):
    """Python guard that *tries* to report/accept index k (these methods are not bound by pybind)."""
    current = 0

    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1

    def getDevice(self):
        return torch.device("tpu", PyGuard.current)

    def get_device(self):
        return torch.device("tpu", PyGuard.current)

    def setDevice(self, d):
        PyGuard.current = d.index

    def set_device(self, d):
        PyGuard.current = d.index

    def deviceCount(self):
        return 8

    def device_count(self):
        return 8


def make_module(current_index_fn, set_index_fn=None):
    m = types.ModuleType("tpu_mod")
    m.is_available = lambda: True
    m.device_count = lambda: 8
    m.current_device = current_index_fn
    m.set_device = set_index_fn or (lambda i: None)
    m._is_in_bad_fork = lambda: False
    m.manual_seed_all = lambda s: None
    return m


def register(module=None, guard=True):
    module = module or make_module(lambda: PyGuard.current)
    br._setup_privateuseone_for_python_backend("tpu", module, Hooks(), PyGuard() if guard else None)

aten = torch.ops.aten
METADATA_OPS = [aten.as_strided.default, aten.view.default, aten._reshape_alias.default,
                aten.set_.source_Storage, aten.set_.source_Storage_storage_offset]
_libs = []


def register_metadata(lib):
    for op in METADATA_OPS:
        lib.impl(op, (lambda op: lambda *a, **k: op.redispatch(_CPU_KEYS, *a, **k))(op))
