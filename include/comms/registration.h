// Registered buffers: a buffer registered with a comm's device backend lets
// that library take its zero-copy and NVLink SHARP paths for ops on it (NCCL:
// ncclCommRegister), and memory allocated the way the backend prefers
// (NCCL: ncclMemAlloc). Ops on a registered buffer are issued as on any
// other; results are the same.
//
// Which backends can: can_register_buffers() says, from the plugin's
// capability (NCCL can; UCX can for memory from its allocator, which every
// rank of the host maps, and refuses other memory with kInvalidArgument;
// Gloo cannot). Asking one that cannot is an error (kUnsupported naming the
// backend), never a silent no-op: a program that relies on registration
// learns it is not happening.
//
// Lifetime: a registration lasts until deregister() (or the handle's
// destructor), and at most as long as the backend that made it. finalize(),
// offload_backend() and a failed comm release every registration with the
// backend; the handle then reports registered() == false and deregister()
// does nothing. After reload_backend() register again: a handle from
// before the offload stays released.
#pragma once

#include "comms/export.h"

#include <cstddef>
#include <memory>

#include "comms/comm.h"
#include "comms/types.h"

namespace comms {

namespace internal {
struct Registration;
}

class COMMS_API RegisteredBuffer {
 public:
  RegisteredBuffer();
  // Made by register_buffer().
  COMMS_LOCAL explicit RegisteredBuffer(std::shared_ptr<internal::Registration> state);
  ~RegisteredBuffer();  // deregisters; never throws (failures are logged)
  RegisteredBuffer(RegisteredBuffer&&) noexcept;
  RegisteredBuffer& operator=(RegisteredBuffer&&) noexcept;
  RegisteredBuffer(const RegisteredBuffer&) = delete;
  RegisteredBuffer& operator=(const RegisteredBuffer&) = delete;

  // Deregisters now; throws the backend's failure. Idempotent.
  void deregister();
  // False after deregister(), and once the backend that registered it was
  // finalized, offloaded, reloaded or failed.
  bool registered() const;
  // The buffer as registered (empty for a default-constructed handle).
  BufferView buffer() const;

 private:
  std::shared_ptr<internal::Registration> state_;
};

// Whether the comm's backend for `type` can register buffers.
COMMS_API bool can_register_buffers(const Comm& comm, DeviceType type);
// Registers `buffer` with the comm's backend for buffer.device. Throws
// kUnsupported when that backend cannot, kInvalidArgument when the backend
// is not connected yet (a lazy comm before its first op, or offloaded).
COMMS_API RegisteredBuffer register_buffer(Comm& comm, BufferView buffer);
// Whether the comm's backend for `type` has an allocator of its own (NCCL and
// UCX do; Gloo does not): what alloc_backend_memory would not refuse with
// kUnsupported.
COMMS_API bool can_alloc_backend_memory(const Comm& comm, DeviceType type);
// Memory the backend for `device` prefers (NCCL: ncclMemAlloc; UCX on cpu:
// host memory every rank of the host maps), to be released with
// free_backend_memory on the same device. Not tied to the comm's lifetime.
// Throws kUnsupported when the backend has no allocator.
COMMS_API void* alloc_backend_memory(const Comm& comm, Device device, size_t bytes);
COMMS_API void free_backend_memory(const Comm& comm, Device device, void* ptr);

}  // namespace comms
