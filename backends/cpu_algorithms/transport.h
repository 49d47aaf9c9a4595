// The transport the CPU algorithms run on: per-peer, in-order messages of
// byte ranges on a few channels, with a deadline on every wait and an abort
// that wakes them all. Gloo's synchronous pairs are the first implementation
// (backends/gloo/gloo_transport.h); tests/backends/cpu_algorithms/cpu_algorithms_test.cc has an
// in-process one. Shaped after gloo/transport/pair.h, so UCX's tag
// send/recv (tag = channel and sender) can implement it too.
//
// Both ends of a message name where it lands: the sender as an offset into
// the receiver's region (Gloo writes there directly, like an RDMA put), the
// receiver as its region plus the same offset (a tag receive posts that
// address and ignores the sender's offset). The algorithms always compute
// the same layout on both ends, so the two agree; the fake transport checks
// that they do.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace comms::cpu_algorithms {

using Clock = std::chrono::steady_clock;

// Message streams the algorithms keep apart. On one (peer, channel) messages
// arrive in the order they were sent; across channels nothing is promised.
enum class Channel : uint8_t { kExchange, kBroadcast, kBarrier, kRingStaging, kRingOutput };
inline constexpr int kNumChannels = 5;

// Memory an op sends from or receives into. A transport that registers
// memory (Gloo's pairs) may keep a persistent region registered across ops;
// other regions are forgotten at op_done(), since the caller's buffers may
// be freed after the op.
struct Region {
  void* base = nullptr;
  size_t bytes = 0;
  bool persistent = false;  // owned by the algorithms, alive as long as the transport
};

// What a transport throws when a send or receive cannot complete.
class TransportError : public std::runtime_error {
 public:
  enum class Kind { kTimeout, kPeerFailure, kAborted };
  TransportError(Kind kind, int peer, const std::string& what) : std::runtime_error(what), kind_(kind), peer_(peer) {}
  Kind kind() const { return kind_; }
  int peer() const { return peer_; }  // the peer the wait was on; -1 if none

 private:
  Kind kind_;
  int peer_;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Sends src[offset, offset + len) to `peer` on `ch`, to land at
  // dst_offset of the region the peer receives it into. Returns when src
  // may be reused. A rank sends at most a piece per peer before it reads,
  // so a transport must buffer two unread messages per link without
  // blocking the sender.
  virtual void send(int peer, Channel ch, Region src, size_t offset, size_t len, size_t dst_offset,
                    Clock::time_point deadline) = 0;

  // Waits for the next message from `peer` on `ch`, which is `len` bytes
  // landing at dst[dst_offset, dst_offset + len).
  virtual void recv(int peer, Channel ch, Region dst, size_t dst_offset, size_t len, Clock::time_point deadline) = 0;

  // Like send(), but the caller leaves src[offset, offset + len) untouched
  // until wait_sends() returns, so a transport may send it in place and
  // finish later instead of copying it or blocking. Never blocks on the
  // receiver where send() might.
  virtual void send_stable(int peer, Channel ch, Region src, size_t offset, size_t len, size_t dst_offset,
                           Clock::time_point deadline) {
    send(peer, ch, src, offset, len, dst_offset, deadline);
  }
  // Waits for every send_stable() of this op to finish.
  virtual void wait_sends(Clock::time_point /*deadline*/) {}
  // True when send_stable() reads the caller's memory in place and recv()
  // writes straight into it at no cost per region (UCX: rendezvous, one
  // copy by the receiver). The large-op plans in algorithms.h then skip
  // their staging copies. False (Gloo): regions cost a registration each.
  virtual bool sends_in_place() const { return false; }

  // One-sided copies by address between this process's memory and a
  // peer's (UCX on one host: Linux cross-memory attach, the single copy
  // Open MPI's shared-memory transport makes). direct_possible(peer): the
  // pair may copy directly, the same answer on both ends (UCX: the peer is
  // on this host); only then do the algorithms trade headers saying whether
  // each end copies_direct(peer), and they copy only if both do. The
  // copies never wait for the peer; a failed one (the peer exited, the
  // address is not mapped there) throws kPeerFailure naming the peer.
  virtual bool direct_possible(int /*peer*/) const { return false; }
  virtual bool copies_direct(int /*peer*/) const { return false; }
  virtual void write_direct(int peer, const void* /*local*/, uint64_t /*remote*/, size_t /*len*/,
                            Clock::time_point /*deadline*/) {
    throw TransportError(TransportError::Kind::kPeerFailure, peer, "this transport has no direct copies");
  }
  virtual void read_direct(int peer, void* /*local*/, uint64_t /*remote*/, size_t /*len*/,
                           Clock::time_point /*deadline*/) {
    throw TransportError(TransportError::Kind::kPeerFailure, peer, "this transport has no direct copies");
  }

  // The op that used the non-persistent regions returned (or threw).
  virtual void op_done() {}

  // From any thread: every wait, now and later, throws kAborted.
  virtual void abort() = 0;
};

}  // namespace comms::cpu_algorithms
