#include "collectives.h"

#include <algorithm>
#include <cstring>

namespace comms::cpu_algorithms {

class Collectives::Op {
 public:
  explicit Op(Collectives& c)
      : deadline(Clock::now() + std::chrono::milliseconds(c.timeout_ms_.load(std::memory_order_relaxed))),
        number(++c.ops_),
        t_(c.t_) {}
  ~Op() { t_.op_done(); }
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;
  const Clock::time_point deadline;
  const uint64_t number;  // the same on every rank: they run the same ops

 private:
  Transport& t_;
};

namespace {
Region user(const void* p, size_t bytes) { return {const_cast<void*>(p), bytes, false}; }

// Starts every exchange message: a receiver that finds another length knows
// the sender passed a different count (the transport itself does not say
// how long a message was). The op number tells a header left by an earlier
// op from this one's.
struct Header {
  uint64_t bytes;
  uint64_t op;
};
static_assert(sizeof(Header) == Collectives::kHeaderBytes);

// Every block starts at a multiple of the largest one, whatever the count:
// so a receiver finds the header of a peer that passed another count.
size_t slot_bytes(int size) {
  const size_t raw = kExchangeMaxBytes / static_cast<size_t>(size) + Collectives::kHeaderBytes;
  return (raw + 63) / 64 * 64;
}
}  // namespace

Collectives::Collectives(Transport& transport, std::chrono::milliseconds timeout)
    : t_(transport),
      timeout_ms_(timeout.count()),
      rank_(transport.rank()),
      size_(transport.size()),
      left_((rank_ + size_ - 1) % size_),
      right_((rank_ + 1) % size_),
      in_place_(transport.sends_in_place()),
      slot_(slot_bytes(size_)),
      inbox_(slot_ * static_cast<size_t>(size_)),
      outbox_(slot_ * static_cast<size_t>(size_)),
      broadcast_(kSyncPathMaxBytes),
      tokens_(static_cast<size_t>(size_) + 1),
      staging_(kRingPieceBytes),  // ring_piece_bytes never exceeds it
      peer_headers_(static_cast<size_t>(size_)) {}

void Collectives::fill(const Op& op, const void* in, size_t bytes, int blocks) {
  const Header header{bytes, op.number};
  for (int b = 0; b < blocks; ++b) {
    unsigned char* dst = outbox_.data() + static_cast<size_t>(b) * slot_;
    std::memcpy(dst, &header, sizeof header);
    std::memcpy(dst + kHeaderBytes, static_cast<const unsigned char*>(in) + static_cast<size_t>(b) * bytes, bytes);
  }
}

void Collectives::post(const Op& op, int peer, int block, size_t bytes) {
  t_.send(peer, Channel::kExchange, own(outbox_), static_cast<size_t>(block) * slot_, kHeaderBytes + bytes,
          static_cast<size_t>(rank_) * slot_, op.deadline);
}

void Collectives::take(const Op& op, int peer, size_t bytes) {
  t_.recv(peer, Channel::kExchange, own(inbox_), static_cast<size_t>(peer) * slot_, kHeaderBytes + bytes,
          op.deadline);
}

void Collectives::check_lengths(const Op& op, size_t bytes, int only_peer) const {
  std::string differing;
  int first = -1;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || (only_peer >= 0 && p != only_peer)) continue;
    Header t;
    std::memcpy(&t, inbox_.data() + static_cast<size_t>(p) * slot_, sizeof t);
    if (t.bytes == bytes && t.op == op.number) continue;
    if (first < 0) first = p;
    differing += (differing.empty() ? "rank " : ", rank ") + std::to_string(p) +
                 (t.op == op.number ? " sent " + std::to_string(t.bytes) : " sent a message of another op");
  }
  if (first < 0) return;
  throw CountMismatch(first, "ranks passed different counts: rank " + std::to_string(rank_) + " expects " +
                                 std::to_string(bytes) + " bytes from each peer, " + differing +
                                 " (every rank must pass the same count and dtype)");
}

