// Minimal C++ surface for torchtpu device indices (spike prototype).
//  (a) a PrivateUse1 DeviceGuardImplInterface whose current index is settable
//  (b) a factory making an empty PrivateUse1 tensor on index k over a fake,
//      non-owning data pointer.
#include <atomic>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/utils/pybind.h>            // casters for at::Tensor, at::ScalarType

namespace {

using c10::Device;
using c10::DeviceIndex;
using c10::DeviceType;
using c10::Stream;
constexpr DeviceType kTpu = DeviceType::PrivateUse1;

// Process default (the chip this process drives, e.g. LOCAL_RANK) plus a
// per-thread override, as CUDA's current device is per thread.  The autograd
// engine's worker threads call setDevice(i) for every i < deviceCount(): with a
// process-global index they would clobber the main thread's device.
std::atomic<DeviceIndex> g_default{0};
std::atomic<DeviceIndex> g_count{1};
thread_local DeviceIndex t_current = -1;

inline DeviceIndex current() {
  return t_current >= 0 ? t_current : g_default.load(std::memory_order_relaxed);
}

struct TpuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  DeviceType type() const override { return kTpu; }
  Device exchangeDevice(Device d) const override {
    Device old = getDevice();
    if (d.index() != old.index()) setDevice(d);
    return old;
  }
  Device getDevice() const override { return Device(kTpu, current()); }
  void setDevice(Device d) const override {
    TORCH_CHECK(d.type() == kTpu, "tpu guard: expected a tpu device, got ", d);
    if (d.index() < 0) return;  // "tpu" without index: keep the current one
    TORCH_CHECK(d.index() < g_count.load(), "tpu guard: device index ", int(d.index()),
                " out of range (device_count=", int(g_count.load()), ")");
    t_current = d.index();
  }
  void uncheckedSetDevice(Device d) const noexcept override {
    if (d.index() >= 0) t_current = d.index();
  }
  Stream getStream(Device d) const override { return Stream(Stream::DEFAULT, d); }
  Stream getNewStream(Device d, int /*priority*/) const override { return Stream(Stream::DEFAULT, d); }
  Stream exchangeStream(Stream s) const override { return Stream(Stream::DEFAULT, s.device()); }
  DeviceIndex deviceCount() const noexcept override { return g_count.load(); }
  // Events and streams: torchtpu orders work itself (as the Python guard did).
  void record(void**, const Stream&, const DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const DeviceIndex) const noexcept override {}
  bool queryStream(const Stream&) const override { return true; }
  void synchronizeStream(const Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const DeviceIndex) const override {}
};

TpuGuardImpl g_guard;  // static lifetime: the registry keeps a raw pointer

// Install (or re-install) our guard for PrivateUse1.  registerDeviceGuard
// simply stores the pointer, so this also replaces a guard installed earlier
// by torch._C._acc.register_python_privateuseone_device_guard.
bool install_guard() {
  bool had = c10::impl::hasDeviceGuardImpl(kTpu);
  c10::impl::registerDeviceGuard(kTpu, &g_guard);
  return had;
}

bool guard_installed() {
  return c10::impl::hasDeviceGuardImpl(kTpu) &&
         c10::impl::getDeviceGuardImpl(kTpu) == &g_guard;
}

void set_device_count(int64_t n) {
  TORCH_CHECK(n >= 1 && n <= std::numeric_limits<DeviceIndex>::max(), "bad device count ", n);
  g_count.store(static_cast<DeviceIndex>(n));
}

// torch.tpu.set_device(k): the process default and this thread's device.
void set_device(int64_t k) {
  TORCH_CHECK(k >= 0 && k < g_count.load(), "tpu: device index ", k,
              " out of range (device_count=", int(g_count.load()), ")");
  g_default.store(static_cast<DeviceIndex>(k));
  t_current = static_cast<DeviceIndex>(k);
}

int64_t current_device() { return current(); }

// An empty tpu tensor viewing `nbytes` at fake `address` on tpu:index
// (index < 0: the current device).  Non-owning DataPtr: nothing is freed.
at::Tensor empty_at(int64_t address, int64_t nbytes, std::vector<int64_t> size,
                    std::vector<int64_t> stride, int64_t offset, at::ScalarType dtype,
                    int64_t index) {
  TORCH_CHECK(size.size() == stride.size(), "size and stride differ in length");
  const DeviceIndex k = index < 0 ? current() : static_cast<DeviceIndex>(index);
  TORCH_CHECK(k < g_count.load(), "tpu: device index ", int(k), " out of range (device_count=",
              int(g_count.load()), ")");
  const Device device(kTpu, k);
  c10::DataPtr data(reinterpret_cast<void*>(address), device);  // no context, no deleter
  c10::Storage storage(c10::Storage::use_byte_size_t{}, static_cast<size_t>(nbytes),
                       std::move(data), /*allocator=*/nullptr, /*resizable=*/false);
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(size, stride, offset);
  return t;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install_guard", &install_guard, "register the C++ PrivateUse1 guard; returns whether one was there");
  m.def("guard_installed", &guard_installed);
  m.def("set_device_count", &set_device_count);
  m.def("set_device", &set_device);
  m.def("current_device", &current_device);
  m.def("empty_at", &empty_at, pybind11::arg("address"), pybind11::arg("nbytes"), pybind11::arg("size"),
        pybind11::arg("stride"), pybind11::arg("offset"), pybind11::arg("dtype"), pybind11::arg("index") = -1);
}
