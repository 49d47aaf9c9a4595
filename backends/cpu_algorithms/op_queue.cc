#include "op_queue.h"

namespace comms::cpu_algorithms {

std::unique_ptr<plugin::Work> OpQueue::enqueue(const plugin::OpDesc& op) {
  auto completion = std::make_shared<Completion>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.emplace_back(OwnedOp(op), completion);
    ++pending_;
    if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
  }
  queued_cv_.notify_one();
  return std::make_unique<CompletionWork>(std::move(completion));
}

void OpQueue::wait_for_drain() {
  std::unique_lock<std::mutex> lock(mu_);
  drained_cv_.wait(lock, [&] { return pending_.load() == 0; });
}

void OpQueue::progress_later() {
  in_flight_.store(true, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
  }
  queued_cv_.notify_one();
}

void OpQueue::worker_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  const auto progressing = [&] { return progress_ && in_flight_.load(std::memory_order_acquire); };
  while (true) {
    if (progressing()) {
      queued_cv_.wait_for(lock, std::chrono::milliseconds(1), [&] { return stop_ || !queue_.empty(); });
    } else {
      queued_cv_.wait(lock, [&] { return stop_ || !queue_.empty() || progressing(); });
    }
    if (queue_.empty() && !stop_) {  // nothing to run: move what is in flight along
      lock.unlock();
      {
        std::lock_guard<std::mutex> turn(turn_);
        if (!progress_()) in_flight_.store(false, std::memory_order_release);
      }
      lock.lock();
      continue;
    }
    // After stop, what is still in flight is the transport's to flush at finalize.
    if (queue_.empty()) return;  // stop_, and nothing left to run
    auto [op, completion] = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    completion->finish(execute_(op.desc));
    lock.lock();
    // After finish: a drain that returns sees the op's Work complete.
    if (--pending_ == 0) drained_cv_.notify_all();
  }
}

void OpQueue::stop_and_join() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    drained_cv_.wait(lock, [&] { return pending_.load() == 0; });
    stop_ = true;
  }
  queued_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  std::lock_guard<std::mutex> lock(mu_);
  stop_ = false;  // worker_ is joined: the next async op starts a new one
}

}  // namespace comms::cpu_algorithms
