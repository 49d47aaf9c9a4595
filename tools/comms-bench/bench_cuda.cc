#include "bench_cuda.h"

#include <algorithm>

#include "util/strutil.h"

#if COMMS_BENCH_CUDA
#include <cuda_runtime.h>

#include "nccl_table.h"
#endif

namespace comms::bench {
namespace {

using plugin::OpType;

#if !COMMS_BENCH_CUDA
[[noreturn]] void no_cuda() {
  throw Error(ErrorCode::kUnsupported,
              "--device cuda: this comms-bench was built without CUDA (Meson found no CUDA runtime and NCCL under "
              "-Dnccl_cuda_root, or -Dnccl=disabled); rebuild where they are to benchmark CUDA buffers");
}
#else
bool reduces(OpType t) { return t == OpType::kAllReduce || t == OpType::kReduce || t == OpType::kReduceScatter; }

// `reason` names the problem; the flags that asked for it follow.
[[noreturn]] void refuse(const std::string& reason, OpType type, DataType dtype, ReduceKind kind) {
  throw Error(ErrorCode::kUnsupported,
              str::cat("--device cuda: ", reason, " (-C/--coll=", plugin::op_name(type), ", -d/--datatype=",
                       to_string(dtype), reduces(type) ? str::cat(", -o/--op=", to_string(kind)) : "", ")"));
}

void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) {
    throw Error(ErrorCode::kInternal, str::cat("comms-bench: ", what, " failed: ", cudaGetErrorString(e)));
  }
}

// Why NCCL cannot run it; empty when it can. cc_major < 0: device unknown.
std::string nccl_refusal(OpType type, DataType dtype, ReduceKind kind, bool raw, int cc_major, int cc_minor) {
  if (raw) return raw_nccl_refusal(type, dtype, kind, cc_major, cc_minor);
  return reduces(type) ? nccl_reduction_for(dtype, kind, cc_major, cc_minor).refusal : std::string();
}

