// -R 1 (nccl-tests' --local_register): a buffer from the comm's allocator
// (comms::alloc_backend_memory), registered with the comm (register_buffer),
// so that ops on it may take the backend's paths for such memory (cpu:ucx:
// memory every rank on the host maps). Freed and deregistered when dropped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "comms/comms.h"

namespace comms::bench {

class BackendBuffer {
 public:
  BackendBuffer() = default;
  // Throws comms::Error as the allocator and register_buffer do.
  BackendBuffer(std::shared_ptr<Comm> comm, size_t bytes);
  ~BackendBuffer();
  BackendBuffer(BackendBuffer&& other) noexcept;
  BackendBuffer& operator=(BackendBuffer&& other) noexcept;
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  void reset() noexcept;
  std::shared_ptr<Comm> comm_;
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
  RegisteredBuffer registration_;
};

}  // namespace comms::bench
