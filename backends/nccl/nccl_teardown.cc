// Teardown: releasing the communicator and its stream, event and scratch,
// gracefully (finalize, then destroy) or not (abort).
#include <vector>

#include "nccl_core.h"

namespace comms::nccl {

Status Core::release_locked(bool graceful) {
  std::vector<std::string> errors;
  if (comm_) {
    DeviceGuard guard(*api_, device_);
    // A revoked communicator is only ever aborted: ncclCommFinalize after
    // ncclCommRevoke is invalid, and a peer may still be stuck in it.
    if (revoked_) graceful = false;
    // A suspended one has nothing in flight (suspend waited for every op),
    // and NCCL defines no finalize of it: ncclCommAbort releases it without
    // resuming (which would take its memory back) and without its peers.
    if (suspended_) graceful = false;
    // Handles the caller left registered; an abort releases them with the comm.
    if (graceful) {
      release_windows_locked(&errors);
      deregister_all_locked(&errors);
    }
    registered_.clear();
    windows_.clear();
    if (graceful) {
      const auto deadline = Clock::now() + op_timeout_;
      ncclResult_t r = api_->comm_finalize(comm_);
      Status s = settle(comm_, r, deadline, "ncclCommFinalize");
      if (!s.is_ok()) {
        errors.push_back(s.message);
        if (ncclResult_t a = api_->comm_abort(comm_); !accepted(a)) {
          errors.push_back(std::string("ncclCommAbort failed: ") + api_->error_string(a));
        }
      } else if (ncclResult_t d = api_->comm_destroy(comm_); !accepted(d)) {
        errors.push_back(nccl_status(*api_, nullptr, d, "ncclCommDestroy").message);
      }
    } else if (ncclResult_t a = api_->comm_abort(comm_); !accepted(a)) {
      errors.push_back(std::string("ncclCommAbort failed: ") + api_->error_string(a));
    }
    comm_ = nullptr;
    revoked_ = false;
  }
  suspended_ = false;
  if (scratch_) {
    if (cudaError_t e = api_->free_device(scratch_); e != cudaSuccess) {
      errors.push_back(cuda_status(*api_, e, "cudaFree of the barrier scratch").message);
    }
    scratch_ = nullptr;
  }
  if (caller_ready_) {
    if (cudaError_t e = api_->event_destroy(caller_ready_); e != cudaSuccess) {
      errors.push_back(cuda_status(*api_, e, "cudaEventDestroy").message);
    }
    caller_ready_ = nullptr;
  }
  if (stream_) {
    if (cudaError_t e = api_->stream_destroy(stream_); e != cudaSuccess) {
      errors.push_back(cuda_status(*api_, e, "cudaStreamDestroy").message);
    }
    stream_ = nullptr;
  }
  if (errors.empty()) return {};
  std::string msg = "releasing the NCCL communicator failed:";
  for (const auto& e : errors) msg += " " + e + ";";
  msg.pop_back();
  return {ErrorCode::kInternal, msg};
}

void Core::destroy_locked() {
  poll_locked(Clock::now());  // ops that did finish keep their success
  if (!outstanding_.empty()) {
    fail_locked({ErrorCode::kAborted, "the comm was destroyed with ops in flight"}, nullptr);
  }
  // Nothing can report a failure from a destructor; log it.
  if (Status s = release_locked(/*graceful=*/false); !s.is_ok()) log(3, s.message);
}

}  // namespace comms::nccl
