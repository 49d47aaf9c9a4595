// Offload by suspend (NCCL >= 2.29): ncclCommSuspend releases the
// communicator's memory and keeps the communicator, so that a reload
// (ncclCommResume) needs no new rendezvous; ncclCommMemStats says what was
// released. What the loaded NCCL has decides (NcclApi::has_suspend).
#include <nlohmann/json.hpp>

#include "nccl_core.h"

namespace comms::nccl {

namespace {

Status no_suspend(NcclApi& api) {
  return {ErrorCode::kUnsupported, "nccl: offload by suspend needs NCCL >= " +
                                       nccl_version_string(kSuspendVersion) +
                                       " (ncclCommSuspend); the loaded NCCL is " +
                                       nccl_version_string(api.loaded_version())};
}

}  // namespace

std::string Core::mem_stats_json_locked() {
  nlohmann::ordered_json j;
  const std::pair<const char*, MemStat> stats[] = {{"suspendable", MemStat::kSuspendable},
                                                   {"persistent", MemStat::kPersistent},
                                                   {"total", MemStat::kTotal},
                                                   {"suspended", MemStat::kSuspended}};
  for (const auto& [name, stat] : stats) {
    uint64_t value = 0;
    if (comm_ && api_->has_suspend() && api_->comm_mem_stats(comm_, stat, &value) == ncclSuccess) {
      if (stat == MemStat::kSuspended) j[name] = value != 0;
      else j[name] = value;
    } else {
      j[name] = nullptr;
    }
  }
  return j.dump();
}

Status Core::suspend_locked() {
  if (!failure_.is_ok()) return failed_earlier("suspend");
  if (!api_->has_suspend()) return no_suspend(*api_);
  if (suspended_) return {};
  poll_locked(Clock::now());  // drops the ops that finished
  if (!failure_.is_ok()) return failed_earlier("suspend");
  if (!outstanding_.empty()) {
    return {ErrorCode::kInvalidArgument, "suspend: " + std::to_string(outstanding_.size()) +
                                             " op(s) still in flight; wait for them first"};
  }
  ++suspends_;
  mem_after_resume_.clear();
  if (!comm_) {
    // A lazy comm has nothing to release; it stays lazy and connects at its
    // next op after the resume, as a re-created one would.
    suspended_ = true;
    mem_before_suspend_ = mem_after_suspend_ = mem_stats_json_locked();
    return {};
  }
  DeviceGuard guard(*api_, device_);
  if (cudaError_t e = guard.status(); e != cudaSuccess) return cuda_status(*api_, e, "cudaSetDevice");
  mem_before_suspend_ = mem_stats_json_locked();
  // Registrations and windows go as they would with the communicator: the
  // caller's handles from before an offload are released either way.
  std::vector<std::string> errors;
  release_windows_locked(&errors);
  deregister_all_locked(&errors);
  Status s = settle(comm_, api_->comm_suspend(comm_, NCCL_SUSPEND_MEM), Clock::now() + op_timeout_,
                    "ncclCommSuspend");
  if (s.is_ok() && !errors.empty()) s = {ErrorCode::kInternal, "suspend: " + errors.front()};
  if (!s.is_ok()) {
    // What NCCL still holds is unknown: abort so that it is released.
    fail_locked(s, nullptr);
    return s;
  }
  suspended_ = true;
  mem_after_suspend_ = mem_stats_json_locked();
  log(1, "ncclCommSuspend(NCCL_SUSPEND_MEM): MemStats before " + mem_before_suspend_ + ", after " +
             mem_after_suspend_);
  return {};
}

Status Core::resume_locked() {
  if (!failure_.is_ok()) return failed_earlier("resume");
  if (!suspended_) return {ErrorCode::kInvalidArgument, "resume: the NCCL communicator is not suspended"};
  ++resumes_;
  if (!comm_) {
    suspended_ = false;
    return {};
  }
  DeviceGuard guard(*api_, device_);
  if (cudaError_t e = guard.status(); e != cudaSuccess) return cuda_status(*api_, e, "cudaSetDevice");
  Status s = settle(comm_, api_->comm_resume(comm_), Clock::now() + init_.init_timeout, "ncclCommResume");
  if (!s.is_ok()) {
    fail_locked(s, nullptr);
    return s;
  }
  suspended_ = false;
  mem_after_resume_ = mem_stats_json_locked();
  return {};
}

}  // namespace comms::nccl
