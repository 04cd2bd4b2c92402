// torchtpu's native part: what pure Python cannot do on torch 2.13.
//
//  * A PrivateUse1 device guard whose current index is settable.  The Python
//    guard torch offers always reports index 0 and one device, so `tpu:k`
//    (k > 0) could not exist: one process per chip needs its chip to be named
//    `tpu:LOCAL_RANK`, as CUDA programs name theirs.
//  * PrivateUse1 hooks whose resizePrivateUse1Bytes resizes a storage in place
//    (UntypedStorage.resize_: FSDP2 frees and refills parameters so).  torch's
//    Python hooks cannot implement it, and hooks can be registered only once.
//  * A factory for an empty tpu tensor on a given index over torchtpu's fake,
//    non-owning data pointer (torchtpu keeps the data in a jax array attached
//    to the storage).  It also replaces three Python calls per new tensor.
//  * PyTorch's own view kernels (those CPU registers) for tpu tensors.  A view
//    computes sizes and strides over the same storage and never reads the
//    data, so the fake pointer is all it needs; in C++ a view costs what it
//    costs on CPU, where a Python kernel redispatching to CPU cost ~2 us.
//
// Everything else (kernels, storage contents) stays in Python.
#include <atomic>
#include <string>
#include <limits>
#include <vector>

#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/Functions.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Storage.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/utils/pybind.h>  // casters for at::Tensor and at::ScalarType
#include <torch/library.h>

namespace {

using c10::Device;
using c10::DeviceIndex;
using c10::DeviceType;
using c10::Stream;
constexpr DeviceType kTpu = DeviceType::PrivateUse1;

// The process's chip (torch.tpu.set_device) plus a per-thread override, as
// CUDA's current device is per thread: the autograd engine's worker threads
// call setDevice(i) for every i < deviceCount(), which must not move the
// main thread.
std::atomic<DeviceIndex> process_device{0};
std::atomic<DeviceIndex> device_count{1};
thread_local DeviceIndex thread_device = -1;

DeviceIndex current() {
  return thread_device >= 0 ? thread_device : process_device.load(std::memory_order_relaxed);
}

void check_index(int64_t index) {
  TORCH_CHECK(index >= 0 && index < device_count.load(), "tpu: invalid device index ", index,
              " (this host has ", int(device_count.load()), " tpu device(s))");
}

struct TpuGuard final : public c10::impl::DeviceGuardImplInterface {
  DeviceType type() const override { return kTpu; }
  Device exchangeDevice(Device d) const override {
    Device old = getDevice();
    if (d.index() != old.index()) setDevice(d);
    return old;
  }
  Device getDevice() const override { return Device(kTpu, current()); }
  void setDevice(Device d) const override {
    TORCH_CHECK(d.type() == kTpu, "tpu device guard: expected a tpu device, got ", d);
    if (d.index() < 0) return;  // "tpu" without an index: keep the current one
    check_index(d.index());
    thread_device = d.index();
  }
  void uncheckedSetDevice(Device d) const noexcept override {
    if (d.index() >= 0) thread_device = d.index();
  }
  Stream getStream(Device d) const override { return Stream(Stream::DEFAULT, d); }
  Stream getNewStream(Device d, int /*priority*/) const override { return Stream(Stream::DEFAULT, d); }
  Stream exchangeStream(Stream s) const override { return Stream(Stream::DEFAULT, s.device()); }
  DeviceIndex deviceCount() const noexcept override { return device_count.load(); }
  // torchtpu orders device work itself (by data dependence in XLA), so the
  // stream and event hooks have nothing to do; their defaults would throw.
  void record(void**, const Stream&, const DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const DeviceIndex) const noexcept override {}
  bool queryStream(const Stream&) const override { return true; }
  void synchronizeStream(const Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const DeviceIndex) const override {}
};

TpuGuard guard;  // static lifetime: the registry keeps a raw pointer

// registerDeviceGuard stores the pointer, so this also replaces the Python
// guard torch's backend registration installed.
void install_guard() { c10::impl::registerDeviceGuard(kTpu, &guard); }

bool guard_installed() {
  return c10::impl::hasDeviceGuardImpl(kTpu) && c10::impl::getDeviceGuardImpl(kTpu) == &guard;
}

void set_device_count(int64_t n) {
  TORCH_CHECK(n >= 1 && n <= std::numeric_limits<DeviceIndex>::max(), "tpu: bad device count ", n);
  device_count.store(static_cast<DeviceIndex>(n));
}

void set_process_device(int64_t index) {
  check_index(index);
  process_device.store(static_cast<DeviceIndex>(index));
  thread_device = static_cast<DeviceIndex>(index);
}

int64_t current_device() { return current(); }

// Python's resize_storage(storage, nbytes) -> new fake address or None.  It
// owns the device data; this side sets the storage's size and pointer.
// Leaked on purpose: it must outlive the interpreter's teardown.
pybind11::object* resize_callback = nullptr;

// torch.Generator(device="tpu"): a seed and a counter. A random op given this
// generator draws with the key fold_in(seed, counter) and advances the counter
// (runtime/rng.py), so the same seed replays the same stream, independent of
// the global one: the contract vLLM's per-request seeds rely on.
struct TpuGenerator final : public c10::GeneratorImpl {
  explicit TpuGenerator(DeviceIndex index)
      : c10::GeneratorImpl(Device(kTpu, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}
  void set_current_seed(uint64_t seed) override { seed_ = seed; offset_ = 0; }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    set_current_seed(c10::detail::getNonDeterministicRandom());
    return seed_;
  }
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }
  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK(state.numel() == 16 && state.dtype() == caffe2::TypeMeta::Make<uint8_t>(),
                "tpu: a generator state is 16 bytes (seed, offset), got ", state.numel());
    const auto* words = static_cast<const uint64_t*>(state.data());
    seed_ = words[0];
    offset_ = words[1];
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    at::Tensor state = at::empty({16}, at::TensorOptions().dtype(at::kByte));
    auto* words = static_cast<uint64_t*>(state.data_ptr());
    words[0] = seed_;
    words[1] = offset_;
    return state.getIntrusivePtr();
  }

 private:
  TpuGenerator* clone_impl() const override {
    auto* copy = new TpuGenerator(device().index());
    copy->seed_ = seed_;
    copy->offset_ = offset_;
    return copy;
  }
  uint64_t seed_ = c10::default_rng_seed_val;
  uint64_t offset_ = 0;
};

