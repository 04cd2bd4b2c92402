"""Demo: tpu:k tensors with a settable device index.

usage: demo.py {ext|dlpack} [py-guard-first]
  ext     C++ extension: guard + factory (tpu_devidx.empty_at)
  dlpack  pure Python: Python guard (index stuck at 0) + ctypes DLPack factory
"""
import os, sys, time
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # keep the installed torchtpu out of this spike
import torch
from torch.utils._pytree import tree_map
import common_backend as cb

MODE = sys.argv[1]
PY_GUARD_FIRST = "py-guard-first" in sys.argv

def attempt(name, fn):
    try:
        r = fn()
        shown = f"Tensor(device={r.device}, shape={tuple(r.shape)})" if isinstance(r, torch.Tensor) else r
        print(f"[OK]   {name}: {shown}")
        return r
    except Exception as e:
        print(f"[FAIL] {name}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")

if MODE == "ext":
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "build_cache"))
    t0 = time.time()
    import torch.utils.cpp_extension as ce
    ext = ce.load(name="tpu_devidx", sources=[os.path.join(os.path.dirname(os.path.abspath(__file__)), "ext", "tpu_devidx.cpp")],
                  build_directory=os.path.join(os.path.dirname(os.path.abspath(__file__)), "build_cache"), extra_cflags=["-O2"])
    print(f"extension load (cached build) took {time.time() - t0:.2f}s")
    ext.set_device_count(8)
    if not PY_GUARD_FIRST:
        print("install_guard before python registration; a guard was already there:", ext.install_guard())
    module = cb.make_module(ext.current_device, ext.set_device)
    # what register_python_privateuseone_device_guard returns now:
    br = torch.utils.backend_registration
    orig = torch._C._acc.register_python_privateuseone_device_guard
    torch._C._acc.register_python_privateuseone_device_guard = lambda g: print("  register_python_privateuseone_device_guard ->", orig(g)) or True
    cb.register(module)
    torch._C._acc.register_python_privateuseone_device_guard = orig
    if PY_GUARD_FIRST:
        print("install_guard after python registration; a guard was already there:", ext.install_guard())
    print("C++ guard is the active PrivateUse1 guard:", ext.guard_installed())
    ext.set_device(1)  # this process drives chip 1 (LOCAL_RANK=1)

    def factory(size, dtype, device=None, stride=None, offset=0):
        size = tuple(size)
        stride = tuple(stride) if stride is not None else cb_contig(size)
        nbytes = (offset + (1 + sum((s - 1) * st for s, st in zip(size, stride)) if all(size) else 0)) * dtype.itemsize
        idx = -1 if device is None or torch.device(device).index is None else torch.device(device).index
        return ext.empty_at(cb.next_address(nbytes), nbytes, size, stride, offset, dtype, idx)
else:
    import dlpack_ctypes
    current = [1]
    module = cb.make_module(lambda: current[0], lambda i: current.__setitem__(0, i))
    cb.register(module)

    def factory(size, dtype, device=None, stride=None, offset=0):
        size = tuple(size)
        stride = tuple(stride) if stride is not None else cb_contig(size)
        nbytes = (1 + sum((s - 1) * st for s, st in zip(size, stride)) if all(size) else 0) * dtype.itemsize
        idx = current[0] if device is None or torch.device(device).index is None else torch.device(device).index
        return dlpack_ctypes.make(cb.next_address(nbytes), idx, size, stride, dtype)

def cb_contig(size):
    st, acc = [], 1
    for s in reversed(size):
        st.append(acc); acc *= max(s, 1)
    return tuple(reversed(st))

# ---- Python kernels: allocation through the factory, everything else on meta --
lib = torch.library.Library("aten", "IMPL", "PrivateUse1")
cb.register_metadata(lib)

