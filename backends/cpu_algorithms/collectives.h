// The CPU collectives, on any Transport (transport.h): the calling thread
// does every send, receive and reduction. The caller passes the algorithm
// that its backend's plan chose (algorithms.h, algorithm_for); this class
// decides nothing by size.
//
//  - kExchange (the data, summed over ranks, fits kExchangeMaxBytes;
//    all_reduce, reduce, all_gather, reduce_scatter, all_to_all, gather,
//    scatter): one direct exchange, each rank writing each peer its block and
//    reading each peer's, so one message latency; reductions run locally in
//    rank order, so every rank gets the same bits;
//  - kPipelinedRing (larger all_reduce, reduce_scatter, all_gather and
//    reduce; reduce: a reduce-scatter, then each segment to the root). The
//    message is cut into `size` segments and each segment into pieces
//    (ring_piece_bytes in algorithms.h: 128 KiB, on UCX 32-64 KiB by size;
//    pieces are sent in place there); a reduce-scatter and/or an all-gather
//    move one piece per step, so reducing a piece overlaps the neighbours'
//    transfers. Every element is reduced once, then gathered;
//  - kDirectCopies (all_reduce, all_gather, reduce_scatter and broadcast on a transport
//    that sends in place, by size): ranks trade headers and copy straight
//    between their buffers where both ends copy directly; else the ring
//    (all_reduce, all_gather, reduce_scatter) or pieces (broadcast);
//  - kBroadcast: the root sends to every rank;
//  - kBarrier: a token from every rank to every other.
//
// A rank sends at most one message per peer (ring: one piece) before
// reading, so a link never needs more than two unread messages buffered.
// Every wait of an op ends at now + timeout (set_timeout). A comm of one
// rank never gets here: its backend's plan copies (plan.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "algorithms.h"
#include "reductions.h"
#include "transport.h"

namespace comms::cpu_algorithms {

// A peer's exchange message had another length than this rank's count
// gives: the ranks passed different counts (an invalid argument).
class CountMismatch : public std::runtime_error {
 public:
  CountMismatch(int peer, const std::string& what) : std::runtime_error(what), peer_(peer) {}
  int peer() const { return peer_; }  // the first differing peer

 private:
  int peer_;
};

class Collectives {
 public:
  // Each exchange message starts with its length and op number (16 bytes),
  // so a receiver detects a peer that passed another count (CountMismatch).
  // The ring, broadcast and barrier paths have no such check.
  static constexpr size_t kHeaderBytes = 16;

  // The transport must outlive this object.
  Collectives(Transport& transport, std::chrono::milliseconds timeout);
  Collectives(const Collectives&) = delete;
  Collectives& operator=(const Collectives&) = delete;

