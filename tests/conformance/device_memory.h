// Where comms-conformance keeps its buffers: host memory, or one CUDA device
// reached through one stream. The CUDA calls live in cuda_memory.cc, built
// only when Meson found CUDA; libcomms itself never links CUDA.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "comms/comms.h"

namespace comms::conformance {

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // The device buffers are labelled with (cpu, or cuda:<index>).
  virtual Device device() const = 0;
  // The stream every op of the suite runs on (OpOptions::stream); null on cpu.
  virtual void* stream() const = 0;
  // "cpu", or the device's name and compute capability, for reports.
  virtual std::string describe() const = 0;
  // Whether Buf stages its bytes here (allocate/upload/download) instead of
  // using its own host bytes as the buffer.
  virtual bool staged() const { return device().type != DeviceType::kCpu; }

  // Device memory of `bytes` (> 0). Throws comms::Error on failure. On cpu
  // nothing is allocated: Buf uses its host bytes directly.
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* p) noexcept = 0;
  // Host to device, enqueued on stream() after everything issued there before
  // (the source may be reused when it returns).
  virtual void upload(void* device, const void* host, size_t bytes) = 0;
  // Device to host, enqueued on stream(), then waits until the stream has
  // drained, so the host bytes hold every op issued there before. Throws
  // comms::Error (kTimeout if the stream does not drain in time).
  virtual void download(void* host, const void* device, size_t bytes) = 0;

  // The same device with a stream of its own, for a second thread: two
  // threads' ops on two comms must not be ordered behind each other.
  virtual std::unique_ptr<DeviceMemory> with_own_stream() const = 0;
};

// Host memory: Buf's bytes are the buffer.
std::unique_ptr<DeviceMemory> host_memory();

// CPU memory from the comm's allocator (alloc_backend_memory: on cpu:ucx,
// memory every rank on the host maps), staged like a device's so that every
// buffer of a case lives there (--backend-memory).
std::unique_ptr<DeviceMemory> backend_memory(std::shared_ptr<Comm> comm);

// Host memory labelled cuda:<index> and staged like a device's: the suite's
// own test of its cuda paths without a GPU (--stand-in-device).
std::unique_ptr<DeviceMemory> stand_in_cuda_memory(int index);

// CUDA device `index` with a new stream, for a rank that is local rank
// `index` of `local_size` on its host; a stream that does not drain within
// `drain_timeout` fails the download. On failure returns null and sets
// *why_not to a reason that contains "no CUDA device" (no device, fewer
// devices than local ranks, or a build without CUDA).
std::unique_ptr<DeviceMemory> cuda_memory(int index, int local_size, std::chrono::milliseconds drain_timeout,
                                          std::string* why_not);

// CUDA devices visible to this process (0 without a device or without CUDA
// in the build).
int cuda_device_count();

}  // namespace comms::conformance