const unsigned char* Collectives::block(int r, size_t bytes, int own_block) const {
  (void)bytes;
  return (r == rank_ ? outbox_.data() + static_cast<size_t>(own_block) * slot_
                     : inbox_.data() + static_cast<size_t>(r) * slot_) +
         kHeaderBytes;
}

void Collectives::reduce_blocks(void* out, size_t count, size_t es, ReduceFn fn, int own_block) const {
  // Rank order, whatever this rank's own: the same bits everywhere.
  const size_t bytes = count * es;
  fn(out, block(0, bytes, own_block), block(1, bytes, own_block), count);
  for (int r = 2; r < size_; ++r) fn(out, out, block(r, bytes, own_block), count);
}

// Every exchange writes to all peers first, then reads: the writes, at most
// kExchangeMaxBytes per peer, fit the transport's buffering, so none blocks
// on a peer that is itself writing. Peers are visited starting with the
// right neighbour so that not every rank writes to rank 0 first. Lengths are
// checked once every message is read, so a mismatch leaves no message unread.
// blocks_per_peer: outbox_ holds one block per rank (peer p gets block p).
void Collectives::exchange_all(const Op& op, size_t bytes, bool blocks_per_peer) {
  for (int k = 1; k < size_; ++k) {
    const int p = (rank_ + k) % size_;
    post(op, p, blocks_per_peer ? p : 0, bytes);
  }
  for (int k = 1; k < size_; ++k) take(op, (rank_ - k + size_) % size_, bytes);
  check_lengths(op, bytes);
}

void Collectives::all_reduce(Algorithm a, const void* in, void* out, size_t count, size_t es, ReduceFn fn) {
  const Op op(*this);
  const size_t bytes = count * es;
  if (a == Algorithm::kDirectCopies && all_reduce_direct(op, in, out, count, es, fn)) return;
  if (a != Algorithm::kExchange) return ring(op, in, out, count, es, fn);
  fill(op, in, bytes, 1);
  exchange_all(op, bytes, false);
  reduce_blocks(out, count, es, fn, 0);
}

// Every rank reduces its segment (as the ring's) in kAllReduceDirectChunkBytes
// chunks: it reads each peer's input chunk straight out of the peer's memory,
// reduces it into its output, and writes the reduced chunk into every
// peer's output, each byte copied once and every core busy. Each rank sends
// every other one its header first (where every peer may copy directly at
// all); only when every rank copies directly with every peer and all passed
// the same count (each rank sees every header, so all decide alike) does it
// run, else the ring does. A token to
// every peer ends it: this rank no longer reads the peer's input nor writes
// its output. In place is safe: only rank r reads segment r of a peer's
// input, and writes the peer's output there only after reading it.
bool Collectives::all_reduce_direct(const Op& op, const void* in, void* out, size_t count, size_t es, ReduceFn fn) {
  const size_t bytes = count * es;
  if (!trade_direct_headers(op, in, out, bytes)) return false;
  std::vector<DirectHeader>& peers = peer_headers_;
  if (staging_.size() < kAllReduceDirectChunkBytes) staging_.resize(kAllReduceDirectChunkBytes);
  auto* in_bytes = static_cast<const unsigned char*>(in);
  auto* out_bytes = static_cast<unsigned char*>(out);
  const Layout layout(count, es, size_, kAllReduceDirectChunkBytes);
  for (size_t j = 0; j < layout.pieces; ++j) {
    const auto [off, len] = layout.span(rank_, j);
    if (!len) continue;
    for (int k = 1; k < size_; ++k) {
      const int q = (rank_ + k) % size_;
      t_.read_direct(q, staging_.data(), peers[static_cast<size_t>(q)].in + off, len, op.deadline);
      fn(out_bytes + off, k == 1 ? in_bytes + off : out_bytes + off, staging_.data(), len / es);
    }
    for (int k = 1; k < size_; ++k) {
      const int q = (rank_ + k) % size_;
      t_.write_direct(q, out_bytes + off, peers[static_cast<size_t>(q)].out + off, len, op.deadline);
    }
  }
  end_direct(op);
  return true;
}

