#include "comm_impl.h"

namespace comms {

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
