// CommsWork, the futures DDP's communication hooks wait on, and the store
// adapter.
#include <c10/util/Exception.h>

#include <algorithm>
#include <thread>

#include "process_group.h"

namespace comms_torch {

// --- the store torch hands the backend ----------------------------------------

namespace {
std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

// c10d stores report a timeout as a c10::Error; comms callers expect kTimeout.
template <class F>
auto store_call(const char* what, const std::string& key, F&& f) {
  try {
    return f();
  } catch (const comms::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw comms::Error(comms::ErrorCode::kTimeout,
                       std::string("torch store ") + what + " '" + key + "': " + e.what());
  }
}
}  // namespace

void C10dStore::set(const std::string& key, const std::string& value) {
  store_call("set", key, [&] { store_->set(key, bytes(value)); });
}

std::string C10dStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  return store_call("get", key, [&] {
    store_->wait({key}, timeout);
    return text(store_->get(key));
  });
}

void C10dStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  store_call("wait", keys.empty() ? std::string() : keys[0], [&] { store_->wait(keys, timeout); });
}

int64_t C10dStore::add(const std::string& key, int64_t delta) {
  return store_call("add", key, [&] { return store_->add(key, delta); });
}

bool C10dStore::check(const std::vector<std::string>& keys) {
  return store_call("check", keys.empty() ? std::string() : keys[0], [&] { return store_->check(keys); });
}

bool C10dStore::delete_key(const std::string& key) {
  return store_call("delete", key, [&] { return store_->deleteKey(key); });
}

std::string C10dStore::compare_set(const std::string& key, const std::string& expected,
                                   const std::string& desired) {
  return store_call("compare_set", key,
                    [&] { return text(store_->compareSet(key, bytes(expected), bytes(desired))); });
}

// --- futures ------------------------------------------------------------------

// Completes the futures asked for (getFuture), in issue order, on its own
// thread, started on first use: ops nobody asks a future of cost nothing.
class FutureWatcher {
 public:
  ~FutureWatcher() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  void watch(c10::intrusive_ptr<CommsWork> work) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    queue_.push_back(std::move(work));
    cv_.notify_all();
  }

 private:
  void run() {
    for (;;) {
      c10::intrusive_ptr<CommsWork> work;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        work = std::move(queue_.front());
        queue_.pop_front();
      }
      complete(*work);
    }
  }

  static void complete(CommsWork& work) {
    try {
      work.await_assignment(::kNoTimeout);
      if (work.error_) std::rethrow_exception(work.error_);
      work.work_.blocking_wait();
      work.finish_once();
      work.future_->markCompleted(c10::IValue(work.outputs_));
    } catch (...) {
      work.future_->setError(std::current_exception());
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<c10::intrusive_ptr<CommsWork>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

std::shared_ptr<FutureWatcher> make_future_watcher() { return std::make_shared<FutureWatcher>(); }

// --- work ---------------------------------------------------------------------

CommsWork::CommsWork(comms::Work work, std::vector<at::Tensor> keep, std::vector<at::Tensor> outputs,
                     c10d::OpType type, int rank, std::shared_ptr<FutureWatcher> watcher)
    : c10d::Work(rank, type),
      work_(std::move(work)),
      keep_(std::move(keep)),
      outputs_(std::move(outputs)),
      watcher_(std::move(watcher)) {}

CommsWork::~CommsWork() = default;

void CommsWork::finish_once() {
  std::lock_guard<std::mutex> lock(finish_mutex_);
  if (!finish_) return;
  auto finish = std::move(finish_);
  finish_ = nullptr;
  finish();
}

void CommsWork::expect_assignment() { assigned_.store(false, std::memory_order_release); }

void CommsWork::assign(comms::Work work) {
  {
    std::lock_guard<std::mutex> lock(assign_mutex_);
    work_ = std::move(work);
    assigned_.store(true, std::memory_order_release);
  }
  assign_cv_.notify_all();
}

void CommsWork::assign_error(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(assign_mutex_);
    error_ = std::move(error);
    assigned_.store(true, std::memory_order_release);
  }
  assign_cv_.notify_all();
}

bool CommsWork::await_assignment(std::chrono::milliseconds timeout) {
  if (assigned()) return true;
  std::unique_lock<std::mutex> lock(assign_mutex_);
  if (timeout == kNoTimeout) {
    assign_cv_.wait(lock, [&] { return assigned(); });
    return true;
  }
  return assign_cv_.wait_for(lock, timeout, [&] { return assigned(); });
}

bool CommsWork::isCompleted() {
  if (!assigned()) return false;
  if (error_) return true;
  if (!work_.is_completed()) return false;
  if (work_.status() == comms::ErrorCode::kOk) finish_once();
  return true;
}

bool CommsWork::isSuccess() const {
  return assigned() && !error_ && work_.is_completed() && work_.status() == comms::ErrorCode::kOk;
}

std::exception_ptr CommsWork::exception() const {
  if (!assigned()) return nullptr;
  if (error_) return error_;
  if (!work_.is_completed() || work_.status() == comms::ErrorCode::kOk) return nullptr;
  return std::make_exception_ptr(comms::Error(work_.status(), work_.error_message()));
}

bool CommsWork::wait(std::chrono::milliseconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  const auto timed_out = [&] {
    return comms::Error(comms::ErrorCode::kTimeout, "comms.torch Work.wait: the op did not finish within " +
                                                        std::to_string(timeout.count()) + " ms");
  };
  if (!await_assignment(timeout)) throw timed_out();
  if (error_) std::rethrow_exception(error_);
  if (timeout != kNoTimeout) {
    const auto deadline = start + timeout;
    while (!work_.is_completed()) {
      if (std::chrono::steady_clock::now() >= deadline) throw timed_out();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  work_.wait();  // CUDA: torch's current stream waits for the op
  finish_once();
  return true;
}

void CommsWork::synchronize() { wait(kNoTimeout); }

c10::intrusive_ptr<c10::ivalue::Future> CommsWork::getFuture() {
  std::lock_guard<std::mutex> lock(future_mutex_);
  if (!future_) {
    std::vector<c10::Device> devices;
    for (const auto& t : outputs_) {
      if (t.is_cuda() && std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
        devices.push_back(t.device());
      }
    }
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
    watcher_->watch(c10::intrusive_ptr<CommsWork>::reclaim_copy(this));
  }
  return future_;
}

}  // namespace comms_torch
