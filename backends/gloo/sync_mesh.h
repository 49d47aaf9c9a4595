// The collectives of the sync mesh, whose Gloo pairs are in synchronous
// mode: the calling thread does every read, write and reduction, with no
// hand-off to Gloo's event-loop thread. algorithms.h says which op runs here.
//
//  - every collective whose data, summed over ranks, fits kExchangeMaxBytes
//    (all_reduce, reduce, all_gather, reduce_scatter, all_to_all, gather,
//    scatter): one direct exchange, each rank writing each peer its block and
//    reading each peer's, so one message latency; reductions run locally in
//    rank order, so every rank gets the same bits;
//  - larger all_reduce, reduce_scatter, all_gather and reduce: a pipelined
//    ring (reduce: a reduce-scatter, then each segment to the root). The
//    message is cut into `size` segments and each segment into kPieceBytes
//    pieces; a reduce-scatter and/or an all-gather move one piece per step,
//    so reducing a piece overlaps the neighbours' transfers. Every element is
//    reduced once, then gathered;
//  - broadcast up to kSyncPathMaxBytes: the root sends to every rank;
//  - barrier: a token from every rank to every other.
//
// Sync pairs write with blocking writes. A rank writes at most one message
// per peer (ring: one piece) before reading, so a link never needs more than
// two unread messages buffered; size_send_buffers makes the kernel hold more.
//
// Waiting: a read first spins on its socket (recv with MSG_PEEK) for up to
// `spin`, then blocks in Gloo's read, so a fast peer costs no wake-up and a
// slow one no core.
//
// Gloo's buffers name a slot, and destroying any buffer, a send buffer too,
// unregisters that slot on its pair. Slots here name the sender, so a rank's
// send buffers never share a slot with its receive buffers on one pair and
// the persistent receive buffers outlive per-op send buffers. Only the
// calling thread reads a sync pair, so a receive buffer registered at the
// start of an op is in place before any of its messages is read.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include <gloo/context.h>
#include <gloo/transport/buffer.h>

#include "reductions.h"

namespace comms::gloo_backend {

class SyncMesh {
 public:
  static constexpr size_t kPieceBytes = 128 * 1024;

  // Collective: every rank constructs it at the same point of the mesh's
  // life, since it reserves slots. Pairs must be in sync mode.
  SyncMesh(std::shared_ptr<::gloo::Context> mesh, std::chrono::microseconds spin);
  ~SyncMesh();
  SyncMesh(const SyncMesh&) = delete;
  SyncMesh& operator=(const SyncMesh&) = delete;

  // Counts and in-place conventions as in plugin::OpDesc; `count` is per
  // rank (all_to_all: per block), and count * element_size * size must fit
  // kExchangeMaxBytes for all_to_all, gather and scatter.
  // out = reduction over ranks of in (in may equal out).
  void all_reduce(const void* in, void* out, size_t count, size_t element_size, ReduceFn fn);
  // Only the root's out is written.
  void reduce(const void* in, void* out, size_t count, size_t element_size, ReduceFn fn, int root);
  void all_gather(const void* in, void* out, size_t bytes);
  void reduce_scatter(const void* in, void* out, size_t count, size_t element_size, ReduceFn fn);
  void all_to_all(const void* in, void* out, size_t block_bytes);
  void gather(const void* in, void* out, size_t bytes, int root);
  void scatter(const void* in, void* out, size_t bytes, int root);
  // bytes <= kSyncPathMaxBytes. The root sends `in`; every rank gets `out`.
  void broadcast(const void* in, void* out, size_t bytes, int root);
  void barrier();
  // May change while another thread runs an op.
  void set_spin(std::chrono::microseconds spin) { spin_us_ = spin.count(); }

 private:
  enum Kind { kExchange, kBroadcast, kBarrier, kRingStaging, kRingOutput, kKinds };
  int slot(Kind kind, int sender) const { return base_slot_ + kind * size_ + sender; }
  void await(int peer);  // spin until peer's next message is readable, or the spin budget ends
  // Writes outbox_[offset, offset + bytes) to peer's inbox at this rank's
  // slot (rank * bytes), and reads peer's next message into inbox_.
  void post(int peer, size_t offset, size_t bytes);
  void take(int peer);
  // Block r of the exchange: inbox_'s, or this rank's own copy in outbox_.
  const unsigned char* block(int r, size_t bytes, size_t own_offset) const;
  void reduce_blocks(void* out, size_t count, size_t es, ReduceFn fn, size_t own_offset) const;

  // The ring's cut of `count` elements into segments and pieces.
  struct Layout {
    Layout(size_t count, size_t es, int n);
    std::pair<size_t, size_t> span(int segment, size_t j) const;  // bytes: offset, length
    std::pair<size_t, size_t> segment(int k) const;               // the same, whole segment
    size_t count, es, seg, piece, pieces;
  };
  // All-gather around the ring into out, starting from segment `held`.
  void pass_around(void* out, const Layout& layout, int held);
  void ring_all_gather(const void* in, void* out, size_t bytes);
  // Leaves this rank's reduced segment of `layout` in `mine` (segment-sized).
  void ring_reduce_scatter(const void* in, void* mine, const Layout& layout, ReduceFn fn);
  void ring_reduce(const void* in, void* out, size_t count, size_t es, ReduceFn fn, int root);
  void ring(const void* in, void* out, size_t count, size_t es, ReduceFn fn);

  using BufferPtr = std::unique_ptr<::gloo::transport::Buffer>;
  std::shared_ptr<::gloo::Context> mesh_;
  std::atomic<int64_t> spin_us_;
  int rank_, size_, left_, right_, base_slot_;
  std::vector<int> fds_;  // per rank; -1: not found, so no spinning on it
  std::vector<unsigned char> inbox_, outbox_, broadcast_, tokens_, staging_;
  std::vector<unsigned char> partials_;  // ring reduce-scatter's partial sums, grown on demand
  std::vector<unsigned char> segment_;   // a non-root's reduced segment in a ring reduce
  std::vector<BufferPtr> outbox_send_, inbox_recv_, broadcast_send_, broadcast_recv_, token_send_, token_recv_;
  BufferPtr staging_recv_;  // ring pieces to reduce, from left
};

}  // namespace comms::gloo_backend
