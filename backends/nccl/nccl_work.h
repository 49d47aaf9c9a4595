// One op's completion (WorkState and the Work handed to the caller), the pool
// of end-of-op events, and the watchdog thread that retires ops and enforces
// their deadlines. The rules for checking one op live in nccl_work.cc.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comms/plugin.h"
#include "nccl_api.h"
#include "nccl_call.h"

namespace comms::nccl {

class Core;

// Reused end-of-op events: creating and destroying one per op cost about a
// microsecond of comms' per-op overhead over raw NCCL. Shared with the Works,
// which give their event back when they go; events are released with the last
// holder. Every event is created on the comm's device.
class EventPool {
 public:
  explicit EventPool(std::shared_ptr<NcclApi> api) : api_(std::move(api)) {}
  ~EventPool() {
    for (cudaEvent_t e : free_) api_->event_destroy(e);
  }
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // The caller has the comm's device current.
  cudaError_t take(cudaEvent_t* e) {
    {
      std::lock_guard lock(mu_);
      if (!free_.empty()) {
        *e = free_.back();
        free_.pop_back();
        return cudaSuccess;
      }
    }
    return api_->event_create(e);
  }
  // Re-recording an event that is still pending is allowed: a wait already
  // enqueued on it keeps waiting for the capture it saw.
  void give(cudaEvent_t e) {
    {
      std::lock_guard lock(mu_);
      if (free_.size() < kKept) {
        free_.push_back(e);
        return;
      }
    }
    api_->event_destroy(e);
  }

 private:
  // Ops stay queued until the watchdog's next round: enough for 20 ms of ops
  // at a few microseconds each.
  static constexpr size_t kKept = 8192;
  std::shared_ptr<NcclApi> api_;
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

// One op's completion, shared by its Work, the comm's queue and the watchdog.
struct WorkState {
  std::shared_ptr<EventPool> events;
  uint64_t seq = 0;
  plugin::OpType type = plugin::OpType::kBarrier;
  const char* window_op = nullptr;  // a window op's name, which `type` cannot say
  cudaEvent_t end = nullptr;
  std::chrono::milliseconds timeout{0};
  Clock::time_point deadline;
  // Guarded by Core::mu.
  bool done = false;
  Status status;

  ~WorkState() {
    if (end) events->give(end);
  }
  std::string label() const {
    return (window_op ? std::string(window_op) : std::string(plugin::op_name(type))) + " #" + std::to_string(seq);
  }
};

class NcclWork final : public plugin::Work {
 public:
  NcclWork(std::shared_ptr<Core> core, std::shared_ptr<WorkState> state, cudaStream_t caller)
      : core_(std::move(core)), state_(std::move(state)), caller_(caller) {}

  bool is_completed() override;
  Status wait(WaitMode mode) override;

 private:
  std::shared_ptr<Core> core_;
  std::shared_ptr<WorkState> state_;
  cudaStream_t caller_;
};

// An op recorded into a CUDA graph: it runs at each launch of the graph,
// which the host does not track. kStream waits are no-ops (the op is on the
// caller's stream); a blocking wait is refused instead of hanging.
class CapturedWork final : public plugin::Work {
 public:
  explicit CapturedWork(plugin::OpType type) : type_(type) {}
  bool is_completed() override;
  Status wait(WaitMode mode) override;

 private:
  plugin::OpType type_;
};

// Polls the comm every `interval` (Core::poll_locked) until stopped.
class Watchdog {
 public:
  Watchdog(std::shared_ptr<Core> core, std::chrono::milliseconds interval);
  ~Watchdog() { stop(); }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  // Joins the thread; idempotent.
  void stop();

 private:
  void loop();

  std::shared_ptr<Core> core_;
  std::chrono::milliseconds interval_;
  bool stop_ = false;  // guarded by core_->mu
  std::thread thread_;
};

}  // namespace comms::nccl
