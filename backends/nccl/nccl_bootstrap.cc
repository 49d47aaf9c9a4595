// Bootstrap: the unique id exchange through the store, communicator init
// (bounded by the init timeout) and split, and adopting a ready communicator.
#include <cstring>
#include <exception>

#include "nccl_core.h"

namespace comms::nccl {

namespace {
constexpr const char* kUniqueIdKey = "nccl/unique_id";
}  // namespace

Status Core::init_locked() {
  if (comm_) return {};
  if (!failure_.is_ok()) return failure_;
  DeviceGuard guard(*api_, device_);
  if (cudaError_t e = guard.status(); e != cudaSuccess) {
    return {ErrorCode::kNotFound, "cannot bind cuda:" + std::to_string(device_) + ": " +
                                      api_->cuda_error_string(e) +
                                      " (is a CUDA device present and visible?)"};
  }
  ncclUniqueId id;
  if (Status s = exchange_unique_id(&id); !s.is_ok()) return s;
  NcclConfig config = initial_config(api_->loaded_version());
  effective_ = effective_fields();
  apply_to_config(effective_, &config);
  ncclComm_t comm = nullptr;
  const auto deadline = Clock::now() + init_.init_timeout;
  ncclResult_t r = api_->comm_init_rank_config(&comm, init_.size, id, init_.rank, &config);
  if (Status s = settle(comm, r, deadline, "ncclCommInitRankConfig"); !s.is_ok()) {
    if (comm) api_->comm_abort(comm);
    if (s.code == ErrorCode::kTimeout && Clock::now() >= deadline) {  // ours, not ncclTimeout
      s.message = "NCCL communicator init (rank " + std::to_string(init_.rank) + " of " +
                  std::to_string(init_.size) + ", cuda:" + std::to_string(device_) +
                  ") did not finish within " + ms_text(init_.init_timeout) +
                  "; are all ranks running and initializing this comm?";
    }
    // Sticky: retrying would publish or wait for a second unique id that
    // peers who got past this point never read.
    failure_ = s;
    return s;
  }
  if (Status s = adopt_locked(comm); !s.is_ok()) {
    failure_ = s;
    return s;
  }
  return {};
}

Status Core::adopt_locked(ncclComm_t comm) {
  comm_ = comm;
  auto fail = [&](Status s) {
    release_locked(/*graceful=*/false);
    return s;
  };
  DeviceGuard guard(*api_, device_);
  if (cudaError_t e = guard.status(); e != cudaSuccess) {
    return fail(cuda_status(*api_, e, "cudaSetDevice"));
  }
  int least = 0, greatest = 0;
  if (cudaError_t e = api_->stream_priority_range(&least, &greatest); e != cudaSuccess) {
    return fail(cuda_status(*api_, e, "cudaDeviceGetStreamPriorityRange"));
  }
  // 0 is CUDA's default priority; numerically lower is higher priority.
  stream_priority_ = hints_.priority == StreamPriority::kHigh ? greatest : 0;
  if (cudaError_t e = api_->stream_create(&stream_, stream_priority_); e != cudaSuccess) {
    return fail(cuda_status(*api_, e, "cudaStreamCreateWithPriority"));
  }
  if (cudaError_t e = api_->event_create(&caller_ready_); e != cudaSuccess) {
    return fail(cuda_status(*api_, e, "cudaEventCreate"));
  }
  if (cudaError_t e = api_->malloc_device(&scratch_, sizeof(float)); e != cudaSuccess) {
    return fail(cuda_status(*api_, e, "cudaMalloc of the barrier scratch"));
  }
  if (cudaError_t e = api_->memset_async(scratch_, 0, sizeof(float), stream_); e != cudaSuccess) {
    return fail(cuda_status(*api_, e, "cudaMemsetAsync of the barrier scratch"));
  }
  watchdog_cv.notify_all();
  return {};
}

Status Core::split_locked(int color, int key, const NcclConfigFields& child_fields,
                          const std::string& child_name, std::chrono::milliseconds timeout,
                          ncclComm_t* child) {
  if (!failure_.is_ok()) {
    return {ErrorCode::kAborted, "the NCCL communicator failed earlier: " + failure_.message};
  }
  const NcclConfigFields fields = plugin_config_fields(child_fields, child_name);
  NcclConfig config = initial_config(api_->loaded_version());
  apply_to_config(fields, &config);
  DeviceGuard guard(*api_, device_);
  const auto deadline = Clock::now() + timeout;
  ncclComm_t out = nullptr;
  ncclResult_t r = api_->comm_split(comm_, color, key, &out, &config);
  // On a non-blocking parent the split may return ncclSuccess with the
  // parent still in progress and `out` not yet set (NCCL 2.28.3): NCCL
  // refuses the parent's next call ("Attempt to use communicator before the
  // previous operation returned ncclSuccess") until the parent is polled to
  // success. So the parent is always polled, then the child once it exists.
  // A non-member gets no child.
  Status s = settle(comm_, r == ncclSuccess ? ncclInProgress : r, deadline, "ncclCommSplit");
  s = settle_child(s, out, deadline, timeout, "ncclCommSplit", "do all ranks of the parent call split?");
  if (!s.is_ok()) {
    fail_locked(s, nullptr);
    return s;
  }
  *child = out;
  return {};
}

Status Core::exchange_unique_id(ncclUniqueId* id) {
  try {
    if (init_.rank == 0) {
      if (ncclResult_t r = api_->get_unique_id(id); r != ncclSuccess) {
        return nccl_status(*api_, nullptr, r, "ncclGetUniqueId");
      }
      init_.store->set(kUniqueIdKey, std::string(id->internal, sizeof id->internal));
      return {};
    }
    const std::string bytes = init_.store->get(kUniqueIdKey, init_.init_timeout);
    if (bytes.size() != sizeof id->internal) {
      return {ErrorCode::kInternal, "store key '" + std::string(kUniqueIdKey) + "' holds " +
                                        std::to_string(bytes.size()) + " bytes, expected " +
                                        std::to_string(sizeof id->internal)};
    }
    std::memcpy(id->internal, bytes.data(), bytes.size());
    return {};
  } catch (const Error& e) {
    return {e.code(), "exchanging the NCCL unique id through store key '" +
                          std::string(kUniqueIdKey) + "' (rank 0 publishes it): " + e.what()};
  } catch (const std::exception& e) {
    return {ErrorCode::kInternal, "exchanging the NCCL unique id through store key '" +
                                      std::string(kUniqueIdKey) + "': " + e.what()};
  }
}

}  // namespace comms::nccl
