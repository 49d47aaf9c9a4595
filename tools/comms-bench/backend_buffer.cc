#include "backend_buffer.h"

#include <cstdio>
#include <utility>

namespace comms::bench {

BackendBuffer::BackendBuffer(std::shared_ptr<Comm> comm, size_t bytes) : comm_(std::move(comm)), bytes_(bytes) {
  data_ = static_cast<uint8_t*>(alloc_backend_memory(*comm_, Device::cpu(), bytes));
  try {
    registration_ = register_buffer(*comm_, BufferView{data_, bytes, DataType::kUint8, Device::cpu()});
  } catch (...) {
    free_backend_memory(*comm_, Device::cpu(), data_);
    throw;
  }
}

BackendBuffer::~BackendBuffer() { reset(); }

BackendBuffer::BackendBuffer(BackendBuffer&& other) noexcept
    : comm_(std::move(other.comm_)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      registration_(std::move(other.registration_)) {}

BackendBuffer& BackendBuffer::operator=(BackendBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    comm_ = std::move(other.comm_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    registration_ = std::move(other.registration_);
  }
  return *this;
}

void BackendBuffer::reset() noexcept {
  if (!data_) return;
  try {
    registration_.deregister();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comms-bench: deregistering a -R 1 buffer: %s\n", e.what());
  }
  try {
    free_backend_memory(*comm_, Device::cpu(), data_);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comms-bench: freeing a -R 1 buffer: %s\n", e.what());
  }
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace comms::bench
