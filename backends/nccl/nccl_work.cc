// Completion and failure: when an op is done or late, the watchdog's round,
// how the first failure aborts the communicator, and the Work handed to the
// caller.
#include <algorithm>
#include <cstdlib>
#include <thread>

#include "nccl_core.h"

namespace comms::nccl {

bool Core::check_work_locked(WorkState& w, Clock::time_point now, bool query) {
  if (w.done) return true;
  const cudaError_t q = query ? api_->event_query(w.end) : cudaErrorNotReady;
  if (q == cudaSuccess) {
    w.done = true;
    return true;
  }
  if (q != cudaErrorNotReady) {
    fail_locked(cuda_status(*api_, q, "waiting for " + w.label()), &w);
    return true;
  }
  if (now >= w.deadline) {
    fail_locked({ErrorCode::kTimeout, w.label() + " did not complete within " +
                                          ms_text(w.timeout) +
                                          "; the NCCL communicator was aborted"},
                &w);
    return true;
  }
  return false;
}

void Core::poll_locked(Clock::time_point now) {
  if (comm_ && failure_.is_ok()) {
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = api_->comm_get_async_error(comm_, &async);
    if (r != ncclSuccess) async = r;
    if (async != ncclSuccess && async != ncclInProgress) {
      fail_locked(nccl_status(*api_, comm_, async, "NCCL (asynchronous error)"), nullptr);
    }
  }
  // Ops finish in issue order on the one stream: events are queried up to
  // the first that has not fired (a round stays cheap with many ops queued).
  // A failure clears the queue (fail_locked): hold each op while checking
  // it, and stop there.
  bool query = true;
  for (size_t i = 0; i < outstanding_.size() && failure_.is_ok(); ++i) {
    const std::shared_ptr<WorkState> w = outstanding_[i];
    query = check_work_locked(*w, now, query) && query;
  }
  while (!outstanding_.empty() && outstanding_.front()->done) outstanding_.pop_front();
}

void Core::fail_locked(Status cause, WorkState* culprit) {
  if (!failure_.is_ok()) return;
  failure_ = cause;
  if (culprit) {
    culprit->done = true;
    culprit->status = cause;
  }
  // Without a culprit (abort(), an async NCCL error) every outstanding op
  // fails for the same cause; with one, the others were collateral.
  const Status collateral =
      culprit ? Status(ErrorCode::kAborted,
                       "aborted because " + culprit->label() + " failed: " + cause.message)
              : cause;
  for (auto& w : outstanding_) {
    if (!w->done) {
      w->done = true;
      w->status = collateral;
    }
  }
  outstanding_.clear();
  if (comm_) {
    if (ncclResult_t r = api_->comm_abort(comm_); !accepted(r)) {
      log(3, std::string("ncclCommAbort failed: ") + api_->error_string(r));
    }
    comm_ = nullptr;
    registered_.clear();  // released with the aborted communicator
    windows_.clear();
    suspended_ = false;
  }
  log(3, cause.message);
  if (init_.abort_process_on_error && cause.code != ErrorCode::kAborted && cause.code != ErrorCode::kRevoked) {
    log(3, "abort_process_on_error is set: aborting the process");
    std::abort();
  }
}

void Core::request_abort(const std::string& reason) {
  abort_requested_ = true;
  std::lock_guard lock(mu);
  if (revoked_ && comm_) {
    // Revoked earlier (failure_ is set, so fail_locked would keep it): abort now.
    if (ncclResult_t r = api_->comm_abort(comm_); !accepted(r)) {
      log(3, std::string("ncclCommAbort failed: ") + api_->error_string(r));
    }
    comm_ = nullptr;
    revoked_ = false;
    registered_.clear();
    windows_.clear();
  }
  fail_locked({ErrorCode::kAborted, "comm aborted: " + reason}, nullptr);
}

// --- NcclWork ---------------------------------------------------------------

bool NcclWork::is_completed() {
  std::lock_guard lock(core_->mu);
  return core_->check_work_locked(*state_, Clock::now());
}

Status NcclWork::wait(WaitMode mode) {
  if (mode == WaitMode::kStream) {
    std::lock_guard lock(core_->mu);
    if (state_->done) return state_->status;
    if (cudaError_t e = core_->api().stream_wait_event(caller_, state_->end); e != cudaSuccess) {
      return cuda_status(core_->api(), e, "cudaStreamWaitEvent on the caller's stream");
    }
    return {};
  }
  // Poll with a short back-off: a condition variable would need a host
  // callback on the stream, which cannot be cancelled when NCCL hangs.
  auto sleep = std::chrono::microseconds(0);
  for (;;) {
    {
      std::lock_guard lock(core_->mu);
      if (core_->check_work_locked(*state_, Clock::now())) return state_->status;
    }
    if (sleep.count() == 0) std::this_thread::yield();
    else std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep + std::chrono::microseconds(20), std::chrono::microseconds(500));
  }
}

// --- Watchdog ---------------------------------------------------------------

Watchdog::Watchdog(std::shared_ptr<Core> core, std::chrono::milliseconds interval)
    : core_(std::move(core)), interval_(interval), thread_([this] { loop(); }) {}

void Watchdog::loop() {
  std::unique_lock lock(core_->mu);
  while (!stop_) {
    core_->watchdog_cv.wait_for(lock, interval_);
    if (stop_) break;
    core_->poll_locked(Clock::now());
  }
}

void Watchdog::stop() {
  {
    std::lock_guard lock(core_->mu);
    stop_ = true;
  }
  core_->watchdog_cv.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace comms::nccl