struct TpuHooks final : public at::PrivateUse1HooksInterface {
  at::Generator getNewGenerator(DeviceIndex index) const override {
    return at::make_generator<TpuGenerator>(index < 0 ? current() : index);
  }
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(DeviceIndex) const override { return true; }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    // resize_ passes its int argument as size_t: -1 arrives as 2**64 - 1
    TORCH_CHECK(static_cast<int64_t>(nbytes) >= 0, "tpu: storage resize_ to a negative size (",
                static_cast<int64_t>(nbytes), ")");
    pybind11::gil_scoped_acquire gil;
    TORCH_CHECK(resize_callback != nullptr, "tpu: torchtpu did not install its storage resize");
    pybind11::object address = (*resize_callback)(pybind11::cast(storage), nbytes);
    if (address.is_none()) return;
    c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
    impl->set_data_ptr_noswap(c10::DataPtr(reinterpret_cast<void*>(address.cast<int64_t>()), storage.device()));
    impl->set_nbytes(nbytes);
  }
};

TpuHooks hooks;  // static lifetime, as the guard

// Host memory for tpu transfers is plain host memory: XLA copies from any host
// buffer.  torch.accelerator's host-cache calls (vLLM calls empty_host_cache at
// shutdown) dereference the device type's host allocator, so one must exist.
struct TpuHostAllocator final : public at::HostAllocator {
  at::DataPtr allocate(size_t n) override {
    void* data = n ? c10::alloc_cpu(n) : nullptr;
    return {data, data, &c10::free_cpu, at::Device(at::kCPU)};
  }
  at::DeleterFnPtr raw_deleter() const override { return &c10::free_cpu; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  bool record_event(void*, void*, c10::Stream) override { return true; }
  void empty_cache() override {}  // nothing is cached
  at::HostStats get_stats() override { return {}; }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}
};

TpuHostAllocator host_allocator;

// Hooks can be registered once per process: before torch's backend
// registration, whose Python hooks are then ignored.
bool install_hooks(pybind11::object resize) {
  if (resize_callback == nullptr) resize_callback = new pybind11::object();
  *resize_callback = std::move(resize);
  if (at::isPrivateUse1HooksRegistered()) return &at::detail::getPrivateUse1Hooks() == &hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
  at::setHostAllocator(kTpu, &host_allocator);
  return true;
}

// An empty tpu tensor over `nbytes` at the fake `address` on tpu:index.  The
// DataPtr owns nothing: torchtpu frees the jax array when the storage dies.
at::Tensor empty_at(int64_t address, int64_t nbytes, std::vector<int64_t> size, std::vector<int64_t> stride,
                    int64_t offset, at::ScalarType dtype, int64_t index) {
  TORCH_CHECK(size.size() == stride.size(), "tpu: size and stride differ in length");
  const Device device(kTpu, static_cast<DeviceIndex>(index));
  c10::DataPtr data(reinterpret_cast<void*>(address), device);
  c10::Storage storage(c10::Storage::use_byte_size_t{}, static_cast<size_t>(nbytes), std::move(data),
                       /*allocator=*/nullptr, /*resizable=*/false);
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(size, stride, offset);
  return t;
}

// The view ops whose PrivateUse1 kernels are PyTorch's CPU ones, registered
// once (registration.py leaves these to us when this module is loaded).
const char* const kViewOps[] = {"as_strided", "view", "_reshape_alias", "unfold", "view_as_real", "view_as_complex"};

std::vector<std::string> register_view_kernels() {
  static torch::Library* library = nullptr;
  if (library == nullptr) {
    library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    library->impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
    library->impl("view", TORCH_FN(at::native::view));
    library->impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
    library->impl("unfold", TORCH_FN(at::native::unfold));
    library->impl("view_as_real", TORCH_FN(at::native::view_as_real));
    library->impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
  }
  return {std::begin(kViewOps), std::end(kViewOps)};
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.attr("API_VERSION") = 5;  // runtime/native.py refuses a stale build
  m.def("install_guard", &install_guard, "make the settable C++ guard PrivateUse1's device guard");
  m.def("guard_installed", &guard_installed);
  m.def("install_hooks", &install_hooks, "register the PrivateUse1 hooks, storage resize included");
  m.def("set_device_count", &set_device_count);
  m.def("set_process_device", &set_process_device);
  m.def("current_device", &current_device);
  m.def("empty_at", &empty_at);
  m.def("register_view_kernels", &register_view_kernels,
        "register PyTorch's CPU view kernels for PrivateUse1; returns the op names");
}