// Each rank reads every peer's block straight out of the peer's input into
// its own output: each byte copied once, by the rank that needs it, so every
// core copies (n - 1) blocks. In place is safe: a peer's input is its own
// block of its output, which no rank writes (this rank's own block is not
// even rewritten in place: peers are reading it).
bool Collectives::all_gather_direct(const Op& op, const void* in, void* out, size_t bytes) {
  if (!trade_direct_headers(op, in, out, bytes)) return false;
  unsigned char* own = static_cast<unsigned char*>(out) + static_cast<size_t>(rank_) * bytes;
  if (own != in) std::memmove(own, in, bytes);
  auto* o = static_cast<unsigned char*>(out);
  for (int k = 1; k < size_; ++k) {
    const int q = (rank_ + k) % size_;
    t_.read_direct(q, o + static_cast<size_t>(q) * bytes, peer_headers_[static_cast<size_t>(q)].in, bytes,
                   op.deadline);
  }
  end_direct(op);
  return true;
}

// Each rank reduces its own block out of the peers' inputs, read in
// kAllReduceDirectChunkBytes chunks straight out of their memory, as
// all_reduce_direct does its segment, and writes nothing into peers. In
// place is safe: a peer's output is its own block, which no rank reads.
bool Collectives::reduce_scatter_direct(const Op& op, const void* in, void* out, size_t count, size_t es,
                                        ReduceFn fn) {
  const size_t bytes = count * es;
  if (!trade_direct_headers(op, in, out, bytes)) return false;
  if (staging_.size() < kAllReduceDirectChunkBytes) staging_.resize(kAllReduceDirectChunkBytes);
  const size_t mine = static_cast<size_t>(rank_) * bytes;
  auto* in_bytes = static_cast<const unsigned char*>(in) + mine;
  auto* out_bytes = static_cast<unsigned char*>(out);
  const size_t chunk = kAllReduceDirectChunkBytes / es * es;
  for (size_t off = 0; off < bytes; off += chunk) {
    const size_t len = std::min(chunk, bytes - off);
    for (int k = 1; k < size_; ++k) {
      const int q = (rank_ + k) % size_;
      t_.read_direct(q, staging_.data(), peer_headers_[static_cast<size_t>(q)].in + mine + off, len, op.deadline);
      fn(out_bytes + off, k == 1 ? in_bytes + off : out_bytes + off, staging_.data(), len / es);
    }
  }
  end_direct(op);
  return true;
}

// Alike on every rank: direct_possible is alike on both ends of a pair, and
// UCX's (one host) is transitive; every rank sees every header.
bool Collectives::trade_direct_headers(const Op& op, const void* in, void* out, size_t bytes) {
  for (int q = 0; q < size_; ++q) {
    if (q != rank_ && !t_.direct_possible(q)) return false;
  }
  bool all = true;
  for (int q = 0; q < size_; ++q) all = all && (q == rank_ || t_.copies_direct(q));
  const DirectHeader mine{reinterpret_cast<uintptr_t>(in), reinterpret_cast<uintptr_t>(out), bytes, all ? 1u : 0u};
  std::vector<DirectHeader>& peers = peer_headers_;
  for (int k = 1; k < size_; ++k) {
    t_.send((rank_ + k) % size_, Channel::kRingStaging, user(&mine, sizeof mine), 0, sizeof mine, 0, op.deadline);
  }
  bool go = all;
  for (int k = 1; k < size_; ++k) {
    const int q = (rank_ - k + size_) % size_;
    DirectHeader& h = peers[static_cast<size_t>(q)];
    t_.recv(q, Channel::kRingStaging, user(&h, sizeof h), 0, sizeof h, op.deadline);
    go = go && h.direct && h.bytes == bytes;
  }
  return go;
}

void Collectives::end_direct(const Op& op) {
  uint8_t token = 1;
  for (int k = 1; k < size_; ++k) {
    t_.send((rank_ + k) % size_, Channel::kRingStaging, user(&token, 1), 0, 1, 0, op.deadline);
  }
  for (int k = 1; k < size_; ++k) {
    t_.recv((rank_ - k + size_) % size_, Channel::kRingStaging, user(&token, 1), 0, 1, op.deadline);
  }
}

