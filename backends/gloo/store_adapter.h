// Gloo's rendezvous Store over a comms::Store, with every key prefixed so
// that several meshes can rendezvous through one store.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "comms/store.h"

namespace comms::gloo_backend {

class StoreAdapter : public ::gloo::rendezvous::Store {
 public:
  StoreAdapter(comms::Store& store, std::string prefix, std::chrono::milliseconds timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(prefix_ + key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    std::string v = store_.get(prefix_ + key, timeout_);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_.wait(prefixed(keys), timeout_); }
  // Gloo passes the context's timeout, which is the op timeout; rendezvous
  // keeps the timeout given here.
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override {
    store_.wait(prefixed(keys), timeout_);
  }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const auto& k : keys) out.push_back(prefix_ + k);
    return out;
  }
  comms::Store& store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

}  // namespace comms::gloo_backend
