// Registered buffers: RegisteredBuffer and the Comm::Impl calls behind it.
// A registration remembers the backend object and the device backend's generation it
// was made on; once either changed (finalize, offload, reload) the backend
// has released it, and the handle only reports that.
#include "comm/comm_impl.h"
#include "util/log.h"
#include "util/strutil.h"

namespace comms {

namespace internal {

struct Registration {
  std::weak_ptr<Comm::Impl> comm;
  BufferView buffer;
  const plugin::Backend* backend = nullptr;  // compared, never called through
  int generation = 0;
  void* handle = nullptr;
  bool released = false;  // deregistered by the caller
};

}  // namespace internal

namespace {

bool plugin_can_register(const internal::LoadedPlugin& p) {
  return plugin::abi_minor(p.descriptor->abi_version) >= 2 &&
         (p.descriptor->features & plugin::kFeatureRegisterBuffers) != 0;
}

}  // namespace

const internal::LoadedPlugin& Comm::Impl::plugin_serving(DeviceType t, std::string_view op) const {
  const DeviceBackend& s = device_backend(t);
  if (!s.plugin) {
    throw error(ErrorCode::kInvalidArgument,
                str::cat(op, ": this comm has no backend for ", to_string(t)), op);
  }
  return *s.plugin;
}

bool Comm::Impl::can_register(DeviceType t) const {
  const DeviceBackend& s = device_backend(t);
  return s.plugin && plugin_can_register(*s.plugin);
}

std::shared_ptr<internal::Registration> Comm::Impl::register_buffer(BufferView buffer) {
  const DeviceType t = buffer.device.type;
  const internal::LoadedPlugin& p = plugin_serving(t, "register_buffer");
  if (!plugin_can_register(p)) {
    throw error(ErrorCode::kUnsupported,
                str::cat("register_buffer: the ", p.name, " backend for ", to_string(t),
                         " cannot register buffers (can_register_buffers() is false)"),
                "register_buffer");
  }
  if (!buffer.data || buffer.bytes() == 0) {
    throw error(ErrorCode::kInvalidArgument, "register_buffer: the buffer is null or empty", "register_buffer");
  }
  std::lock_guard<std::mutex> lock(state_mu_);
  DeviceBackend& s = device_backend(t);
  if (s.state.load() != BackendState::kReady || !s.backend) {
    throw error(ErrorCode::kInvalidArgument,
                str::cat("register_buffer: the ", p.name, " backend is ", to_string(s.state.load()),
                         "; register once it is connected (after the comm's first op on ",
                         to_string(t), ", or create the comm with that device)"),
                "register_buffer");
  }
  auto r = std::make_shared<internal::Registration>();
  r->comm = weak_from_this();
  r->buffer = buffer;
  r->backend = s.backend.get();
  r->generation = s.generation;
  call_or_throw(t, "register_buffer", "register_buffer", "register_buffer",
                [&] { return s.backend->register_buffer(buffer.data, buffer.bytes(), &r->handle); });
  return r;
}

bool Comm::Impl::registration_live(const internal::Registration& r) const {
  const DeviceBackend& s = device_backend(r.buffer.device.type);
  return !r.released && s.backend.get() == r.backend && s.generation == r.generation &&
         s.state.load() == BackendState::kReady;
}

void Comm::Impl::deregister_buffer(internal::Registration& r) {
  std::lock_guard<std::mutex> lock(state_mu_);
  if (!registration_live(r)) {
    r.released = true;  // gone with its backend
    return;
  }
  r.released = true;
  DeviceBackend& s = device_backend(r.buffer.device.type);
  call_or_throw(r.buffer.device.type, "deregister_buffer", "deregister_buffer", "deregister_buffer",
                [&] { return s.backend->deregister_buffer(r.handle); });
}

RegisteredBuffer::RegisteredBuffer() = default;
RegisteredBuffer::RegisteredBuffer(std::shared_ptr<internal::Registration> state) : state_(std::move(state)) {}
RegisteredBuffer::RegisteredBuffer(RegisteredBuffer&&) noexcept = default;

RegisteredBuffer& RegisteredBuffer::operator=(RegisteredBuffer&& other) noexcept {
  if (this != &other) {
    try {
      deregister();
    } catch (const std::exception& e) {
      log::error(str::cat("replacing a registered buffer: ", e.what()));
    }
    state_ = std::move(other.state_);
  }
  return *this;
}

RegisteredBuffer::~RegisteredBuffer() {
  try {
    deregister();
  } catch (const std::exception& e) {
    log::error(str::cat("destroying a registered buffer: ", e.what()));
  }
}

void RegisteredBuffer::deregister() {
  if (!state_ || state_->released) return;
  if (auto comm = state_->comm.lock()) {
    comm->deregister_buffer(*state_);
  } else {
    state_->released = true;  // the comm, and its backend, are gone
  }
}

bool RegisteredBuffer::registered() const {
  if (!state_ || state_->released) return false;
  auto comm = state_->comm.lock();
  return comm && comm->registration_live(*state_);
}

BufferView RegisteredBuffer::buffer() const { return state_ ? state_->buffer : BufferView{}; }

bool can_register_buffers(const Comm& comm, DeviceType type) {
  return internal::CommAccess::impl(comm).can_register(type);
}

RegisteredBuffer register_buffer(Comm& comm, BufferView buffer) {
  return RegisteredBuffer(internal::CommAccess::impl(comm).register_buffer(buffer));
}

namespace {

bool plugin_has_allocator(const plugin::PluginDescriptor& d) {
  return plugin::abi_minor(d.abi_version) >= 2 && (d.features & plugin::kFeatureMemAlloc) != 0 && d.mem_alloc &&
         d.mem_free;
}

const plugin::PluginDescriptor& allocator_of(const Comm::Impl& impl, Device device, std::string_view op) {
  const internal::LoadedPlugin& p = impl.plugin_serving(device.type, op);
  const plugin::PluginDescriptor& d = *p.descriptor;
  if (!plugin_has_allocator(d)) {
    throw impl.error(ErrorCode::kUnsupported,
                     str::cat(op, ": the ", p.name, " backend for ", to_string(device.type),
                              " has no allocator of its own; allocate the buffer as usual"),
                     op);
  }
  return d;
}

}  // namespace

bool Comm::Impl::can_alloc(DeviceType t) const {
  const DeviceBackend& s = device_backend(t);
  return s.plugin && plugin_has_allocator(*s.plugin->descriptor);
}

bool can_alloc_backend_memory(const Comm& comm, DeviceType type) {
  return internal::CommAccess::impl(comm).can_alloc(type);
}

void* alloc_backend_memory(const Comm& comm, Device device, size_t bytes) {
  const Comm::Impl& impl = internal::CommAccess::impl(comm);
  const plugin::PluginDescriptor& d = allocator_of(impl, device, "alloc_backend_memory");
  void* ptr = nullptr;
  impl.call_or_throw(device.type, "mem_alloc", "alloc_backend_memory", "alloc_backend_memory",
                     [&] { return d.mem_alloc(device, bytes, &ptr); });
  return ptr;
}

void free_backend_memory(const Comm& comm, Device device, void* ptr) {
  const Comm::Impl& impl = internal::CommAccess::impl(comm);
  const plugin::PluginDescriptor& d = allocator_of(impl, device, "free_backend_memory");
  impl.call_or_throw(device.type, "mem_free", "free_backend_memory", "free_backend_memory",
                     [&] { return d.mem_free(device, ptr); });
}

}  // namespace comms
