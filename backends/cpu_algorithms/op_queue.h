// The order in which a CPU backend runs its ops, shared by the Gloo and UCX
// plugins: asynchronous ops run one at a time, in submission order, on one
// worker thread started at the first of them; a blocking op waits until the
// worker has run every op submitted before it, then runs on the caller's
// thread (no thread hop on the path of small blocking ops).
//
// Abort is the backend's, not the queue's: the backend marks itself broken
// and wakes its transport, and its execute callback then fails fast. The
// queue keeps running what it holds, so every queued op still completes,
// with that error, in order (an op is never dropped, and a Work never
// completes before the ones submitted before it). stop_and_join() after an
// abort therefore returns once the running op has noticed it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "comms/plugin.h"
#include "queued_op.h"

namespace comms::cpu_algorithms {

class OpQueue {
 public:
  // Runs one op and returns its status; called on the worker thread for
  // asynchronous ops and on the submitting thread for blocking ones, never
  // for two ops at once. Set once: a lambda capturing the backend's `this`
  // fits std::function's inline storage, so nothing is allocated per op.
  using Execute = std::function<Status(const plugin::OpDesc&)>;
  // Moves along what finished ops left in flight (UCX: a buffered send whose
  // rendezvous needs this side's progress after its op returned); returns
  // true while anything is left. Without it, such a send would wait for the
  // rank's next op, and a rank that sends and then computes, sleeps or waits
  // on another comm would leave its receiver to time out.
  using Progress = std::function<bool()>;

  explicit OpQueue(Execute execute, Progress progress = {})
      : execute_(std::move(execute)), progress_(std::move(progress)) {}
  ~OpQueue() { stop_and_join(); }
  OpQueue(const OpQueue&) = delete;
  OpQueue& operator=(const OpQueue&) = delete;

  // A blocking op (op.async false) waits for the drain, runs here and leaves
  // *work untouched. An asynchronous op is copied (OwnedOp), queued behind
  // the others, and *work is set to wait for it. Called from one thread at
  // a time (plugin::Backend::submit's contract).
  Status submit(const plugin::OpDesc& op, std::unique_ptr<plugin::Work>* work) {
    if (op.async) {
      *work = enqueue(op);
      return {};
    }
    drain();
    // The worker may be moving a send along: one thread at a time in the
    // transport. Nothing is in flight on the usual path: no lock there.
    if (in_flight_.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> turn(turn_);
      return execute_(op);
    }
    return execute_(op);
  }
  // Called by execute (as its last step) when its op left something in
  // flight: the worker then calls progress (with no op queued, at least
  // every millisecond) until it returns false. Starts the worker if needed.
  void progress_later();

  // Returns once every op submitted so far has completed. With none
  // outstanding it only reads an atomic (no lock): only the submitting
  // thread adds ops, so a 0 it reads cannot go stale before it runs its op.
  void drain() {
    if (pending_.load(std::memory_order_acquire) != 0) wait_for_drain();
  }

  // Drains, then ends the worker thread and joins it (finalize). Each op
  // still queued runs first, through execute, within its timeout. A later
  // asynchronous submit starts a new worker.
  void stop_and_join();

 private:
  std::unique_ptr<plugin::Work> enqueue(const plugin::OpDesc& op);
  void wait_for_drain();
  void worker_loop();

  const Execute execute_;
  const Progress progress_;
  // Set by progress_later, cleared by the worker once progress has nothing
  // left; while set, a blocking op takes turn_ (the worker holds it while it
  // progresses), so the transport sees one thread at a time.
  std::atomic<bool> in_flight_{false};
  std::mutex turn_;
  std::mutex mu_;
  std::condition_variable queued_cv_;  // the worker waits for an op or stop_
  std::condition_variable drained_cv_;  // drain() waits for pending_ == 0
  std::deque<std::pair<OwnedOp, std::shared_ptr<Completion>>> queue_;
  // Queued plus running asynchronous ops. Incremented only by the
  // submitting thread, decremented by the worker after the op completed.
  std::atomic<int> pending_{0};
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace comms::cpu_algorithms
