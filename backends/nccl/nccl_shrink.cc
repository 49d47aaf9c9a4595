// Elastic recovery: revoking the communicator (ncclCommRevoke, NCCL >= 2.28)
// and shrinking it natively (ncclCommShrink, NCCL >= 2.27), each only when the
// NCCL loaded at run time has it (NcclApi::has_revoke/has_shrink).
#include <algorithm>
#include <thread>

#include "nccl_core.h"

namespace comms::nccl {

void Core::request_revoke(const std::string& reason) {
  revoke_requested_ = true;  // wakes a settle() that holds mu (init, split)
  std::lock_guard lock(mu);
  if (!failure_.is_ok()) return;  // failed or aborted already: comm_ is gone
  const Status cause{ErrorCode::kRevoked, "comm revoked: " + reason};
  if (!comm_ || !api_->has_revoke()) {
    fail_locked(cause, nullptr);  // ncclCommAbort; ops fail with kRevoked
    return;
  }
  DeviceGuard guard(*api_, device_);
  if (ncclResult_t r = api_->comm_revoke(comm_, NCCL_REVOKE_DEFAULT); !accepted(r)) {
    log(2, nccl_status(*api_, comm_, r, "ncclCommRevoke").message + "; aborting the communicator instead");
    fail_locked(cause, nullptr);
    return;
  }
  // The ops' kernels stop; their Works answer now, as after an abort.
  failure_ = cause;
  revoked_ = true;
  for (auto& w : outstanding_) {
    if (!w->done) {
      w->done = true;
      w->status = cause;
    }
  }
  outstanding_.clear();
  log(2, cause.message + " (ncclCommRevoke; the communicator is kept for a shrink)");
}

bool Core::can_shrink_locked() {
  return comm_ != nullptr && api_->has_shrink() && (failure_.is_ok() || revoked_);
}

Status Core::shrink_locked(std::vector<int> exclude, const NcclConfigFields& child_fields,
                           const std::string& child_name, std::chrono::milliseconds timeout,
                           ncclComm_t* child, int* flags) {
  *child = nullptr;
  if (!can_shrink_locked()) {
    return {ErrorCode::kUnsupported, "ncclCommShrink: not available, or the communicator was aborted"};
  }
  DeviceGuard guard(*api_, device_);
  const auto deadline = Clock::now() + timeout;
  // Polls the parent until no call on it is in progress. A revoked one
  // answers ncclInProgress until it is quiescent, and may then answer an
  // error (a dead peer), which NCCL_SHRINK_ABORT copes with.
  const bool revoked = revoked_;
  const auto quiesce = [&](const char* what) -> Status {
    ncclResult_t state = ncclInProgress;
    auto sleep = std::chrono::microseconds(10);
    for (;;) {
      ncclResult_t async = ncclSuccess;
      const ncclResult_t q = api_->comm_get_async_error(comm_, &async);
      state = q != ncclSuccess ? q : async;
      if (state != ncclInProgress) break;
      if (Clock::now() >= deadline) {
        return {ErrorCode::kTimeout, std::string(what) + " did not finish within " + ms_text(timeout)};
      }
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::microseconds(1000));
    }
    if (state != ncclSuccess && !revoked) return nccl_status(*api_, comm_, state, what);
    return {};
  };
  // A shrink that failed part-way leaves the parent in an unknown state: it
  // is aborted (never destroyed), so that the next round re-creates.
  const auto give_up = [&](Status s) {
    if (revoked_) {
      if (ncclResult_t a = api_->comm_abort(comm_); !accepted(a)) {
        log(3, std::string("ncclCommAbort failed: ") + api_->error_string(a));
      }
      comm_ = nullptr;
      revoked_ = false;
      registered_.clear();
      log(3, s.message);
    } else {
      fail_locked(s, nullptr);
    }
    return s;
  };
  if (revoked) {
    if (Status s = quiesce("quiescing the revoked NCCL communicator"); !s.is_ok()) return give_up(s);
  }
  *flags = revoked ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT;
  const NcclConfigFields fields = plugin_config_fields(child_fields, child_name);
  NcclConfig config = initial_config(api_->loaded_version());
  apply_to_config(fields, &config);
  std::sort(exclude.begin(), exclude.end());
  ncclComm_t out = nullptr;
  const ncclResult_t r = api_->comm_shrink(comm_, exclude.empty() ? nullptr : exclude.data(),
                                           static_cast<int>(exclude.size()), &out, &config, *flags);
  // NCCL checks the arguments before any rank communicates, and every
  // survivor passes the same ones: a refusal there (say, of an empty exclude
  // list) is the same everywhere, and re-creating instead is safe.
  if (r == ncclInvalidArgument || r == ncclInvalidUsage) {
    return {ErrorCode::kUnsupported, nccl_status(*api_, comm_, r, "ncclCommShrink").message +
                                         ": the comm is re-created instead"};
  }
  // As for split on a non-blocking parent: the parent is polled to success,
  // then the child (which may be written only then).
  Status s = accepted(r) ? quiesce("ncclCommShrink") : nccl_status(*api_, comm_, r, "ncclCommShrink");
  if (s.is_ok() && !out) s = {ErrorCode::kInternal, "ncclCommShrink returned no communicator"};
  s = settle_child(s, out, deadline, timeout, "ncclCommShrink", "do all surviving ranks shrink?", false);
  if (!s.is_ok()) {
    return give_up(s);
  }
  *child = out;
  return {};
}

}  // namespace comms::nccl
