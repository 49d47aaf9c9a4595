// The suite's CUDA buffers: cudaMalloc'd on the rank's device, filled and read
// back with cudaMemcpyAsync on the rank's stream (the stream its ops run on).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <thread>

#include "device_memory.h"

namespace comms::conformance {
namespace {

using Clock = std::chrono::steady_clock;

std::string cuda_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

class CudaMemory final : public DeviceMemory {
 public:
  // Throws comms::Error if the device cannot be used.
  CudaMemory(int index, std::chrono::milliseconds drain_timeout) : index_(index), drain_timeout_(drain_timeout) {
    select("creating the suite's stream");
    // A blocking stream (default flags): should any op reach the legacy
    // default stream, it is still ordered with this one.
    check(cudaStreamCreate(&stream_), "cudaStreamCreate");
  }
  ~CudaMemory() override {
    if (stream_ && cudaSetDevice(index_) == cudaSuccess) cudaStreamDestroy(stream_);
  }

  Device device() const override { return Device::cuda(index_); }
  void* stream() const override { return stream_; }

  std::string describe() const override {
    cudaDeviceProp p{};
    std::ostringstream s;
    s << "cuda:" << index_;
    if (cudaError_t e = cudaGetDeviceProperties(&p, index_); e != cudaSuccess) {
      s << " (cudaGetDeviceProperties failed: " << cuda_text(e) << ")";
    } else {
      s << " (" << p.name << ", compute capability " << p.major << "." << p.minor << ", "
        << p.totalGlobalMem / (1 << 20) << " MiB)";
    }
    return s.str();
  }

  void* allocate(size_t bytes) override {
    select("cudaMalloc");
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc of " + std::to_string(bytes) + " bytes");
    return p;
  }

  void release(void* p) noexcept override {
    // cudaFree waits for the device; a failure here has no caller to tell.
    cudaError_t e = cudaSetDevice(index_);
    if (e == cudaSuccess) e = cudaFree(p);
    if (e != cudaSuccess) std::fprintf(stderr, "comms-conformance: cudaFree on cuda:%d: %s\n", index_, cuda_text(e).c_str());
  }

  void upload(void* device, const void* host, size_t bytes) override {
    select("cudaMemcpyAsync");
    // From pageable memory this returns once the bytes are staged (the
    // driver may first wait for the stream), so the host buffer may change
    // afterwards.
    check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync host to device (" + std::to_string(bytes) + " bytes)");
  }

  void download(void* host, const void* device, size_t bytes) override {
    select("cudaMemcpyAsync");
    // A copy into pageable memory blocks until the stream reaches it, with
    // no bound: drain the stream first under the time limit.
    drain("before reading back");
    check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync device to host (" + std::to_string(bytes) + " bytes)");
    drain("after reading back");
  }

  std::unique_ptr<DeviceMemory> with_own_stream() const override {
    return std::make_unique<CudaMemory>(index_, drain_timeout_);
  }

 private:
  [[noreturn]] void fail(ErrorCode code, const std::string& what) const {
    throw Error(code, "comms-conformance on cuda:" + std::to_string(index_) + ": " + what);
  }
  void check(cudaError_t e, const std::string& what) const {
    if (e != cudaSuccess) fail(ErrorCode::kInternal, what + " failed: " + cuda_text(e));
  }
  // The device is per thread in CUDA; every call names it.
  void select(const std::string& what) const {
    check(cudaSetDevice(index_), "cudaSetDevice(" + std::to_string(index_) + ") for " + what);
  }

  // Polls (with a short back-off, not a busy loop) until every op on the
  // stream finished, or fails after drain_timeout_: a hung op must not hang
  // the suite.
  void drain(const std::string& when) const {
    const auto deadline = Clock::now() + drain_timeout_;
    auto sleep = std::chrono::microseconds(0);
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) fail(ErrorCode::kInternal, "the stream failed " + when + ": " + cuda_text(q));
      if (Clock::now() >= deadline) {
        fail(ErrorCode::kTimeout, "the stream did not drain within " +
                                      std::to_string(drain_timeout_.count() / 1000.0) + " s " + when +
                                      " (an op issued on it never completed)");
      }
      if (sleep.count() == 0) std::this_thread::yield();
      else std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep + std::chrono::microseconds(50), std::chrono::microseconds(1000));
    }
  }

  int index_;
  std::chrono::milliseconds drain_timeout_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no device is not an error of a later call
    return 0;
  }
  return n;
}

std::unique_ptr<DeviceMemory> cuda_memory(int index, int local_size, std::chrono::milliseconds drain_timeout,
                                          std::string* why_not) {
  int n = 0;
  if (cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess || n <= 0) {
    cudaGetLastError();
    *why_not = e != cudaSuccess ? "no CUDA device (cudaGetDeviceCount: " + cuda_text(e) + ")" : "no CUDA device";
    return nullptr;
  }
  // Every rank of the host decides the same way, so that no rank waits in an
  // op that its neighbour skips.
  if (local_size > n || index >= n) {
    *why_not = "no CUDA device for every local rank: " + std::to_string(local_size) + " ranks on this host, " +
               std::to_string(n) + " CUDA device(s)";
    return nullptr;
  }
  try {
    return std::make_unique<CudaMemory>(index, drain_timeout);
  } catch (const Error& e) {
    *why_not = std::string("no CUDA device usable: ") + e.what();
    return nullptr;
  }
}

}  // namespace comms::conformance
