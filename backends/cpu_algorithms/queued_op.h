// What a CPU backend's async queue holds: an op with everything it points
// to copied (the caller's spans may go away once submit returns), and the
// completion its Work waits on. Shared by the Gloo and UCX plugins, whose
// worker threads run queued ops in submission order.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "comms/plugin.h"

namespace comms::cpu_algorithms {

struct OwnedOp {
  plugin::OpDesc desc;
  std::vector<size_t> counts, output_counts;
  std::vector<void*> output_list;
  std::vector<P2POp> p2p;

  explicit OwnedOp(const plugin::OpDesc& d)
      : desc(d),
        counts(d.counts.begin(), d.counts.end()),
        output_counts(d.output_counts.begin(), d.output_counts.end()),
        output_list(d.output_list.begin(), d.output_list.end()),
        p2p(d.p2p.begin(), d.p2p.end()) {
    desc.counts = counts;
    desc.output_counts = output_counts;
    desc.output_list = output_list;
    desc.p2p = p2p;
    desc.hints = nullptr;  // per-op hints were applied at submit
  }
};

struct Completion {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;

  void finish(Status s) {
    std::lock_guard<std::mutex> lock(mu);
    status = std::move(s);
    done = true;
    cv.notify_all();
  }
};

class CompletionWork : public plugin::Work {
 public:
  explicit CompletionWork(std::shared_ptr<Completion> c) : c_(std::move(c)) {}
  bool is_completed() override {
    std::lock_guard<std::mutex> lock(c_->mu);
    return c_->done;
  }
  Status wait(WaitMode) override {
    std::unique_lock<std::mutex> lock(c_->mu);
    c_->cv.wait(lock, [&] { return c_->done; });
    return c_->status;
  }

 private:
  std::shared_ptr<Completion> c_;
};

}  // namespace comms::cpu_algorithms