void Collectives::reduce(Algorithm a, const void* in, void* out, size_t count, size_t es, ReduceFn fn, int root) {
  const Op op(*this);
  const size_t bytes = count * es;
  if (a != Algorithm::kExchange) return ring_reduce(op, in, out, count, es, fn, root);
  fill(op, in, bytes, 1);
  if (rank_ != root) return post(op, root, 0, bytes);
  for (int k = 1; k < size_; ++k) take(op, (rank_ - k + size_) % size_, bytes);
  check_lengths(op, bytes);
  reduce_blocks(out, count, es, fn, 0);
}

void Collectives::all_gather(Algorithm a, const void* in, void* out, size_t bytes) {
  const Op op(*this);
  if (a == Algorithm::kDirectCopies) {
    if (all_gather_direct(op, in, out, bytes)) return;
    a = fallback_of(plugin::OpType::kAllGather, a, bytes, size_);
  }
  if (a != Algorithm::kExchange) return ring_all_gather(op, in, out, bytes);
  fill(op, in, bytes, 1);
  exchange_all(op, bytes, false);
  auto* o = static_cast<unsigned char*>(out);
  for (int r = 0; r < size_; ++r) std::memmove(o + static_cast<size_t>(r) * bytes, block(r, bytes, 0), bytes);
}

void Collectives::reduce_scatter(Algorithm a, const void* in, void* out, size_t count, size_t es, ReduceFn fn) {
  const Op op(*this);
  const size_t bytes = count * es;
  if (a == Algorithm::kDirectCopies && reduce_scatter_direct(op, in, out, count, es, fn)) return;
  if (a != Algorithm::kExchange) {
    // Segment k is rank k's block.
    return ring_reduce_scatter(op, in, out, Layout(count * static_cast<size_t>(size_), es, size_, kRingPieceBytes), fn);
  }
  fill(op, in, bytes, size_);
  exchange_all(op, bytes, true);  // each peer gets the block it reduces
  reduce_blocks(out, count, es, fn, rank_);
}

void Collectives::all_to_all(const void* in, void* out, size_t bytes) {
  const Op op(*this);
  fill(op, in, bytes, size_);
  exchange_all(op, bytes, true);
  auto* o = static_cast<unsigned char*>(out);
  for (int r = 0; r < size_; ++r) std::memcpy(o + static_cast<size_t>(r) * bytes, block(r, bytes, rank_), bytes);
}

void Collectives::gather(const void* in, void* out, size_t bytes, int root) {
  const Op op(*this);
  fill(op, in, bytes, 1);
  if (rank_ != root) return post(op, root, 0, bytes);
  for (int k = 1; k < size_; ++k) take(op, (rank_ - k + size_) % size_, bytes);
  check_lengths(op, bytes);
  auto* o = static_cast<unsigned char*>(out);
  for (int r = 0; r < size_; ++r) std::memmove(o + static_cast<size_t>(r) * bytes, block(r, bytes, 0), bytes);
}

void Collectives::scatter(const void* in, void* out, size_t bytes, int root) {
  const Op op(*this);
  if (rank_ == root) {
    fill(op, in, bytes, size_);
    for (int k = 1; k < size_; ++k) {
      const int p = (rank_ + k) % size_;
      post(op, p, p, bytes);
    }
    std::memmove(out, block(rank_, bytes, rank_), bytes);
    return;
  }
  take(op, root, bytes);
  check_lengths(op, bytes, root);
  std::memcpy(out, block(root, bytes, 0), bytes);
}

void Collectives::broadcast(Algorithm a, const void* in, void* out, size_t bytes, int root) {
  const Op op(*this);
  if (in_place_) return broadcast_in_place(op, in, out, bytes, root, a == Algorithm::kDirectCopies);
  if (rank_ == root) {
    std::memcpy(broadcast_.data(), in, bytes);
    for (int k = 1; k < size_; ++k) {
      t_.send((rank_ + k) % size_, Channel::kBroadcast, own(broadcast_), 0, bytes, 0, op.deadline);
    }
    if (out != in) std::memcpy(out, in, bytes);
    return;
  }
  t_.recv(root, Channel::kBroadcast, own(broadcast_), 0, bytes, op.deadline);
  std::memcpy(out, broadcast_.data(), bytes);
}

