// An in-process Store for tests that must not link libcomms (the plugin's).
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "comms/error.h"
#include "comms/store.h"

namespace comms::nccl::testing {

class MemoryStore final : public Store {
 public:
  void set(const std::string& key, const std::string& value) override {
    std::lock_guard lock(mu_);
    data_[key] = value;
    cv_.notify_all();
  }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return data_.count(key) > 0; })) {
      throw Error(ErrorCode::kTimeout, "no key '" + key + "' within " +
                                           std::to_string(timeout.count()) + " ms");
    }
    return data_[key];
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    for (const auto& k : keys) get(k, timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    std::lock_guard lock(mu_);
    int64_t v = data_.count(key) ? std::stoll(data_[key]) : 0;
    data_[key] = std::to_string(v + delta);
    cv_.notify_all();
    return v + delta;
  }
  bool check(const std::vector<std::string>& keys) override {
    std::lock_guard lock(mu_);
    for (const auto& k : keys) {
      if (!data_.count(k)) return false;
    }
    return true;
  }
  bool delete_key(const std::string& key) override {
    std::lock_guard lock(mu_);
    return data_.erase(key) > 0;
  }
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override {
    std::lock_guard lock(mu_);
    auto it = data_.find(key);
    const std::string current = it == data_.end() ? std::string() : it->second;
    if ((it == data_.end() && expected.empty()) || (it != data_.end() && current == expected)) {
      data_[key] = desired;
      cv_.notify_all();
      return desired;
    }
    return it == data_.end() ? expected : current;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> data_;
};

}  // namespace comms::nccl::testing
