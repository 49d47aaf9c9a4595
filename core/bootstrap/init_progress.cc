#include "bootstrap/init_progress.h"

#include <algorithm>
#include <vector>

#include "comms/error.h"
#include "util/strutil.h"

namespace comms::internal {
namespace {

// Forwards to the backend's store and counts each write under `counter`.
class CountingStore final : public Store {
 public:
  using Store::get;
  using Store::wait;

  CountingStore(std::shared_ptr<Store> inner, std::shared_ptr<Store> base, std::string counter)
      : inner_(std::move(inner)), base_(std::move(base)), counter_(std::move(counter)) {
    default_timeout_ = inner_->default_timeout();
  }

  void set(const std::string& key, const std::string& value) override {
    inner_->set(key, value);
    count();
  }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    return inner_->get(key, timeout);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    inner_->wait(keys, timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    int64_t out = inner_->add(key, delta);
    count();
    return out;
  }
  bool check(const std::vector<std::string>& keys) override { return inner_->check(keys); }
  bool delete_key(const std::string& key) override { return inner_->delete_key(key); }
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override {
    std::string out = inner_->compare_set(key, expected, desired);
    count();
    return out;
  }

 private:
  void count() {
    try {
      base_->add(counter_, 1);
    } catch (const Error&) {
      // Only diagnosis is lost; the backend's own calls report a broken store.
    }
  }

  std::shared_ptr<Store> inner_;
  std::shared_ptr<Store> base_;
  std::string counter_;
};

std::string ranks_text(const std::vector<int>& ranks) {
  constexpr size_t kShown = 16;
  std::vector<int> shown(ranks.begin(), ranks.begin() + static_cast<std::ptrdiff_t>(std::min(ranks.size(), kShown)));
  std::string out = str::cat(ranks.size() == 1 ? "rank " : "ranks ", str::join(shown, ", "));
  if (ranks.size() > kShown) str::append(out, ", ... (", ranks.size(), " ranks)");
  return out;
}

}  // namespace

std::string InitProgress::key(const char* what, int rank) const { return str::cat(prefix_, "#", what, "/", rank); }

std::shared_ptr<Store> InitProgress::counting(std::shared_ptr<Store> backend_store) const {
  if (size_ == 1) return backend_store;
  return std::make_shared<CountingStore>(std::move(backend_store), store_, key("progress", rank_));
}

void InitProgress::mark(const char* what) const {
  if (size_ == 1) return;
  try {
    store_->set(key(what, rank_), "1");
  } catch (const Error&) {
    // The backend's rendezvous through this store reports the failure.
  }
}

std::string InitProgress::laggards() const {
  if (size_ == 1) return "";
  std::vector<int> absent, unfinished;
  std::vector<int64_t> progress(static_cast<size_t>(size_), 0);
  try {
    for (int r = 0; r < size_; ++r) {
      if (!store_->check({key("arrived", r)})) {
        absent.push_back(r);
      } else if (r != rank_ && !store_->check({key("ready", r)})) {
        unfinished.push_back(r);
        progress[static_cast<size_t>(r)] = store_->add(key("progress", r), 0);
      }
    }
  } catch (const Error&) {
    return "";
  }
  if (!absent.empty()) return str::cat(ranks_text(absent), " of ", size_, " never arrived at this init");
  if (unfinished.empty()) return "";
  // Every rank came; the one stuck (stopped, hung) has written the fewest
  // keys, the others having gone on until they waited for it.
  int64_t least = INT64_MAX, most = 0;
  for (int r : unfinished) {
    least = std::min(least, progress[static_cast<size_t>(r)]);
    most = std::max(most, progress[static_cast<size_t>(r)]);
  }
  std::vector<int> behind;
  for (int r : unfinished) {
    if (progress[static_cast<size_t>(r)] == least) behind.push_back(r);
  }
  return str::cat("every rank arrived at this init; ", ranks_text(behind), " got least far, ", least,
                  " rendezvous keys written", most > least ? str::cat(" against up to ", most, " by the others") : "",
                  ": stopped, stuck, or waiting for such a rank");
}

}  // namespace comms::internal