def empty_mf(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return factory(size, dtype or torch.get_default_dtype(), device)

def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return factory(size, dtype or torch.get_default_dtype(), device, stride)

lib.impl("empty.memory_format", empty_mf)
lib.impl("empty_strided", empty_strided)
lib.impl("copy_", lambda self, src, non_blocking=False: self)  # a real backend moves data here
FALLBACK_CALLS = []

CHECK_DEVICES = os.environ.get("CHECK_DEVICES") == "1"

def fallback(keyset, op, *args, **kwargs):
    devices, back = [], {}
    FALLBACK_CALLS.append(str(op))
    def to_meta(x):
        if isinstance(x, torch.Tensor) and x.device.type == "tpu":
            devices.append(x.device)
            m = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
            back[id(m)] = x
            return m
        if isinstance(x, torch.device) and x.type == "tpu":
            devices.append(x)
            return torch.device("meta")
        return x
    margs, mkwargs = tree_map(to_meta, (args, kwargs))
    if CHECK_DEVICES and len({d for d in devices if d.index is not None}) > 1:
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, {devices[0]} and {devices[1]}!")
    out = op(*margs, **mkwargs)
    dev = devices[0] if devices else None
    def from_meta(m):
        if isinstance(m, torch.Tensor) and m.device.type == "meta":
            if id(m) in back:
                return back[id(m)]
            return factory(m.shape, m.dtype, dev, m.stride())
        return m
    return tree_map(from_meta, out)

catch_all = torch.library.Library("_", "IMPL", "PrivateUse1")
catch_all.fallback(fallback, with_keyset=True)

# ---- the checks --------------------------------------------------------------
print("\n== device index reporting ==")
attempt("torch.tpu.current_device()", torch.tpu.current_device)
attempt("torch.accelerator.current_device_index()", torch.accelerator.current_device_index)
attempt("torch.accelerator.device_count()", torch.accelerator.device_count)
def with_idx():
    with torch.accelerator.device_index(0):
        inner = torch.accelerator.current_device_index()
    return (inner, torch.accelerator.current_device_index())
attempt("with torch.accelerator.device_index(0): (inside, after)", with_idx)
attempt("torch.accelerator.set_device_index(9) (count 8)", lambda: torch.accelerator.set_device_index(9))

print("\n== factory / views ==")
t = attempt("factory((4, 6), float32) with current index 1", lambda: factory((4, 6), torch.float32))
print("   storage.device:", t.untyped_storage().device, " data_ptr:", hex(t.data_ptr()),
      " nbytes:", t.untyped_storage().nbytes(), " keys:", torch._C._dispatch_keys(t))
attempt("t[1:]", lambda: t[1:])
attempt("t.view(24)", lambda: t.view(24))
attempt("t.t()", lambda: t.t())
attempt("t[:, 2].storage_offset()", lambda: t[:, 2].storage_offset())
attempt("t.untyped_storage() is tpu:1 and setattr on it sticks",
        lambda: (setattr(t.untyped_storage(), "_tpu_buffer", "BUF"), t[1:].untyped_storage()._tpu_buffer)[1])

print("\n== factories through Python kernels ==")
attempt("torch.empty(3, device='tpu:1')", lambda: torch.empty(3, device="tpu:1"))
attempt("torch.empty(3, device='tpu')", lambda: torch.empty(3, device="tpu"))
attempt("torch.zeros(2, 3, device='tpu:1')", lambda: torch.zeros(2, 3, device="tpu:1"))
attempt("torch.empty(3, device='tpu:0')", lambda: torch.empty(3, device="tpu:0"))
x = torch.randn(2, 3)
attempt("x.to('tpu:1')", lambda: x.to("tpu:1"))
attempt("x.to('tpu')", lambda: x.to("tpu"))
attempt("x.tpu()", lambda: x.tpu())
attempt("torch.empty(3, device='tpu:9') (count 8)", lambda: torch.empty(3, device="tpu:9"))

print("\n== device mismatch ==")
a = torch.empty(3, device="tpu:0")
b = torch.empty(3, device="tpu:1")
FALLBACK_CALLS.clear()
attempt("tpu:0 + tpu:1 (fallback does not check)", lambda: a + b)
print("   fallback calls during it:", FALLBACK_CALLS)
attempt("tpu:1.add_(tpu:0)", lambda: b.add_(a))
attempt("torch.add(tpu:1, tpu:1, out=tpu:0)", lambda: torch.add(b, b, out=a))
attempt("tpu:1 + cpu tensor", lambda: b + torch.ones(3))
attempt("tpu:1 + cpu scalar tensor", lambda: b + torch.tensor(1.0))
attempt("tpu:1.copy_(tpu:0)", lambda: b.copy_(a))
def fake_mode_add():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as m:
        fa = m.from_tensor(a); fb = m.from_tensor(b)
        return fa + fb
attempt("FakeTensorMode: tpu:0 + tpu:1", fake_mode_add)
def autograd_wrong_grad():
    w = torch.empty(3, device="tpu:1").requires_grad_()
    y = w * 2
    y.backward(torch.empty(3, device="tpu:0"))
    return w.grad
attempt("backward with grad on tpu:0 for output on tpu:1", autograd_wrong_grad)

print("\n== autograd on tpu:1 ==")
def backward():
    w = torch.empty(3, device="tpu:1").requires_grad_()
    y = (w * 2).sum()
    y.backward()
    return w.grad
attempt("(w*2).sum().backward() on tpu:1", backward)
attempt("current device after backward", torch.accelerator.current_device_index)