class CudaBenchImpl final : public CudaBench {
 public:
  CudaBenchImpl(int device, bool high_priority) : device_(device) {
    check(cudaSetDevice(device), str::cat("cudaSetDevice(", device, ")"));
    check(cudaDeviceGetAttribute(&cc_major_, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
    check(cudaDeviceGetAttribute(&cc_minor_, cudaDevAttrComputeCapabilityMinor, device), "cudaDeviceGetAttribute");
    // The plugin's rule: the greatest priority for high_priority_stream, else
    // CUDA's default 0; non-blocking, so the legacy stream never joins in.
    int least = 0, greatest = 0;
    check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
    check(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, high_priority ? greatest : 0),
          "cudaStreamCreateWithPriority");
  }
  ~CudaBenchImpl() override {
    // close() reports failures; here nothing can, and exit must not wait.
    uncapture(false);
    uncapture(true);
    if (in_) cudaFree(in_);
    if (out_) cudaFree(out_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  int device() const override { return device_; }
  void* stream() const override { return stream_; }

  void check_supported(OpType type, DataType dtype, ReduceKind kind, bool raw) const override {
    if (auto why = nccl_refusal(type, dtype, kind, raw, cc_major_, cc_minor_); !why.empty()) {
      refuse(why, type, dtype, kind);
    }
  }

  size_t free_memory() const override {
    size_t free = 0, total = 0;
    check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    return free;
  }

  void reserve(size_t bytes) override {
    if (bytes <= capacity_ && in_) return;
    release_buffers();
    check(cudaMalloc(&in_, bytes), str::cat("cudaMalloc of ", bytes, " bytes on cuda:", device_));
    check(cudaMalloc(&out_, bytes), str::cat("cudaMalloc of ", bytes, " bytes on cuda:", device_));
    capacity_ = bytes;
  }
  uint8_t* input() override { return static_cast<uint8_t*>(in_); }
  uint8_t* output() override { return static_cast<uint8_t*>(out_); }

  void upload(const std::vector<uint8_t>& in, const std::vector<uint8_t>& out) override {
    check_fits(in.size(), out.size());
    check(cudaMemcpyAsync(in_, in.data(), in.size(), cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync to the device");
    check(cudaMemcpyAsync(out_, out.data(), out.size(), cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync to the device");
    synchronize();
  }
  void download(std::vector<uint8_t>& in, std::vector<uint8_t>& out) override {
    check_fits(in.size(), out.size());
    check(cudaMemcpyAsync(in.data(), in_, in.size(), cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync to the host");
    check(cudaMemcpyAsync(out.data(), out_, out.size(), cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync to the host");
    synchronize();
  }
  void synchronize() override { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

  void capture(bool raw, const std::function<void()>& issue) override {
    uncapture(raw);
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
    cudaGraph_t graph = nullptr;
    try {
      issue();
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);  // end it, then report the op's failure
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    check(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture");
    const cudaError_t e = cudaGraphInstantiate(&graphs_[raw], graph, 0);
    cudaGraphDestroy(graph);
    check(e, "cudaGraphInstantiate");
  }
  bool captured(bool raw) const override { return graphs_[raw] != nullptr; }
  void replay(bool raw) override { check(cudaGraphLaunch(graphs_[raw], stream_), "cudaGraphLaunch"); }
  void uncapture(bool raw) override {
    if (graphs_[raw]) cudaGraphExecDestroy(graphs_[raw]);
    graphs_[raw] = nullptr;
  }

  void close() override {
    uncapture(false);
    uncapture(true);
    std::string errors;
    auto note = [&](const std::string& e) { errors += (errors.empty() ? "" : "; ") + e; };
    try {
      release_buffers();
    } catch (const std::exception& e) {
      note(e.what());
    }
    if (stream_) {
      if (cudaError_t e = cudaStreamDestroy(stream_); e != cudaSuccess) {
        note(str::cat("cudaStreamDestroy failed: ", cudaGetErrorString(e)));
      }
      stream_ = nullptr;
    }
    if (!errors.empty()) throw Error(ErrorCode::kInternal, str::cat("comms-bench: releasing CUDA state: ", errors));
  }

 private:
  void check_fits(size_t in, size_t out) const {
    if (in > capacity_ || out > capacity_) {
      throw Error(ErrorCode::kInternal, str::cat("comms-bench: a host mirror of ", std::max(in, out),
                                                 " bytes exceeds the device buffers of ", capacity_));
    }
  }
  void release_buffers() {
    void* in = in_;
    void* out = out_;
    in_ = out_ = nullptr;
    capacity_ = 0;
    if (in) check(cudaFree(in), "cudaFree");
    if (out) check(cudaFree(out), "cudaFree");
  }

  int device_;
  int cc_major_ = -1, cc_minor_ = -1;
  cudaStream_t stream_ = nullptr;
  void* in_ = nullptr;
  void* out_ = nullptr;
  size_t capacity_ = 0;
  cudaGraphExec_t graphs_[2] = {nullptr, nullptr};  // [raw]: comms', the baseline's
};
#endif

}  // namespace

void check_cuda(OpType type, DataType dtype, ReduceKind kind, bool raw, int local_rank) {
#if !COMMS_BENCH_CUDA
  (void)type, (void)dtype, (void)kind, (void)raw, (void)local_rank;
  no_cuda();
#else
  // The device is not known yet: fp8's sm_90 rule waits for check_supported().
  if (auto why = nccl_refusal(type, dtype, kind, raw, -1, -1); !why.empty()) refuse(why, type, dtype, kind);
  int count = 0;
  const std::string no_device = str::cat("--device cuda: no usable CUDA device for local rank ", local_rank, ": ");
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    throw Error(ErrorCode::kNotFound,
                str::cat(no_device, "cudaGetDeviceCount failed: ", cudaGetErrorString(e), " (", cudaGetErrorName(e), ")"));
  }
  if (local_rank >= count) {
    throw Error(ErrorCode::kNotFound,
                str::cat(no_device, "it uses cuda:", local_rank, " but ", count,
                         " CUDA device(s) are visible on this host (CUDA_VISIBLE_DEVICES selects them); run at most ",
                         count, " ranks per host"));
  }
#endif
}

std::unique_ptr<CudaBench> CudaBench::open(int device, bool high_priority) {
#if !COMMS_BENCH_CUDA
  (void)device, (void)high_priority;
  no_cuda();
#else
  return std::make_unique<CudaBenchImpl>(device, high_priority);
#endif
}

}  // namespace comms::bench
