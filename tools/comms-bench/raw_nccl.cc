#include "raw_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comms/numeric.h"
#include "nccl_table.h"
#include "util/strutil.h"

namespace comms::bench {
namespace {

using plugin::OpType;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr const char* kUniqueIdKey = "nccl/unique_id";

// Inside a group a non-blocking communicator may answer ncclInProgress
// where a blocking one answers ncclSuccess.
bool accepted(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

class RawNccl final : public Baseline {
 public:
  RawNccl(Store& store, int rank, int size, int device, const nlohmann::json& nccl_config, milliseconds init_timeout,
          milliseconds op_timeout);
  // Aborts a communicator finalize() did not release: exit never waits on a peer.
  ~RawNccl() override {
    if (comm_) ncclCommAbort(comm_);
    if (scratch_) cudaFree(scratch_);
  }

  void run(const BenchOp& op) override;
  std::string algorithm(const BenchOp& op) const override { return nccl_call_for(op.type); }
  std::string name() const override { return "raw-nccl"; }
  void finalize() override;

 private:
  enum class Wait { kSpin, kSleep };
  // Waits out ncclInProgress (a raw caller has nothing else to do: it spins
  // on the hot path, sleeps in init and teardown); throws on any failure.
  void settle(ncclResult_t r, milliseconds timeout, Wait wait, const std::string& what);
  [[noreturn]] void fail(ncclResult_t r, const std::string& what);
  void reduce(const BenchOp& op, cudaStream_t stream);

  milliseconds op_timeout_;
  std::vector<std::string> config_strings_;  // what the config's string fields point to
  ncclComm_t comm_ = nullptr;
  int cc_major_ = -1, cc_minor_ = -1;
  void* scratch_ = nullptr;  // the barrier's float, allocated on first use
};

RawNccl::RawNccl(Store& store, int rank, int size, int device, const nlohmann::json& nccl_config,
                 milliseconds init_timeout, milliseconds op_timeout)
    : op_timeout_(op_timeout) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  apply_nccl_config(nccl_config, &config, &config_strings_);
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    throw Error(ErrorCode::kNotFound, str::cat("raw nccl: cannot bind cuda:", device, ": ", cudaGetErrorString(e)));
  }
  if (cudaDeviceGetAttribute(&cc_major_, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&cc_minor_, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cc_major_ = cc_minor_ = -1;
  }
  ncclUniqueId id;
  try {
    if (rank == 0) {
      if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) fail(r, "ncclGetUniqueId");
      store.set(kUniqueIdKey, std::string(id.internal, sizeof id.internal));
    } else {
      const std::string bytes = store.get(kUniqueIdKey, init_timeout);
      if (bytes.size() != sizeof id.internal) {
        throw Error(ErrorCode::kInternal, str::cat("holds ", bytes.size(), " bytes, expected ", sizeof id.internal));
      }
      std::memcpy(id.internal, bytes.data(), bytes.size());
    }
  } catch (const Error& e) {
    throw Error(e.code(), str::cat("raw nccl: exchanging the unique id through store key '", kUniqueIdKey,
                                   "' (rank 0 publishes it): ", e.what()));
  }
  const ncclResult_t r = ncclCommInitRankConfig(&comm_, size, id, rank, &config);
  try {
    settle(r, init_timeout, Wait::kSleep, "ncclCommInitRankConfig");
  } catch (...) {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    throw;
  }
}

void RawNccl::fail(ncclResult_t r, const std::string& what) {
  ErrorCode code = ErrorCode::kInternal;
  if (r == ncclRemoteError) code = ErrorCode::kPeerFailure;
  else if (r == ncclInvalidArgument || r == ncclInvalidUsage) code = ErrorCode::kInvalidArgument;
  std::string msg = str::cat("raw nccl: ", what, " failed: ", ncclGetErrorString(r));
  if (const char* last = ncclGetLastError(comm_); last && *last) str::append(msg, " (", last, ")");
  throw Error(code, msg);
}

void RawNccl::settle(ncclResult_t r, milliseconds timeout, Wait wait, const std::string& what) {
  if (r == ncclSuccess) return;  // the hot path: no clock read
  if (r == ncclInProgress) {
    const auto deadline = Clock::now() + timeout;
    auto nap = std::chrono::microseconds(10);
    while (r == ncclInProgress) {
      if (Clock::now() >= deadline) {
        throw Error(ErrorCode::kTimeout, str::cat("raw nccl: ", what, " did not complete within ", timeout.count(),
                                                  " ms; do all ranks run comms-bench with the same flags?"));
      }
      if (wait == Wait::kSleep) {
        std::this_thread::sleep_for(nap);
        nap = std::min(nap * 2, std::chrono::microseconds(1000));
      }
      ncclResult_t async = ncclSuccess;
      const ncclResult_t q = ncclCommGetAsyncError(comm_, &async);
      r = q != ncclSuccess ? q : async;
    }
    if (r == ncclSuccess) return;
  }
  fail(r, what);
}

void RawNccl::reduce(const BenchOp& op, cudaStream_t stream) {
  const NcclReduction plan = nccl_reduction_for(op.dtype, op.redop.kind, cc_major_, cc_minor_);
  if (!plan.refusal.empty()) throw Error(ErrorCode::kUnsupported, plan.refusal);
  ncclRedOp_t rop = plan.op;
  if (plan.premul_sum) {
    // Created and destroyed around each op, as PyTorch does: the scalar is
    // host-immediate, read at enqueue.
    alignas(8) unsigned char scalar[8] = {};
    numeric::store_from_double(scalar, op.dtype, 0, op.redop.scalar);
    settle(ncclRedOpCreatePreMulSum(&rop, scalar, plan.dtype, ncclScalarHostImmediate, comm_), op_timeout_,
           Wait::kSpin, "ncclRedOpCreatePreMulSum");
  }
  ncclResult_t r = ncclSuccess;
  switch (op.type) {
    case OpType::kAllReduce: r = ncclAllReduce(op.input, op.output, op.count, plan.dtype, rop, comm_, stream); break;
    case OpType::kReduce: r = ncclReduce(op.input, op.output, op.count, plan.dtype, rop, op.root, comm_, stream); break;
    default: r = ncclReduceScatter(op.input, op.output, op.count, plan.dtype, rop, comm_, stream); break;
  }
  settle(r, op_timeout_, Wait::kSpin, nccl_call_for(op.type));
  if (plan.premul_sum) settle(ncclRedOpDestroy(rop, comm_), op_timeout_, Wait::kSpin, "ncclRedOpDestroy");
}

void RawNccl::run(const BenchOp& op) {
  auto stream = static_cast<cudaStream_t>(op.stream);
  if (op.type == OpType::kAllReduce || op.type == OpType::kReduce || op.type == OpType::kReduceScatter) {
    return reduce(op, stream);
  }
  if (std::string why = raw_nccl_refusal(op.type, op.dtype, op.redop.kind, cc_major_, cc_minor_); !why.empty()) {
    throw Error(ErrorCode::kUnsupported, why);
  }
  const ncclDataType_t t = nccl_copy_type(op.dtype);
  ncclResult_t r = ncclSuccess;
  switch (op.type) {
    case OpType::kBroadcast:  // in place on the one buffer, as Comm::broadcast
      r = ncclBroadcast(op.input, const_cast<void*>(op.input), op.count, t, op.root, comm_, stream);
      break;
    case OpType::kAllGather: r = ncclAllGather(op.input, op.output, op.count, t, comm_, stream); break;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    case OpType::kAllToAll: r = ncclAlltoAll(op.input, op.output, op.count, t, comm_, stream); break;
    case OpType::kGather: r = ncclGather(op.input, op.output, op.count, t, op.root, comm_, stream); break;
    case OpType::kScatter: r = ncclScatter(op.input, op.output, op.count, t, op.root, comm_, stream); break;
#endif
    case OpType::kBarrier:
      if (!scratch_) {
        if (cudaError_t e = cudaMalloc(&scratch_, sizeof(float)); e != cudaSuccess) {
          scratch_ = nullptr;
          throw Error(ErrorCode::kInternal, str::cat("raw nccl: cudaMalloc of the barrier scratch failed: ",
                                                     cudaGetErrorString(e)));
        }
        if (cudaError_t e = cudaMemsetAsync(scratch_, 0, sizeof(float), stream); e != cudaSuccess) {
          throw Error(ErrorCode::kInternal, str::cat("raw nccl: cudaMemsetAsync of the barrier scratch failed: ",
                                                     cudaGetErrorString(e)));
        }
      }
      r = ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream);
      break;
    case OpType::kSend: {
      if (ncclResult_t g = ncclGroupStart(); g != ncclSuccess) fail(g, "ncclGroupStart");
      const ncclResult_t a = ncclSend(op.input, op.count, t, op.peer, comm_, stream);
      const ncclResult_t b = accepted(a) ? ncclRecv(op.output, op.count, t, op.peer, comm_, stream) : a;
      r = ncclGroupEnd();  // always closes the group
      if (!accepted(a) || !accepted(b)) fail(accepted(a) ? b : a, "ncclSend/ncclRecv");
      return settle(r, op_timeout_, Wait::kSpin, "ncclGroupEnd");
    }
    default: break;
  }
  settle(r, op_timeout_, Wait::kSpin, nccl_call_for(op.type));
}

