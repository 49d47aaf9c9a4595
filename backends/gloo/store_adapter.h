// Gloo's rendezvous Store over a comms::Store, with every key prefixed so
// that several meshes can rendezvous through one store. It keeps what Gloo
// read, so that the peers' listen addresses cost no second read.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/address.h>

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
    return read_[key] = std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_.wait(prefixed(keys), timeout_); }
  // Gloo passes the context's timeout, which is the op timeout; rendezvous
  // keeps the timeout given here.
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override {
    store_.wait(prefixed(keys), timeout_);
  }

  // The address rank `peer`'s pair for `rank` listened on, in a `size`-rank
  // mesh connected through this store, in Gloo's own format
  // (rendezvous::Context::connectFullMesh and extractAddress): key "<peer>"
  // holds the addresses of the peer's pairs, one per other rank in rank
  // order, all of one size. A connecting pair's remote end; the side that
  // accepted may name its peer by it (Gloo's connect() sets it, maybe after
  // the accept set the connection's remote end).
  sockaddr_storage pair_listen_address(int peer, int rank, int size) {
    const std::string key = std::to_string(peer);
    const auto it = read_.find(key);
    const std::vector<char> all = it != read_.end() ? it->second : get(key);
    const size_t others = static_cast<size_t>(size - 1);
    if (others == 0 || all.empty() || all.size() % others != 0) {
      throw std::runtime_error("rank " + key + " published " + std::to_string(all.size()) +
                               " bytes of pair addresses under '" + prefix_ + key + "', not " +
                               std::to_string(others) + " of one size");
    }
    const size_t each = all.size() / others;
    const size_t i = static_cast<size_t>(rank > peer ? rank - 1 : rank);
    const std::vector<char> mine(all.begin() + static_cast<std::ptrdiff_t>(i * each),
                                 all.begin() + static_cast<std::ptrdiff_t>((i + 1) * each));
    return ::gloo::transport::tcp::Address(mine).getSockaddr();
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
  std::map<std::string, std::vector<char>> read_;  // by key without the prefix
};

}  // namespace comms::gloo_backend
