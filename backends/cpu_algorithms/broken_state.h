// A CPU backend's failure state, shared by the Gloo and UCX plugins: after
// the first fatal error (or abort()) every op fails fast with
//   kAborted "an earlier failure left this communicator unusable: <reason>"
// where <reason> is the first failure's message, or abort()'s reason when
// abort() came first. aborted() tells an abort apart from a failure, for
// the backends that word the running op's error differently after one.
//
// broken() and aborted() are atomic loads (the per-op check takes no lock);
// the mutex guards only the reason text. The reason is written before
// broken is set, and aborted after broken.
#pragma once

#include <atomic>
#include <mutex>
#include <string>

#include "comms/error.h"

namespace comms::cpu_algorithms {

class BrokenState {
 public:
  bool broken() const { return broken_.load(); }
  bool aborted() const { return aborted_.load(); }

  // The first call's reason is kept; later ones change nothing.
  void mark_broken(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_) {
      reason_ = reason;
      broken_ = true;
    }
  }

  // Broken (keeping an earlier failure's reason), then aborted.
  void abort(const std::string& reason) {
    mark_broken(reason);
    aborted_ = true;
  }

  std::string reason() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reason_;
  }

  // What an op returns once the comm is broken.
  Status status() const {
    return {ErrorCode::kAborted, "an earlier failure left this communicator unusable: " + reason()};
  }

 private:
  mutable std::mutex mu_;
  std::atomic<bool> broken_{false};
  std::atomic<bool> aborted_{false};
  std::string reason_;
};

}  // namespace comms::cpu_algorithms