void RawNccl::finalize() {
  std::string errors;
  if (comm_) {
    const ncclResult_t r = ncclCommFinalize(comm_);
    try {
      settle(r, op_timeout_, Wait::kSleep, "ncclCommFinalize");
      if (ncclResult_t d = ncclCommDestroy(comm_); !accepted(d)) {
        str::append(errors, " ncclCommDestroy failed: ", ncclGetErrorString(d), ";");
      }
    } catch (const Error& e) {
      str::append(errors, " ", e.what(), ";");
      if (ncclResult_t a = ncclCommAbort(comm_); !accepted(a)) {
        str::append(errors, " ncclCommAbort failed: ", ncclGetErrorString(a), ";");
      }
    }
    comm_ = nullptr;
  }
  if (scratch_) {
    if (cudaError_t e = cudaFree(scratch_); e != cudaSuccess) {
      str::append(errors, " cudaFree of the barrier scratch failed: ", cudaGetErrorString(e), ";");
    }
    scratch_ = nullptr;
  }
  if (!errors.empty()) {
    errors.pop_back();
    throw Error(ErrorCode::kInternal, "raw nccl: releasing the communicator failed:" + errors);
  }
}

}  // namespace

std::unique_ptr<Baseline> open_raw_nccl(Store& store, int rank, int size, int device, const nlohmann::json& nccl_config,
                                        milliseconds init_timeout, milliseconds op_timeout) {
  return std::make_unique<RawNccl>(store, rank, size, device, nccl_config, init_timeout, op_timeout);
}

}  // namespace comms::bench
