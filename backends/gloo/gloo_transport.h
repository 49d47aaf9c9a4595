// The CPU algorithms' transport (backends/cpu_algorithms/transport.h) on a
// Gloo mesh whose pairs are in synchronous mode: the calling thread does
// every read and write, with no hand-off to Gloo's event-loop thread.
//
// Gloo's buffers name a slot, and destroying any buffer, a send buffer too,
// unregisters that slot on its pair. Slots here are (channel, sender), so a
// rank's send buffers never share a slot with its receive buffers on one
// pair. A region is registered once and kept while the algorithms keep
// using it (persistent regions for the transport's life, the caller's
// buffers until op_done). Only the calling thread reads a sync pair, so a
// receive buffer registered before a wait is in place before any message
// for it is read.
//
// Waiting: a read first spins on its socket (recv with MSG_PEEK) for up to
// `spin`, then blocks in Gloo's read, so a fast peer costs no wake-up and a
// slow one no core. Gloo's pairs time out every read and write at the
// timeout the mesh had when it connected, so the deadline is theirs: a Gloo
// I/O error at or past the deadline is a timeout, before it the peer's
// failure.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <set>
#include <vector>

#include <gloo/context.h>
#include <gloo/transport/buffer.h>

#include "transport.h"

namespace comms::gloo_backend {

class GlooTransport final : public cpu_algorithms::Transport {
 public:
  // Collective: every rank constructs it at the same point of the mesh's
  // life, since it reserves slots. Pairs must be in sync mode.
  // opened: the sockets this process opened while the mesh connected
  // (sockets.h), among which the transport finds its pairs' descriptors.
  GlooTransport(std::shared_ptr<::gloo::Context> mesh, std::chrono::microseconds spin, const std::set<int>& opened);
  ~GlooTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void send(int peer, cpu_algorithms::Channel ch, cpu_algorithms::Region src, size_t offset, size_t len,
            size_t dst_offset, cpu_algorithms::Clock::time_point deadline) override;
  void recv(int peer, cpu_algorithms::Channel ch, cpu_algorithms::Region dst, size_t dst_offset, size_t len,
            cpu_algorithms::Clock::time_point deadline) override;
  void op_done() override;
  // Shuts down this mesh's sockets: blocked reads fail now.
  void abort() override;
  // May change while another thread runs an op.
  void set_spin(std::chrono::microseconds spin) { spin_us_ = spin.count(); }

 private:
  using BufferPtr = std::unique_ptr<::gloo::transport::Buffer>;
  struct Registered {
    void* base = nullptr;
    size_t bytes = 0;
    bool persistent = false;
    BufferPtr buffer;
  };
  // Per peer and channel: two send regions (the ring alternates its input
  // and its partial results) and one receive region.
  struct Link {
    std::array<std::array<Registered, 2>, cpu_algorithms::kNumChannels> send;
    std::array<Registered, cpu_algorithms::kNumChannels> recv;
  };
  int slot(cpu_algorithms::Channel ch, int sender) const { return base_slot_ + int(ch) * size_ + sender; }
  ::gloo::transport::Buffer& send_buffer(int peer, cpu_algorithms::Channel ch, const cpu_algorithms::Region& r);
  ::gloo::transport::Buffer& recv_buffer(int peer, cpu_algorithms::Channel ch, const cpu_algorithms::Region& r);
  void await(int peer);  // spin until peer's next message is readable, or the spin budget ends
  [[noreturn]] void fail(const std::exception& e, int peer, cpu_algorithms::Clock::time_point deadline) const;

  std::shared_ptr<::gloo::Context> mesh_;
  std::atomic<int64_t> spin_us_;
  std::atomic<bool> aborted_{false};
  int rank_, size_, base_slot_;
  bool dirty_ = false;          // a caller's region is registered
  std::vector<int> fds_;        // per rank; -1: not found, so no spinning on it
  std::vector<Link> links_;     // per rank
};

}  // namespace comms::gloo_backend
