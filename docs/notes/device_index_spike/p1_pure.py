"""Step 1: can pure Python make a tensor on tpu:1?"""
import traceback
import torch
import common_backend as cb

cb.register()
# torch.empty on tpu:1 with a python kernel that can only make index-0 tensors
lib = torch.library.Library("aten", "IMPL", "PrivateUse1")
def empty_mf(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    print("       empty kernel got device", device, "size", size)
    t = torch._C._acc.create_empty_tensor((0,), dtype or torch.float32)
    st = torch._C._construct_storage_from_data_pointer(cb.next_address(4 * 8), torch.device("tpu", 0), 4 * 8)
    cb._SET_STORAGE.redispatch_boxed(cb._CPU_KEYS, t, st, 0, tuple(size), (1,) * len(size))
    return t
lib.impl("empty.memory_format", empty_mf)
cb.register_metadata(lib)

def attempt(name, fn):
    try:
        r = fn()
        shown = f"Tensor(device={r.device}, shape={tuple(r.shape)})" if isinstance(r, torch.Tensor) else r
        print(f"[OK]   {name}: {shown}")
        return r
    except Exception as e:
        msg = str(e).split("\n")[0]
        print(f"[FAIL] {name}: {type(e).__name__}: {msg}")

dev1 = torch.device("tpu", 1)
addr = cb.next_address(64)
st1 = attempt("storage from data pointer on tpu:1 (.device)",
              lambda: torch._C._construct_storage_from_data_pointer(addr, dev1, 64).device)
st1 = torch._C._construct_storage_from_data_pointer(addr, dev1, 64)
import dlpack_ctypes
d1 = attempt("DLPack capsule (ctypes) kDLExtDev device_id=1", lambda: dlpack_ctypes.make(cb.next_address(64), 1, (4, 4), (4, 1), torch.float32))
if d1 is not None:
    print("       device", d1.device, "storage.device", d1.untyped_storage().device, "nbytes", d1.untyped_storage().nbytes(),
          "ptr", hex(d1.data_ptr()), "keys", torch._C._dispatch_keys(d1))
    print("       views:", d1[1:].device, d1.view(16).device, d1.t().device, d1[1:].storage_offset())
    st1 = d1.untyped_storage()
t0 = torch._C._acc.create_empty_tensor((0,), torch.float32)
print("create_empty_tensor device:", t0.device)

def set_cpu():
    cb._SET_STORAGE.redispatch_boxed(cb._CPU_KEYS, t0, st1, 0, (4,), (1,))
    return t0.device
attempt("set_ (CPU redispatch) tpu:0 tensor <- tpu:1 storage", set_cpu)

# guard: python methods are not bound; see what C++ sees
attempt("torch.accelerator.current_accelerator()", lambda: torch.accelerator.current_accelerator())
attempt("torch.accelerator.device_count()", lambda: torch.accelerator.device_count())
cb.PyGuard.current = 1
attempt("torch._C._accelerator_getDeviceIndex() with PyGuard.current=1", lambda: torch._C._accelerator_getDeviceIndex())
attempt("torch.accelerator.set_device_index(1)", lambda: torch.accelerator.set_device_index(1))
attempt("torch._C._accelerator_setDeviceIndex(1)", lambda: torch._C._accelerator_setDeviceIndex(1))
attempt("torch._C._accelerator_exchangeDevice(1)", lambda: torch._C._accelerator_exchangeDevice(1))
attempt("torch._C._accelerator_getDeviceIndex() after", lambda: torch._C._accelerator_getDeviceIndex())
attempt("torch.tpu.current_device() (python module)", lambda: torch.tpu.current_device())

e = attempt("torch.empty(3, device='tpu:1') via a kernel making tpu:0", lambda: torch.empty(3, device="tpu:1"))
if e is not None:
    print("       -> result device", e.device, "(no check that the result is on the requested device)")

attempt("torch.Tensor._make_wrapper_subclass(torch.Tensor, ..., device=tpu:1)",
        lambda: torch.Tensor._make_wrapper_subclass(torch.Tensor, (3,), dtype=torch.float32, device=dev1).device)
class Sub(torch.Tensor):
    pass
ws = attempt("_make_wrapper_subclass(Sub, ..., device=tpu:1)",
             lambda: torch.Tensor._make_wrapper_subclass(Sub, (3,), dtype=torch.float32, device=dev1))
if ws is not None:
    print("       keys:", torch._C._dispatch_keys(ws))
attempt("torch.Tensor(storage on tpu:1) legacy ctor", lambda: torch.Tensor(st1).device)
attempt("torch.UntypedStorage(8, device='tpu:1')", lambda: torch.UntypedStorage(8, device="tpu:1"))
attempt("torch.tensor([], device='tpu:1').set_(st1)", lambda: torch.empty(0, device="tpu:1").set_(st1).device)
