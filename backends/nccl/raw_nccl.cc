#include "raw_nccl.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "nccl_backend.h"
#include "nccl_hints.h"

namespace comms::nccl {
namespace {

using plugin::OpType;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr const char* kUniqueIdKey = "nccl/unique_id";
constexpr bool kHasNativeAllToAllGatherScatter = NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0);

// As the plugin: inside a group a non-blocking communicator may answer
// ncclInProgress where a blocking one answers ncclSuccess.
bool accepted(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

bool reduces(OpType t) { return t == OpType::kAllReduce || t == OpType::kReduce || t == OpType::kReduceScatter; }

std::string ms_text(milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

}  // namespace

std::string RawNccl::refusal(OpType type, DataType dtype, ReduceKind kind, int cc_major, int cc_minor) {
  switch (type) {
    case OpType::kAllReduce:
    case OpType::kReduce:
    case OpType::kReduceScatter:
      return plan_reduction(dtype, kind, cc_major, cc_minor).reason;
    case OpType::kAllToAll:
    case OpType::kGather:
    case OpType::kScatter:
      if (kHasNativeAllToAllGatherScatter) return {};
      return "raw nccl: " + std::string(plugin::op_name(type)) +
             " needs NCCL >= 2.28 (ncclAlltoAll, ncclGather, ncclScatter); this build links NCCL " +
             nccl_version_string(NCCL_VERSION_CODE);
    case OpType::kAllGather:
    case OpType::kBroadcast:
    case OpType::kBarrier:
    case OpType::kSend:
      return {};
    default:
      return "raw nccl: " + std::string(plugin::op_name(type)) + " is not one of comms-bench's ops";
  }
}

std::string RawNccl::call_name(OpType type) {
  switch (type) {
    case OpType::kAllReduce: return "ncclAllReduce";
    case OpType::kReduce: return "ncclReduce";
    case OpType::kReduceScatter: return "ncclReduceScatter";
    case OpType::kBroadcast: return "ncclBroadcast";
    case OpType::kAllGather: return "ncclAllGather";
    case OpType::kAllToAll: return "ncclAlltoAll";
    case OpType::kGather: return "ncclGather";
    case OpType::kScatter: return "ncclScatter";
    case OpType::kBarrier: return "ncclAllReduce (1 float)";
    case OpType::kSend: return "ncclSend+ncclRecv (grouped)";
    default: return std::string(plugin::op_name(type));
  }
}

RawNccl::RawNccl(std::shared_ptr<NcclApi> api, Store& store, Options options)
    : api_(std::move(api)), options_(std::move(options)) {
  // The plugin's own translation, so that both communicators get one config.
  TranslatedHints translated;
  if (Status s = translate_hints(options_.hints, NCCL_VERSION_CODE, &translated); !s.is_ok()) {
    throw Error(s.code, "raw nccl: " + s.message);
  }
  fields_ = plugin_config_fields(translated.config, options_.comm_name);
  const std::string device = "cuda:" + std::to_string(options_.device);
  if (cudaError_t e = api_->set_device(options_.device); e != cudaSuccess) {
    throw Error(ErrorCode::kNotFound, "raw nccl: cannot bind " + device + ": " + api_->cuda_error_string(e));
  }
  if (api_->compute_capability(options_.device, &cc_major_, &cc_minor_) != cudaSuccess) cc_major_ = cc_minor_ = -1;

  ncclUniqueId id;
  try {
    if (options_.rank == 0) {
      if (ncclResult_t r = api_->get_unique_id(&id); r != ncclSuccess) fail(r, "ncclGetUniqueId");
      store.set(kUniqueIdKey, std::string(id.internal, sizeof id.internal));
    } else {
      const std::string bytes = store.get(kUniqueIdKey, options_.init_timeout);
      if (bytes.size() != sizeof id.internal) {
        throw Error(ErrorCode::kInternal, "holds " + std::to_string(bytes.size()) + " bytes, expected " +
                                              std::to_string(sizeof id.internal));
      }
      std::memcpy(id.internal, bytes.data(), bytes.size());
    }
  } catch (const Error& e) {
    throw Error(e.code(), "raw nccl: exchanging the unique id through store key '" + std::string(kUniqueIdKey) +
                              "' (rank 0 publishes it): " + e.what());
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  apply_to_config(fields_, &config);
  const ncclResult_t r = api_->comm_init_rank_config(&comm_, options_.size, id, options_.rank, &config);
  try {
    settle(r, options_.init_timeout, Wait::kSleep, "ncclCommInitRankConfig");
  } catch (...) {
    if (comm_) api_->comm_abort(comm_);
    comm_ = nullptr;
    throw;
  }
}

RawNccl::~RawNccl() {
  // Not finalized: abort, so that exit never waits on a peer.
  if (comm_) api_->comm_abort(comm_);
  if (scratch_) api_->free_device(scratch_);
}

void RawNccl::fail(ncclResult_t r, const char* what) {
  ErrorCode code = ErrorCode::kInternal;
  if (r == ncclRemoteError) code = ErrorCode::kPeerFailure;
  else if (r == ncclInvalidArgument || r == ncclInvalidUsage) code = ErrorCode::kInvalidArgument;
  std::string msg = std::string("raw nccl: ") + what + " failed: " + api_->error_string(r);
  if (const char* last = api_->last_error(comm_); last && *last) msg += " (" + std::string(last) + ")";
  throw Error(code, msg);
}

void RawNccl::settle(ncclResult_t r, milliseconds timeout, Wait wait, const char* what) {
  if (r == ncclSuccess) return;  // the hot path: no clock read
  if (r == ncclInProgress) {
    const auto deadline = Clock::now() + timeout;
    auto nap = std::chrono::microseconds(10);
    while (r == ncclInProgress) {
      if (Clock::now() >= deadline) {
        throw Error(ErrorCode::kTimeout, std::string("raw nccl: ") + what + " did not complete within " +
                                             ms_text(timeout) + "; do all ranks run comms-bench with the same flags?");
      }
      if (wait == Wait::kSleep) {
        std::this_thread::sleep_for(nap);
        nap = std::min(nap * 2, std::chrono::microseconds(1000));
      }
      ncclResult_t async = ncclSuccess;
      const ncclResult_t q = api_->comm_get_async_error(comm_, &async);
      r = q != ncclSuccess ? q : async;
    }
    if (r == ncclSuccess) return;
  }
  fail(r, what);
}

void RawNccl::reduce(OpType type, const void* input, void* output, size_t count, DataType dtype,
                     const ReduceOp& op, int root, cudaStream_t stream) {
  const ReductionPlan plan = plan_reduction(dtype, op.kind, cc_major_, cc_minor_);
  if (!plan.reason.empty()) throw Error(ErrorCode::kUnsupported, plan.reason);
  ncclRedOp_t rop = plan.op;
  if (plan.premul_sum) {
    // Created and destroyed around each op, as the plugin and PyTorch do:
    // the scalar is host-immediate, consumed at enqueue.
    alignas(8) unsigned char scalar[8];
    encode_scalar(op.scalar, dtype, scalar);
    settle(api_->red_op_create_pre_mul_sum(&rop, scalar, plan.dtype, comm_), options_.op_timeout, Wait::kSpin,
           "ncclRedOpCreatePreMulSum");
  }
  ncclResult_t r = ncclSuccess;
  switch (type) {
    case OpType::kAllReduce: r = api_->all_reduce(input, output, count, plan.dtype, rop, comm_, stream); break;
    case OpType::kReduce: r = api_->reduce(input, output, count, plan.dtype, rop, root, comm_, stream); break;
    default: r = api_->reduce_scatter(input, output, count, plan.dtype, rop, comm_, stream); break;
  }
  settle(r, options_.op_timeout, Wait::kSpin, call_name(type).c_str());
  if (plan.premul_sum) {
    settle(api_->red_op_destroy(rop, comm_), options_.op_timeout, Wait::kSpin, "ncclRedOpDestroy");
  }
}

void RawNccl::run(OpType type, const void* input, void* output, size_t count, DataType dtype, const ReduceOp& op,
                  int root, int peer, cudaStream_t stream) {
  if (reduces(type)) return reduce(type, input, output, count, dtype, op, root, stream);
  const ncclDataType_t cdt = copy_dtype(dtype);
  ncclResult_t r = ncclSuccess;
  switch (type) {
    case OpType::kBroadcast:
      r = api_->broadcast(input, const_cast<void*>(input), count, cdt, root, comm_, stream);
      break;
    case OpType::kAllGather: r = api_->all_gather(input, output, count, cdt, comm_, stream); break;
    case OpType::kAllToAll:
    case OpType::kGather:
    case OpType::kScatter:
      if (!kHasNativeAllToAllGatherScatter) {
        throw Error(ErrorCode::kUnsupported, refusal(type, dtype, op.kind, cc_major_, cc_minor_));
      }
      r = type == OpType::kAllToAll ? api_->all_to_all(input, output, count, cdt, comm_, stream)
          : type == OpType::kGather ? api_->gather(input, output, count, cdt, root, comm_, stream)
                                    : api_->scatter(input, output, count, cdt, root, comm_, stream);
      break;
    case OpType::kBarrier:
      if (!scratch_) {
        if (cudaError_t e = api_->malloc_device(&scratch_, sizeof(float)); e != cudaSuccess) {
          scratch_ = nullptr;
          throw Error(ErrorCode::kInternal,
                      std::string("raw nccl: cudaMalloc of the barrier scratch failed: ") + api_->cuda_error_string(e));
        }
        if (cudaError_t e = api_->memset_async(scratch_, 0, sizeof(float), stream); e != cudaSuccess) {
          throw Error(ErrorCode::kInternal, std::string("raw nccl: cudaMemsetAsync of the barrier scratch failed: ") +
                                                api_->cuda_error_string(e));
        }
      }
      r = api_->all_reduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream);
      break;
    case OpType::kSend: {
      if (ncclResult_t g = api_->group_start(); g != ncclSuccess) fail(g, "ncclGroupStart");
      const ncclResult_t a = api_->send(input, count, cdt, peer, comm_, stream);
      const ncclResult_t b = accepted(a) ? api_->recv(output, count, cdt, peer, comm_, stream) : a;
      r = api_->group_end();  // always closes the group
      if (!accepted(a) || !accepted(b)) fail(accepted(a) ? b : a, "ncclSend/ncclRecv");
      settle(r, options_.op_timeout, Wait::kSpin, "ncclGroupEnd");
      return;
    }
    default:
      throw Error(ErrorCode::kInvalidArgument, refusal(type, dtype, op.kind, cc_major_, cc_minor_));
  }
  settle(r, options_.op_timeout, Wait::kSpin, call_name(type).c_str());
}

void RawNccl::finalize() {
  std::string errors;
  if (comm_) {
    const ncclResult_t r = api_->comm_finalize(comm_);
    try {
      settle(r, options_.op_timeout, Wait::kSleep, "ncclCommFinalize");
      if (ncclResult_t d = api_->comm_destroy(comm_); !accepted(d)) {
        errors += std::string(" ncclCommDestroy failed: ") + api_->error_string(d) + ";";
      }
    } catch (const Error& e) {
      errors += std::string(" ") + e.what() + ";";
      if (ncclResult_t a = api_->comm_abort(comm_); !accepted(a)) {
        errors += std::string(" ncclCommAbort failed: ") + api_->error_string(a) + ";";
      }
    }
    comm_ = nullptr;
  }
  if (scratch_) {
    if (cudaError_t e = api_->free_device(scratch_); e != cudaSuccess) {
      errors += std::string(" cudaFree of the barrier scratch failed: ") + api_->cuda_error_string(e) + ";";
    }
    scratch_ = nullptr;
  }
  if (!errors.empty()) {
    errors.pop_back();
    throw Error(ErrorCode::kInternal, "raw nccl: releasing the communicator failed:" + errors);
  }
}

}  // namespace comms::nccl