// Straight from the root's buffer into each receiver's (algorithms.h), no
// staging copy on either side. Under kDirectCopies, a pair that
// may copy directly (Transport::direct_possible, alike on both ends)
// trades headers: where the buffers lie and whether each end copies
// directly. If both do, the root writes the first share of the receiver's
// buffer (broadcast_direct_share) while the receiver reads the rest out of
// the root's, so two cores copy at once, each byte once; a token each way
// ends it (the root's share is written; the root's buffer is no longer
// read). Any other pair gets the pieces of broadcast_piece_bytes.
void Collectives::broadcast_in_place(const Op& op, const void* in, void* out, size_t bytes, int root,
                                     bool try_direct) {
  const size_t piece = broadcast_piece_bytes(bytes);
  const size_t share = broadcast_direct_share(bytes, size_);
  uint8_t token = 1;
  if (rank_ != root) {
    if (try_direct && t_.direct_possible(root)) {
      const DirectHeader mine{0, reinterpret_cast<uintptr_t>(out), bytes, t_.copies_direct(root) ? 1u : 0u};
      DirectHeader theirs;
      t_.send(root, Channel::kBroadcast, user(&mine, sizeof mine), 0, sizeof mine, 0, op.deadline);
      t_.recv(root, Channel::kBroadcast, user(&theirs, sizeof theirs), 0, sizeof theirs, op.deadline);
      if (theirs.direct) {
        t_.read_direct(root, static_cast<unsigned char*>(out) + share, theirs.in + share, bytes - share,
                       op.deadline);
        t_.send(root, Channel::kBroadcast, user(&token, 1), 0, 1, 0, op.deadline);
        return t_.recv(root, Channel::kBroadcast, user(&token, 1), 0, 1, op.deadline);
      }
    }
    for (size_t off = 0; off < bytes; off += piece) {
      t_.recv(root, Channel::kBroadcast, user(out, bytes), off, std::min(piece, bytes - off), op.deadline);
    }
    return;
  }
  std::vector<DirectHeader>& peers = peer_headers_;
  for (auto& h : peers) h = {};  // direct: 0 until a header says so
  for (int k = 1; k < size_; ++k) {
    const int p = (rank_ + k) % size_;
    if (!try_direct || !t_.direct_possible(p)) continue;
    DirectHeader& h = peers[static_cast<size_t>(p)];
    t_.recv(p, Channel::kBroadcast, user(&h, sizeof h), 0, sizeof h, op.deadline);
    h.direct = h.direct && h.bytes == bytes && t_.copies_direct(p);
    const DirectHeader mine{reinterpret_cast<uintptr_t>(in), 0, bytes, h.direct};
    t_.send(p, Channel::kBroadcast, user(&mine, sizeof mine), 0, sizeof mine, 0, op.deadline);
  }
  for (size_t off = 0; off < bytes; off += piece) {
    for (int k = 1; k < size_; ++k) {
      const int p = (rank_ + k) % size_;
      if (peers[static_cast<size_t>(p)].direct) continue;
      t_.send_stable(p, Channel::kBroadcast, user(in, bytes), off, std::min(piece, bytes - off), off, op.deadline);
    }
  }
  for (int k = 1; k < size_; ++k) {
    const int p = (rank_ + k) % size_;
    if (!peers[static_cast<size_t>(p)].direct) continue;
    t_.write_direct(p, in, peers[static_cast<size_t>(p)].out, share, op.deadline);
    t_.send(p, Channel::kBroadcast, user(&token, 1), 0, 1, 0, op.deadline);
  }
  if (out != in) std::memcpy(out, in, bytes);
  for (int k = 1; k < size_; ++k) {
    const int p = (rank_ + k) % size_;
    if (peers[static_cast<size_t>(p)].direct) t_.recv(p, Channel::kBroadcast, user(&token, 1), 0, 1, op.deadline);
  }
  t_.wait_sends(op.deadline);
}

