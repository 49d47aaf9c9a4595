// Elastic growth: growing the communicator natively (ncclCommGetUniqueId and
// ncclCommGrow, NCCL >= 2.29) when the NCCL loaded at run time has them
// (NcclApi::has_grow). The members grow their communicator; a newcomer joins
// the grown one with the id a member took from its communicator.
#include "nccl_core.h"

namespace comms::nccl {

bool Core::can_grow_locked() {
  return comm_ != nullptr && api_->has_grow() && failure_.is_ok() && !revoked_ && !suspended_;
}

Status Core::grow_unique_id_locked(ncclUniqueId* id) {
  DeviceGuard guard(*api_, device_);
  if (ncclResult_t r = api_->comm_get_unique_id(comm_, id); r != ncclSuccess) {
    return nccl_status(*api_, comm_, r, "ncclCommGetUniqueId");
  }
  return {};
}

Status Core::grow_locked(int size, const ncclUniqueId* id, const NcclConfigFields& child_fields,
                         const std::string& child_name, std::chrono::milliseconds timeout, ncclComm_t* child) {
  *child = nullptr;
  if (!can_grow_locked()) {
    return {ErrorCode::kUnsupported, "ncclCommGrow: not available, or the communicator is not up and healthy"};
  }
  const NcclConfigFields fields = plugin_config_fields(child_fields, child_name);
  NcclConfig config = initial_config(api_->loaded_version());
  apply_to_config(fields, &config);
  DeviceGuard guard(*api_, device_);
  const auto deadline = Clock::now() + timeout;
  ncclComm_t out = nullptr;
  const ncclResult_t r = api_->comm_grow(comm_, size, id, -1, &out, &config);
  // As for split and shrink on a non-blocking parent: the parent is polled
  // to success, then the child (which may be written only then).
  Status s = settle(comm_, r == ncclSuccess ? ncclInProgress : r, deadline, "ncclCommGrow");
  if (s.is_ok() && !out) s = {ErrorCode::kInternal, "ncclCommGrow returned no communicator"};
  s = settle_child(s, out, deadline, timeout, "ncclCommGrow", "do every member and every newcomer grow?");
  if (!s.is_ok()) {
    // A grow that failed part-way may have consumed the id or left NCCL
    // waiting on the parent: it cannot be trusted any more.
    fail_locked(s, nullptr);
    return s;
  }
  *child = out;
  return {};
}

Status Core::join_grown_locked(const ncclUniqueId& id) {
  DeviceGuard guard(*api_, device_);
  if (cudaError_t e = guard.status(); e != cudaSuccess) {
    return {ErrorCode::kNotFound, "cannot bind cuda:" + std::to_string(device_) + ": " + api_->cuda_error_string(e) +
                                      " (is a CUDA device present and visible?)"};
  }
  NcclConfig config = initial_config(api_->loaded_version());
  effective_ = effective_fields();
  apply_to_config(effective_, &config);
  const auto deadline = Clock::now() + init_.init_timeout;
  ncclComm_t comm = nullptr;
  const ncclResult_t r = api_->comm_grow(nullptr, init_.size, &id, init_.rank, &comm, &config);
  Status s = accepted(r) && !comm ? Status{ErrorCode::kInternal, "ncclCommGrow returned no communicator"}
                                  : settle(comm, r, deadline, "ncclCommGrow");
  if (!s.is_ok()) {
    if (comm) api_->comm_abort(comm);
    if (s.code == ErrorCode::kTimeout && Clock::now() >= deadline) {  // ours, not ncclTimeout
      s.message = "ncclCommGrow as newcomer rank " + std::to_string(init_.rank) + " of " +
                  std::to_string(init_.size) + " did not finish within " + ms_text(init_.init_timeout) +
                  "; do every member and every newcomer grow?";
    }
    failure_ = s;
    return s;
  }
  created_by_ = "ncclCommGrow";
  if (Status a = adopt_locked(comm); !a.is_ok()) {
    failure_ = a;
    return a;
  }
  return {};
}

}  // namespace comms::nccl
