// An in-process Transport for the CPU algorithms' tests: one thread per
// rank, messages through queues. It checks that both ends of every message
// agree on where it lands (which Gloo relies on), and copies "directly"
// within the one address space where a test allows it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "transport.h"

namespace comms::cpu_algorithms::testing_support {

// Messages between every pair of ranks, per channel, in order.
class Network {
 public:
  explicit Network(int size) : size_(size) {}
  struct Message {
    std::vector<unsigned char> bytes;
    size_t dst_offset;
  };
  int size() const { return size_; }
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::tuple<int, int, Channel>, std::deque<Message>> queues;  // (from, to, channel)
  bool aborted = false;
  bool lengths_may_differ = false;  // a test of ranks passing different counts
  std::vector<bool> direct;         // per rank: copies_direct (one address space, so a memcpy)
  int direct_copies = 0;
  int messages = 0;

 private:
  int size_;
};

class FakeTransport final : public Transport {
 public:
  FakeTransport(Network& net, int rank, bool in_place = false) : net_(net), rank_(rank), in_place_(in_place) {}
  int rank() const override { return rank_; }
  // Copies at send either way; true takes the algorithms' in-place plans.
  bool sends_in_place() const override { return in_place_; }
  int size() const override { return net_.size(); }

  void send(int peer, Channel ch, Region src, size_t offset, size_t len, size_t dst_offset,
            Clock::time_point) override {
    EXPECT_NE(peer, rank_);
    EXPECT_LE(offset + len, src.bytes) << "send past its region";
    std::lock_guard<std::mutex> lock(net_.mu);
    if (net_.aborted) throw TransportError(TransportError::Kind::kAborted, peer, "aborted");
    const auto* p = static_cast<const unsigned char*>(src.base) + offset;
    net_.queues[{rank_, peer, ch}].push_back({{p, p + len}, dst_offset});
    ++net_.messages;
    net_.cv.notify_all();
  }

  void recv(int peer, Channel ch, Region dst, size_t dst_offset, size_t len, Clock::time_point deadline) override {
    std::unique_lock<std::mutex> lock(net_.mu);
    auto& q = net_.queues[{peer, rank_, ch}];
    if (!net_.cv.wait_until(lock, deadline, [&] { return net_.aborted || !q.empty(); })) {
      throw TransportError(TransportError::Kind::kTimeout, peer, "timed out");
    }
    if (net_.aborted) throw TransportError(TransportError::Kind::kAborted, peer, "aborted");
    Network::Message m = std::move(q.front());
    q.pop_front();
    if (!net_.lengths_may_differ) {
      EXPECT_EQ(m.bytes.size(), len) << "rank " << rank_ << " from " << peer;
    }
    EXPECT_EQ(m.dst_offset, dst_offset) << "the two ends disagree on where a message lands";
    EXPECT_LE(dst_offset + len, dst.bytes) << "receive past its region";
    std::memcpy(static_cast<unsigned char*>(dst.base) + dst_offset, m.bytes.data(), std::min(len, m.bytes.size()));
  }

  bool direct_possible(int) const override { return !net_.direct.empty(); }
  bool copies_direct(int) const override { return static_cast<size_t>(rank_) < net_.direct.size() && net_.direct[rank_]; }
  void write_direct(int peer, const void* local, uint64_t remote, size_t len, Clock::time_point) override {
    EXPECT_TRUE(copies_direct(peer) && net_.direct[static_cast<size_t>(peer)]) << "a direct copy nobody agreed to";
    std::memcpy(reinterpret_cast<void*>(static_cast<uintptr_t>(remote)), local, len);
    std::lock_guard<std::mutex> lock(net_.mu);
    ++net_.direct_copies;
  }
  void read_direct(int peer, void* local, uint64_t remote, size_t len, Clock::time_point) override {
    EXPECT_TRUE(copies_direct(peer) && net_.direct[static_cast<size_t>(peer)]) << "a direct copy nobody agreed to";
    std::memcpy(local, reinterpret_cast<const void*>(static_cast<uintptr_t>(remote)), len);
    std::lock_guard<std::mutex> lock(net_.mu);
    ++net_.direct_copies;
  }

  void abort() override {
    std::lock_guard<std::mutex> lock(net_.mu);
    net_.aborted = true;
    net_.cv.notify_all();
  }

 private:
  Network& net_;
  int rank_;
  bool in_place_;
};

}  // namespace comms::cpu_algorithms::testing_support
