// The handle of an operation.
#pragma once

#include "comms/export.h"

#include <memory>
#include <string>

#include "comms/error.h"
#include "comms/options.h"

namespace comms {

namespace internal {
class WorkState;
}

class COMMS_API Work {
 public:
  // A completed, successful work (what synchronous calls return).
  Work() = default;
  explicit Work(std::shared_ptr<internal::WorkState> state) : state_(std::move(state)) {}

  // Waits for the op and throws its comms::Error if it failed. For CUDA ops
  // the caller's stream waits for the op (WaitMode::kStream); blocking_wait()
  // blocks the calling thread instead.
  void wait();
  void blocking_wait();
  // Non-blocking, also while another thread is blocked in wait().
  bool is_completed() const;
  // kOk while pending or after success; the error code once it failed.
  ErrorCode status() const;
  // The full error message once it failed, else "".
  std::string error_message() const;

 private:
  void wait(WaitMode mode);
  std::shared_ptr<internal::WorkState> state_;
};

}  // namespace comms
