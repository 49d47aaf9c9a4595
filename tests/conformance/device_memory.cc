#include "device_memory.h"

#include <cstdio>
#include <cstring>
#include <new>

namespace comms::conformance {
namespace {

// Buf keeps host buffers in its own bytes and never calls allocate/upload/
// download here; they are plain host copies so that the interface holds.
class HostMemory final : public DeviceMemory {
 public:
  Device device() const override { return Device::cpu(); }
  void* stream() const override { return nullptr; }
  std::string describe() const override { return "cpu"; }
  void* allocate(size_t bytes) override { return ::operator new(bytes); }
  void release(void* p) noexcept override { ::operator delete(p); }
  void upload(void* device, const void* host, size_t bytes) override { std::memcpy(device, host, bytes); }
  void download(void* host, const void* device, size_t bytes) override { std::memcpy(host, device, bytes); }
  std::unique_ptr<DeviceMemory> with_own_stream() const override { return std::make_unique<HostMemory>(); }
};

// Host memory that the suite treats as cuda:<index>: staged, uploaded and
// read back like a GPU's, for a plugin that moves it as host memory.
class StandInCuda final : public DeviceMemory {
 public:
  explicit StandInCuda(int index) : index_(index) {}
  Device device() const override { return Device::cuda(index_); }
  // Never dereferenced: a distinct non-null stream per instance.
  void* stream() const override { return const_cast<char*>(&stream_tag_); }
  std::string describe() const override { return "cuda:" + std::to_string(index_) + " (stand-in: host memory)"; }
  void* allocate(size_t bytes) override { return ::operator new(bytes); }
  void release(void* p) noexcept override { ::operator delete(p); }
  void upload(void* device, const void* host, size_t bytes) override { std::memcpy(device, host, bytes); }
  void download(void* host, const void* device, size_t bytes) override { std::memcpy(host, device, bytes); }
  std::unique_ptr<DeviceMemory> with_own_stream() const override { return std::make_unique<StandInCuda>(index_); }

 private:
  int index_;
  char stream_tag_ = 0;
};

class BackendMemory final : public DeviceMemory {
 public:
  explicit BackendMemory(std::shared_ptr<Comm> comm) : comm_(std::move(comm)) {}
  Device device() const override { return Device::cpu(); }
  void* stream() const override { return nullptr; }
  std::string describe() const override { return "cpu (the backend's allocator)"; }
  bool staged() const override { return true; }
  void* allocate(size_t bytes) override { return alloc_backend_memory(*comm_, Device::cpu(), bytes); }
  void release(void* p) noexcept override {
    try {
      free_backend_memory(*comm_, Device::cpu(), p);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "comms-conformance: free_backend_memory failed: %s\n", e.what());
    }
  }
  void upload(void* device, const void* host, size_t bytes) override { std::memcpy(device, host, bytes); }
  void download(void* host, const void* device, size_t bytes) override { std::memcpy(host, device, bytes); }
  std::unique_ptr<DeviceMemory> with_own_stream() const override { return std::make_unique<BackendMemory>(comm_); }

 private:
  std::shared_ptr<Comm> comm_;
};

}  // namespace

std::unique_ptr<DeviceMemory> backend_memory(std::shared_ptr<Comm> comm) {
  return std::make_unique<BackendMemory>(std::move(comm));
}

std::unique_ptr<DeviceMemory> host_memory() { return std::make_unique<HostMemory>(); }

std::unique_ptr<DeviceMemory> stand_in_cuda_memory(int index) { return std::make_unique<StandInCuda>(index); }

}  // namespace comms::conformance
