// The in-process store and the prefix store.
#include <condition_variable>
#include <mutex>
#include <unordered_map>

#include "util/strutil.h"
#include "comms/error.h"
#include "comms/store.h"
#include "store_semantics.h"
#include "store_tcp.h"

namespace comms {
namespace {

using store_semantics::quoted_keys;

class MemoryStore final : public Store {
 public:
  using Store::get;
  using Store::wait;

  void set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      values_[key] = value;
    }
    changed_.notify_all();
  }

  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    auto deadline = store_semantics::deadline_after(timeout);
    auto found = values_.end();
    bool present = changed_.wait_until(lock, deadline, [&] {
      found = values_.find(key);
      return found != values_.end();
    });
    if (!present) throw timeout_error("get", {key}, timeout);
    return found->second;
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    auto deadline = store_semantics::deadline_after(timeout);
    if (!changed_.wait_until(lock, deadline, [&] { return all_present(keys); })) {
      throw timeout_error("wait", keys, timeout);
    }
  }

  int64_t add(const std::string& key, int64_t delta) override {
    int64_t result = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      result = store_semantics::added_value(key, lookup(key), delta);
      values_[key] = std::to_string(result);
    }
    changed_.notify_all();
    return result;
  }

  bool check(const std::vector<std::string>& keys) override {
    std::lock_guard<std::mutex> lock(mu_);
    return all_present(keys);
  }

  bool delete_key(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    return values_.erase(key) > 0;
  }

  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override {
    store_semantics::CompareSetOutcome outcome;
    {
      std::lock_guard<std::mutex> lock(mu_);
      outcome = store_semantics::compare_set_outcome(lookup(key), expected, desired);
      if (outcome.swapped) values_[key] = *outcome.stored;
    }
    if (outcome.swapped) changed_.notify_all();
    return outcome.returned;
  }

 private:
  std::optional<std::string> lookup(const std::string& key) const {
    auto it = values_.find(key);
    if (it == values_.end()) return std::nullopt;
    return it->second;
  }

  bool all_present(const std::vector<std::string>& keys) const {
    for (const auto& k : keys) {
      if (!values_.contains(k)) return false;
    }
    return true;
  }

  Error timeout_error(const char* op, const std::vector<std::string>& keys,
                      std::chrono::milliseconds timeout) const {
    std::vector<std::string> missing;
    for (const auto& k : keys) {
      if (!values_.contains(k)) missing.push_back(k);
    }
    return Error(ErrorCode::kTimeout,
                 str::cat(op, "(", quoted_keys(keys), ") on the in-process store timed out after ",
                              timeout.count(), " ms; missing: ", quoted_keys(missing)));
  }

  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::unordered_map<std::string, std::string> values_;
};

class PrefixStore final : public Store {
 public:
  using Store::get;
  using Store::wait;

  PrefixStore(std::string prefix, std::shared_ptr<Store> base)
      : prefix_(std::move(prefix) + "/"), base_(std::move(base)) {
    default_timeout_ = base_->default_timeout();
  }

  void set(const std::string& key, const std::string& value) override { base_->set(full(key), value); }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    return base_->get(full(key), timeout);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    base_->wait(full(keys), timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override { return base_->add(full(key), delta); }
  bool check(const std::vector<std::string>& keys) override { return base_->check(full(keys)); }
  const Store& base() const { return *base_; }
  bool delete_key(const std::string& key) override { return base_->delete_key(full(key)); }
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override {
    return base_->compare_set(full(key), expected, desired);
  }

 private:
  std::string full(const std::string& key) const { return prefix_ + key; }
  std::vector<std::string> full(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& k : keys) out.push_back(full(k));
    return out;
  }

  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace

std::shared_ptr<Store> make_memory_store() { return std::make_shared<MemoryStore>(); }

const Store* prefix_store_base(const Store& store) {
  auto* prefixed = dynamic_cast<const PrefixStore*>(&store);
  return prefixed ? &prefixed->base() : nullptr;
}

std::shared_ptr<Store> make_prefix_store(const std::string& prefix, std::shared_ptr<Store> base) {
  if (!base) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("make_prefix_store('", prefix, "'): the base store is null"));
  }
  return std::make_shared<PrefixStore>(prefix, std::move(base));
}

}  // namespace comms