  // Counts and in-place conventions as in plugin::OpDesc; `count` is per
  // rank (all_to_all: per block). `a` is algorithm_for's answer for the op
  // on this transport (every rank passes the same); all_to_all, gather and
  // scatter are only ever an exchange (count * element_size * size fits
  // kExchangeMaxBytes).
  // out = reduction over ranks of in (in may equal out).
  void all_reduce(Algorithm a, const void* in, void* out, size_t count, size_t element_size, ReduceFn fn);
  // Only the root's out is written.
  void reduce(Algorithm a, const void* in, void* out, size_t count, size_t element_size, ReduceFn fn, int root);
  void all_gather(Algorithm a, const void* in, void* out, size_t bytes);
  void reduce_scatter(Algorithm a, const void* in, void* out, size_t count, size_t element_size, ReduceFn fn);
  void all_to_all(const void* in, void* out, size_t block_bytes);
  void gather(const void* in, void* out, size_t bytes, int root);
  void scatter(const void* in, void* out, size_t bytes, int root);
  // bytes <= kSyncPathMaxBytes unless the transport sends in place. The
  // root sends `in`; every rank gets `out`.
  void broadcast(Algorithm a, const void* in, void* out, size_t bytes, int root);
  void barrier();
  // May change while another thread runs an op.
  void set_timeout(std::chrono::milliseconds t) { timeout_ms_ = t.count(); }
  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  class Op;  // the deadline of one op; tells the transport when it is done
  Region own(std::vector<unsigned char>& v) { return {v.data(), v.size(), true}; }
  // Copies `blocks` blocks of `in` into outbox_, each after its header;
  // block b starts at b * slot_ (the largest block and a header, whatever
  // this op's count).
  void fill(const Op& op, const void* in, size_t bytes, int blocks);
  // Sends outbox_'s block `block` to peer's inbox at this rank's block, and
  // receives peer's block into inbox_.
  void post(const Op& op, int peer, int block, size_t bytes);
  void take(const Op& op, int peer, size_t bytes);
  // Throws CountMismatch naming every peer (or only_peer) whose block in
  // inbox_ does not start with this op's header for `bytes`.
  void check_lengths(const Op& op, size_t bytes, int only_peer = -1) const;
  // Block r of the exchange: inbox_'s, or this rank's own block in outbox_.
  const unsigned char* block(int r, size_t bytes, int own_block) const;
  void reduce_blocks(void* out, size_t count, size_t es, ReduceFn fn, int own_block) const;
  void exchange_all(const Op& op, size_t bytes, bool blocks_per_peer);
  // What ranks trade before copying directly (Transport::copies_direct):
  // where their buffers lie, the op's bytes, and whether they copy directly.
  struct DirectHeader {
    uint64_t in = 0, out = 0, bytes = 0, direct = 0;
  };
  // An all_reduce of kAllReduceDirectMinSegmentBytes per segment on an in-place transport;
  // false (nothing done but the headers) where not every rank copies directly.
  bool all_reduce_direct(const Op& op, const void* in, void* out, size_t count, size_t es, ReduceFn fn);
  // An all_gather of kAllGatherDirectMinBytes per rank on an in-place
  // transport; false as all_reduce_direct's.
  bool all_gather_direct(const Op& op, const void* in, void* out, size_t bytes);
  // A reduce_scatter of kAllReduceDirectMinSegmentBytes per block beyond
  // the exchange, on an in-place transport; false as all_reduce_direct's.
  bool reduce_scatter_direct(const Op& op, const void* in, void* out, size_t count, size_t es, ReduceFn fn);
  // Sends every peer this rank's header and reads theirs into
  // peer_headers_: true when every rank copies directly with every peer
  // and all passed `bytes`. A direct op ends with end_direct(): a token to
  // every peer, then one from each (this rank no longer reads the peers'
  // inputs nor writes their outputs, and they no longer touch its buffers).
  bool trade_direct_headers(const Op& op, const void* in, void* out, size_t bytes);
  void end_direct(const Op& op);
  // A broadcast on an in-place transport; try_direct: kDirectCopies.
  void broadcast_in_place(const Op& op, const void* in, void* out, size_t bytes, int root, bool try_direct);

  // The ring's cut of `count` elements into segments and pieces.
  struct Layout {
    Layout(size_t count, size_t es, int n, size_t piece_bytes);
    std::pair<size_t, size_t> span(int segment, size_t j) const;  // bytes: offset, length
    std::pair<size_t, size_t> segment(int k) const;               // the same, whole segment
    size_t count, es, seg, piece, pieces;
  };
  // Sends to the right neighbour: in place on a transport that can (ring()).
  void ring_send(const Op& op, Channel ch, Region src, size_t off, size_t len, size_t dst_offset);
  // All-gather around the ring into out, starting from segment `held`.
  void pass_around(const Op& op, void* out, const Layout& layout, int held);
  void ring_all_gather(const Op& op, const void* in, void* out, size_t bytes);
  // Leaves this rank's reduced segment of `layout` in `mine` (segment-sized).
  void ring_reduce_scatter(const Op& op, const void* in, void* mine, const Layout& layout, ReduceFn fn);
  void ring_reduce(const Op& op, const void* in, void* out, size_t count, size_t es, ReduceFn fn, int root);
  void ring(const Op& op, const void* in, void* out, size_t count, size_t es, ReduceFn fn);

  Transport& t_;
  std::atomic<int64_t> timeout_ms_;
  uint64_t ops_ = 0;  // numbers this rank's ops (Op::number)
  int rank_, size_, left_, right_;
  bool in_place_;  // the transport sends in place (Transport::sends_in_place)
  size_t slot_;
  std::vector<unsigned char> inbox_, outbox_, broadcast_, tokens_, staging_;
  std::vector<unsigned char> partials_;  // ring reduce-scatter's partial sums, grown on demand
  std::vector<unsigned char> segment_;   // a non-root's reduced segment in a ring reduce
  std::vector<DirectHeader> peer_headers_;  // one per rank, rewritten by each direct op
};

}  // namespace comms::cpu_algorithms
