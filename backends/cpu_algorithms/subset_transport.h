// A Transport over some ranks of another: rank i here is members[i] there.
// The hierarchical collectives (hierarchical.h) run Collectives on two of
// them, the ranks of one host and the hosts' leaders, beside the comm's
// own Collectives on the whole transport. Messages keep their channel, so
// on each (peer, channel) they stay in the order the ranks' ops issue them;
// every rank runs the same sequence of ops and phases, so both ends agree.
// Errors name the base transport's ranks (its TransportError passes through).
#pragma once

#include <algorithm>
#include <stdexcept>
#include <utility>
#include <vector>

#include "transport.h"

namespace comms::cpu_algorithms {

class SubsetTransport final : public Transport {
 public:
  // `members`: base ranks in this transport's rank order, `base.rank()` among them.
  SubsetTransport(Transport& base, std::vector<int> members) : base_(base), members_(std::move(members)) {
    const auto it = std::find(members_.begin(), members_.end(), base.rank());
    if (it == members_.end()) throw std::logic_error("a subset transport must hold its own rank");
    rank_ = static_cast<int>(it - members_.begin());
  }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  int base_rank(int rank) const { return members_[static_cast<size_t>(rank)]; }

  void send(int peer, Channel ch, Region src, size_t offset, size_t len, size_t dst_offset,
            Clock::time_point deadline) override {
    base_.send(base_rank(peer), ch, src, offset, len, dst_offset, deadline);
  }
  void recv(int peer, Channel ch, Region dst, size_t dst_offset, size_t len, Clock::time_point deadline) override {
    base_.recv(base_rank(peer), ch, dst, dst_offset, len, deadline);
  }
  void send_stable(int peer, Channel ch, Region src, size_t offset, size_t len, size_t dst_offset,
                   Clock::time_point deadline) override {
    base_.send_stable(base_rank(peer), ch, src, offset, len, dst_offset, deadline);
  }
  void wait_sends(Clock::time_point deadline) override { base_.wait_sends(deadline); }
  bool sends_in_place() const override { return base_.sends_in_place(); }
  bool direct_possible(int peer) const override { return base_.direct_possible(base_rank(peer)); }
  bool copies_direct(int peer) const override { return base_.copies_direct(base_rank(peer)); }
  void write_direct(int peer, const void* local, uint64_t remote, size_t len, Clock::time_point deadline) override {
    base_.write_direct(base_rank(peer), local, remote, len, deadline);
  }
  void read_direct(int peer, void* local, uint64_t remote, size_t len, Clock::time_point deadline) override {
    base_.read_direct(base_rank(peer), local, remote, len, deadline);
  }
  void op_done() override { base_.op_done(); }
  void abort() override { base_.abort(); }

 private:
  Transport& base_;
  std::vector<int> members_;
  int rank_ = -1;
};

}  // namespace comms::cpu_algorithms