void Collectives::barrier() {
  const Op op(*this);
  // tokens_[size_] is the one sent; tokens_[p] receives p's.
  for (int k = 1; k < size_; ++k) {
    t_.send((rank_ + k) % size_, Channel::kBarrier, own(tokens_), static_cast<size_t>(size_), 1,
            static_cast<size_t>(rank_), op.deadline);
  }
  for (int k = 1; k < size_; ++k) {
    const int p = (rank_ - k + size_) % size_;
    t_.recv(p, Channel::kBarrier, own(tokens_), static_cast<size_t>(p), 1, op.deadline);
  }
}

Collectives::Layout::Layout(size_t count, size_t es, int n, size_t piece_bytes)
    : count(count),
      es(es),
      seg((count + static_cast<size_t>(n) - 1) / static_cast<size_t>(n)),
      piece(std::max<size_t>(1, piece_bytes / es)),
      pieces((seg + piece - 1) / piece) {}

// Segment k is elements [k * seg, (k + 1) * seg) clipped to count; both ends
// of a link compute the same pieces, so empty ones are skipped alike.
std::pair<size_t, size_t> Collectives::Layout::segment(int k) const {
  const size_t begin = std::min(count, static_cast<size_t>(k) * seg);
  const size_t end = std::min(count, begin + seg);
  return {begin * es, (end - begin) * es};
}

std::pair<size_t, size_t> Collectives::Layout::span(int segment, size_t j) const {
  const size_t first = static_cast<size_t>(segment) * seg;
  const size_t begin = std::min(count, first + j * piece);
  const size_t end = std::min({count, first + (j + 1) * piece, first + seg});
  return {begin * es, (std::max(end, begin) - begin) * es};
}

void Collectives::ring(const Op& op, const void* in, void* out, size_t count, size_t es, ReduceFn fn) {
  const int n = size_;
  const int me = rank_;
  const Layout layout(count, es, n, ring_piece_bytes(count * es, in_place_));
  auto* in_bytes = static_cast<const unsigned char*>(in);
  auto* out_bytes = static_cast<unsigned char*>(out);
  const Region input = user(in, count * es), output = user(out, count * es);

  // Reduce-scatter: at step s send segment me - s (own input at s = 0, the
  // partial result after), receive segment me - s - 1 and add own input.
  for (int s = 0; s < n - 1; ++s) {
    const int send_seg = (me - s + n) % n;
    const int recv_seg = (me - s - 1 + 2 * n) % n;
    for (size_t j = 0; j < layout.pieces; ++j) {
      if (auto [off, len] = layout.span(send_seg, j); len) {
        ring_send(op, Channel::kRingStaging, s == 0 ? input : output, off, len, 0);
      }
      if (auto [off, len] = layout.span(recv_seg, j); len) {
        t_.recv(left_, Channel::kRingStaging, own(staging_), 0, len, op.deadline);
        fn(out_bytes + off, in_bytes + off, staging_.data(), len / es);
      }
    }
  }
  // This rank now holds the reduced segment me + 1.
  pass_around(op, out, layout, (me + 1) % n);
  if (in_place_) t_.wait_sends(op.deadline);
}

// In place, a piece sent from the input or the output is read by the peer
// after this call returns. Safe: the input is not written until the
// all-gather, and a segment is gathered back into this rank only after
// every rank has reduced it, which needs every piece this rank sent of it;
// a partial sum in the output is not written again before then either.
void Collectives::ring_send(const Op& op, Channel ch, Region src, size_t off, size_t len, size_t dst_offset) {
  if (in_place_) t_.send_stable(right_, ch, src, off, len, dst_offset, op.deadline);
  else t_.send(right_, ch, src, off, len, dst_offset, op.deadline);
}

