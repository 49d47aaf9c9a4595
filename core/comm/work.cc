// Work, the handle of an async op, and the state behind it.
#include "comm/comm_impl.h"

namespace comms {

namespace internal {

bool WorkState::is_completed() {
  // Not under mu_: a blocking wait() on another thread holds it until the
  // op ends, and is_completed() promises not to block.
  if (done_.load(std::memory_order_acquire)) return true;
  return plugin_says_completed();
}

bool WorkState::plugin_says_completed() {
  bool completed = false;
  const Status st = internal::call_plugin(comm_->plugin_name(device_type_), "is_completed", [&] {
    completed = work_->is_completed();
    return Status{};
  });
  // A plugin that cannot tell: report the op as ended, so that the caller's
  // wait() collects its status (and the plugin's failure, if it has one).
  return completed || !st.is_ok();
}

std::optional<Error> WorkState::wait(WaitMode mode) {
  std::lock_guard<std::mutex> lock(mu_);
  if (done_.load(std::memory_order_relaxed)) return error_;
  Status st = internal::call_plugin(comm_->plugin_name(device_type_), "wait", [&] { return work_->wait(mode); });
  // A stream wait on a device op only orders the caller's stream: the op may
  // still be running and may still fail, so the Work stays open.
  if (st.is_ok() && mode == WaitMode::kStream && !plugin_says_completed()) return std::nullopt;
  if (window_op_) {
    if (st.is_ok()) comm_->recorder().completed_window_op(seq_);
    else error_ = comm_->failed_window_op(*window_op_, seq_, st, device_type_);
  } else if (!st.is_ok()) {
    error_ = comm_->failed_op(type_, seq_, collective_, st, device_type_);
  } else {
    comm_->recorder().completed(seq_, type_, collective_);
  }
  done_.store(true, std::memory_order_release);
  return error_;
}

ErrorCode WorkState::status() {
  if (!is_completed()) return ErrorCode::kOk;
  auto e = wait(WaitMode::kBlocking);
  return e ? e->code() : ErrorCode::kOk;
}

std::string WorkState::error_message() {
  if (!is_completed()) return {};
  auto e = wait(WaitMode::kBlocking);
  return e ? e->what() : std::string();
}

}  // namespace internal

void Work::wait() { wait(WaitMode::kStream); }
void Work::blocking_wait() { wait(WaitMode::kBlocking); }

void Work::wait(WaitMode mode) {
  if (!state_) return;
  if (auto error = state_->wait(mode)) throw *error;
}

bool Work::is_completed() const { return !state_ || state_->is_completed(); }

ErrorCode Work::status() const { return state_ ? state_->status() : ErrorCode::kOk; }

std::string Work::error_message() const { return state_ ? state_->error_message() : std::string(); }

}  // namespace comms