void Collectives::pass_around(const Op& op, void* out, const Layout& layout, int held) {
  const int n = size_;
  const Region output = user(out, layout.count * layout.es);
  // Step s passes on the segment received at step s - 1 (at s = 0, the one
  // held), each piece landing directly in the right neighbour's output.
  for (int s = 0; s < n - 1; ++s) {
    const int send_seg = (held - s + n) % n;
    const int recv_seg = (held - s - 1 + 2 * n) % n;
    for (size_t j = 0; j < layout.pieces; ++j) {
      if (auto [off, len] = layout.span(send_seg, j); len) {
        ring_send(op, Channel::kRingOutput, output, off, len, off);
      }
      if (auto [off, len] = layout.span(recv_seg, j); len) {
        t_.recv(left_, Channel::kRingOutput, output, off, len, op.deadline);
      }
    }
  }
}

void Collectives::ring_all_gather(const Op& op, const void* in, void* out, size_t bytes) {
  auto* o = static_cast<unsigned char*>(out);
  std::memmove(o + static_cast<size_t>(rank_) * bytes, in, bytes);
  pass_around(op, out, Layout(bytes * static_cast<size_t>(size_), 1, size_, kRingPieceBytes), rank_);
  if (in_place_) t_.wait_sends(op.deadline);
}

void Collectives::ring_reduce_scatter(const Op& op, const void* in, void* mine, const Layout& layout, ReduceFn fn) {
  const int n = size_;
  const int me = rank_;
  const size_t es = layout.es;
  const size_t seg_bytes = layout.seg * es;
  // Partial sums alternate between two segment-sized halves: a piece written
  // at step s is sent at step s + 1, before step s + 2 overwrites it.
  if (partials_.size() < 2 * seg_bytes) partials_.resize(2 * seg_bytes);
  auto* in_bytes = static_cast<const unsigned char*>(in);
  const Region input = user(in, layout.count * es), partials = own(partials_);

  // As the all_reduce ring, shifted so that this rank ends with segment me.
  for (int s = 0; s < n - 1; ++s) {
    const int send_seg = (me - 1 - s + 2 * n) % n;
    const int recv_seg = (me - 2 - s + 2 * n) % n;
    for (size_t j = 0; j < layout.pieces; ++j) {
      const size_t within = j * layout.piece * es;
      if (auto [off, len] = layout.span(send_seg, j); len) {
        if (s == 0) t_.send(right_, Channel::kRingStaging, input, off, len, 0, op.deadline);
        else t_.send(right_, Channel::kRingStaging, partials, static_cast<size_t>((s - 1) % 2) * seg_bytes + within,
                     len, 0, op.deadline);
      }
      if (auto [off, len] = layout.span(recv_seg, j); len) {
        t_.recv(left_, Channel::kRingStaging, own(staging_), 0, len, op.deadline);
        unsigned char* dest = s == n - 2 ? static_cast<unsigned char*>(mine) + within
                                         : partials_.data() + static_cast<size_t>(s % 2) * seg_bytes + within;
        fn(dest, in_bytes + off, staging_.data(), len / es);
      }
    }
  }
}

// A reduce-scatter around the ring leaves each rank its reduced segment (the
// root's straight in its output); every other rank then writes its segment
// to the root. Half the traffic of an all_reduce, and no rank but the root
// needs an output.
void Collectives::ring_reduce(const Op& op, const void* in, void* out, size_t count, size_t es, ReduceFn fn,
                              int root) {
  const Layout layout(count, es, size_, kRingPieceBytes);
  const auto [my_offset, my_bytes] = layout.segment(rank_);
  unsigned char* mine;
  if (rank_ == root) {
    mine = static_cast<unsigned char*>(out) + my_offset;
  } else {
    if (segment_.size() < layout.seg * es) segment_.resize(layout.seg * es);
    mine = segment_.data();
  }
  ring_reduce_scatter(op, in, mine, layout, fn);
  if (rank_ != root) {
    if (my_bytes) t_.send(root, Channel::kRingOutput, own(segment_), 0, my_bytes, my_offset, op.deadline);
    return;
  }
  const Region output = user(out, count * es);
  for (int p = 0; p < size_; ++p) {
    const auto [offset, bytes] = layout.segment(p);
    if (p != root && bytes) t_.recv(p, Channel::kRingOutput, output, offset, bytes, op.deadline);
  }
}

}  // namespace comms::cpu_algorithms
