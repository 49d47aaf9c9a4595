#include "sync_mesh.h"

#include <sched.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/address.h>

#include "algorithms.h"
#include "sockets.h"

namespace comms::gloo_backend {

SyncMesh::SyncMesh(std::shared_ptr<::gloo::Context> mesh, std::chrono::microseconds spin)
    : mesh_(std::move(mesh)),
      spin_us_(spin.count()),
      rank_(mesh_->rank),
      size_(mesh_->size),
      left_((rank_ + size_ - 1) % size_),
      right_((rank_ + 1) % size_),
      base_slot_(mesh_->nextSlot(kKinds * size_)),
      fds_(static_cast<size_t>(size_), -1),
      inbox_(kExchangeMaxBytes),
      outbox_(kExchangeMaxBytes),
      broadcast_(kSyncPathMaxBytes),
      tokens_(static_cast<size_t>(size_) + 1),
      staging_(kPieceBytes),
      outbox_send_(static_cast<size_t>(size_)),
      inbox_recv_(static_cast<size_t>(size_)),
      broadcast_send_(static_cast<size_t>(size_)),
      broadcast_recv_(static_cast<size_t>(size_)),
      token_send_(static_cast<size_t>(size_)),
      token_recv_(static_cast<size_t>(size_)) {
  std::vector<sockaddr_storage> locals;
  std::vector<int> ranks;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    auto& pair = mesh_->getPair(p);
    const auto i = static_cast<size_t>(p);
    outbox_send_[i] = pair->createSendBuffer(slot(kExchange, rank_), outbox_.data(), outbox_.size());
    inbox_recv_[i] = pair->createRecvBuffer(slot(kExchange, p), inbox_.data(), inbox_.size());
    broadcast_send_[i] = pair->createSendBuffer(slot(kBroadcast, rank_), broadcast_.data(), broadcast_.size());
    broadcast_recv_[i] = pair->createRecvBuffer(slot(kBroadcast, p), broadcast_.data(), broadcast_.size());
    token_send_[i] = pair->createSendBuffer(slot(kBarrier, rank_), tokens_.data() + size_, 1);
    token_recv_[i] = pair->createRecvBuffer(slot(kBarrier, p), tokens_.data() + p, 1);
    locals.push_back(static_cast<const ::gloo::transport::tcp::Address&>(pair->address()).getSockaddr());
    ranks.push_back(p);
  }
  staging_recv_ = mesh_->getPair(left_)->createRecvBuffer(slot(kRingStaging, left_), staging_.data(), kPieceBytes);
  for_each_socket_bound_to(locals, [&](int fd, size_t i) { fds_[static_cast<size_t>(ranks[i])] = fd; });
}

SyncMesh::~SyncMesh() = default;

void SyncMesh::await(int peer) {
  const int fd = fds_[static_cast<size_t>(peer)];
  const int64_t spin_us = spin_us_.load(std::memory_order_relaxed);
  if (fd < 0 || spin_us <= 0) return;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
  char byte;
  for (;;) {
    // Data, end of stream or an error: Gloo's read takes it from here.
    if (::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) != -1 || (errno != EAGAIN && errno != EINTR)) return;
    if (std::chrono::steady_clock::now() >= deadline) return;
    // A peer woken onto this core (loopback wake-ups favour the waker's
    // core) runs now instead of after the spin.
    sched_yield();
  }
}

void SyncMesh::post(int peer, size_t offset, size_t bytes) {
  auto& send = outbox_send_[static_cast<size_t>(peer)];
  send->send(offset, bytes, static_cast<size_t>(rank_) * bytes);
  send->waitSend();
}

void SyncMesh::take(int peer) {
  await(peer);
  inbox_recv_[static_cast<size_t>(peer)]->waitRecv();
}

const unsigned char* SyncMesh::block(int r, size_t bytes, size_t own_offset) const {
  return r == rank_ ? outbox_.data() + own_offset : inbox_.data() + static_cast<size_t>(r) * bytes;
}

void SyncMesh::reduce_blocks(void* out, size_t count, size_t es, ReduceFn fn, size_t own_offset) const {
  // Rank order, whatever this rank's own: the same bits everywhere.
  const size_t bytes = count * es;
  fn(out, block(0, bytes, own_offset), block(1, bytes, own_offset), count);
  for (int r = 2; r < size_; ++r) fn(out, out, block(r, bytes, own_offset), count);
}

// Every exchange writes to all peers first, then reads: the writes, at most
// kExchangeMaxBytes per peer, fit the sized send buffers, so none blocks on
// a peer that is itself writing. Peers are visited starting with the right
// neighbour so that not every rank writes to rank 0 first.

void SyncMesh::all_reduce(const void* in, void* out, size_t count, size_t es, ReduceFn fn) {
  const size_t bytes = count * es;
  if (bytes * static_cast<size_t>(size_) > kExchangeMaxBytes) return ring(in, out, count, es, fn);
  std::memcpy(outbox_.data(), in, bytes);
  for (int k = 1; k < size_; ++k) post((rank_ + k) % size_, 0, bytes);
  for (int k = 1; k < size_; ++k) take((rank_ - k + size_) % size_);
  reduce_blocks(out, count, es, fn, 0);
}

void SyncMesh::reduce(const void* in, void* out, size_t count, size_t es, ReduceFn fn, int root) {
  const size_t bytes = count * es;
  if (bytes * static_cast<size_t>(size_) > kExchangeMaxBytes) return ring_reduce(in, out, count, es, fn, root);
  std::memcpy(outbox_.data(), in, bytes);
  if (rank_ != root) return post(root, 0, bytes);
  for (int k = 1; k < size_; ++k) take((rank_ - k + size_) % size_);
  reduce_blocks(out, count, es, fn, 0);
}

void SyncMesh::all_gather(const void* in, void* out, size_t bytes) {
  if (bytes * static_cast<size_t>(size_) > kExchangeMaxBytes) return ring_all_gather(in, out, bytes);
  std::memcpy(outbox_.data(), in, bytes);
  for (int k = 1; k < size_; ++k) post((rank_ + k) % size_, 0, bytes);
  for (int k = 1; k < size_; ++k) take((rank_ - k + size_) % size_);
  auto* o = static_cast<unsigned char*>(out);
  for (int r = 0; r < size_; ++r) std::memmove(o + static_cast<size_t>(r) * bytes, block(r, bytes, 0), bytes);
}

void SyncMesh::reduce_scatter(const void* in, void* out, size_t count, size_t es, ReduceFn fn) {
  const size_t bytes = count * es;
  if (bytes * static_cast<size_t>(size_) > kExchangeMaxBytes) {
    // Segment k is rank k's block.
    return ring_reduce_scatter(in, out, Layout(count * static_cast<size_t>(size_), es, size_), fn);
  }
  std::memcpy(outbox_.data(), in, bytes * static_cast<size_t>(size_));
  for (int k = 1; k < size_; ++k) {
    const int p = (rank_ + k) % size_;
    post(p, static_cast<size_t>(p) * bytes, bytes);  // the block p reduces
  }
  for (int k = 1; k < size_; ++k) take((rank_ - k + size_) % size_);
  reduce_blocks(out, count, es, fn, static_cast<size_t>(rank_) * bytes);
}

void SyncMesh::all_to_all(const void* in, void* out, size_t bytes) {
  std::memcpy(outbox_.data(), in, bytes * static_cast<size_t>(size_));
  for (int k = 1; k < size_; ++k) {
    const int p = (rank_ + k) % size_;
    post(p, static_cast<size_t>(p) * bytes, bytes);
  }
  for (int k = 1; k < size_; ++k) take((rank_ - k + size_) % size_);
  auto* o = static_cast<unsigned char*>(out);
  const size_t own = static_cast<size_t>(rank_) * bytes;
  for (int r = 0; r < size_; ++r) std::memcpy(o + static_cast<size_t>(r) * bytes, block(r, bytes, own), bytes);
}

void SyncMesh::gather(const void* in, void* out, size_t bytes, int root) {
  std::memcpy(outbox_.data(), in, bytes);
  if (rank_ != root) return post(root, 0, bytes);
  for (int k = 1; k < size_; ++k) take((rank_ - k + size_) % size_);
  auto* o = static_cast<unsigned char*>(out);
  for (int r = 0; r < size_; ++r) std::memmove(o + static_cast<size_t>(r) * bytes, block(r, bytes, 0), bytes);
}

void SyncMesh::scatter(const void* in, void* out, size_t bytes, int root) {
  if (rank_ == root) {
    std::memcpy(outbox_.data(), in, bytes * static_cast<size_t>(size_));
    for (int k = 1; k < size_; ++k) {
      const int p = (rank_ + k) % size_;
      post(p, static_cast<size_t>(p) * bytes, bytes);
    }
    std::memmove(out, outbox_.data() + static_cast<size_t>(rank_) * bytes, bytes);
    return;
  }
  take(root);
  std::memcpy(out, inbox_.data() + static_cast<size_t>(root) * bytes, bytes);
}

void SyncMesh::broadcast(const void* in, void* out, size_t bytes, int root) {
  if (rank_ == root) {
    std::memcpy(broadcast_.data(), in, bytes);
    for (int k = 1; k < size_; ++k) {
      auto& send = broadcast_send_[static_cast<size_t>((rank_ + k) % size_)];
      send->send(0, bytes, 0);
      send->waitSend();
    }
    if (out != in) std::memcpy(out, in, bytes);
    return;
  }
  await(root);
  broadcast_recv_[static_cast<size_t>(root)]->waitRecv();
  std::memcpy(out, broadcast_.data(), bytes);
}

void SyncMesh::barrier() {
  for (int k = 1; k < size_; ++k) {
    auto& send = token_send_[static_cast<size_t>((rank_ + k) % size_)];
    send->send();
    send->waitSend();
  }
  for (int k = 1; k < size_; ++k) {
    const int p = (rank_ - k + size_) % size_;
    await(p);
    token_recv_[static_cast<size_t>(p)]->waitRecv();
  }
}

SyncMesh::Layout::Layout(size_t count, size_t es, int n)
    : count(count),
      es(es),
      seg((count + static_cast<size_t>(n) - 1) / static_cast<size_t>(n)),
      piece(kPieceBytes / es),
      pieces((seg + piece - 1) / piece) {}

// Segment k is elements [k * seg, (k + 1) * seg) clipped to count; both ends
// of a link compute the same pieces, so empty ones are skipped alike.
std::pair<size_t, size_t> SyncMesh::Layout::segment(int k) const {
  const size_t begin = std::min(count, static_cast<size_t>(k) * seg);
  const size_t end = std::min(count, begin + seg);
  return {begin * es, (end - begin) * es};
}

std::pair<size_t, size_t> SyncMesh::Layout::span(int segment, size_t j) const {
  const size_t first = static_cast<size_t>(segment) * seg;
  const size_t begin = std::min(count, first + j * piece);
  const size_t end = std::min({count, first + (j + 1) * piece, first + seg});
  return {begin * es, (std::max(end, begin) - begin) * es};
}

void SyncMesh::ring(const void* in, void* out, size_t count, size_t es, ReduceFn fn) {
  const int n = size_;
  const int me = rank_;
  const Layout layout(count, es, n);
  auto* in_bytes = static_cast<unsigned char*>(const_cast<void*>(in));
  auto* out_bytes = static_cast<unsigned char*>(out);
  auto& to_right = mesh_->getPair(right_);
  auto input_to_staging = to_right->createSendBuffer(slot(kRingStaging, me), in_bytes, count * es);
  auto output_to_staging = to_right->createSendBuffer(slot(kRingStaging, me), out_bytes, count * es);

  // Reduce-scatter: at step s send segment me - s (own input at s = 0, the
  // partial result after), receive segment me - s - 1 and add own input.
  for (int s = 0; s < n - 1; ++s) {
    const int send_seg = (me - s + n) % n;
    const int recv_seg = (me - s - 1 + 2 * n) % n;
    auto& source = s == 0 ? input_to_staging : output_to_staging;
    for (size_t j = 0; j < layout.pieces; ++j) {
      if (auto [off, len] = layout.span(send_seg, j); len) {
        source->send(off, len, 0);
        source->waitSend();
      }
      if (auto [off, len] = layout.span(recv_seg, j); len) {
        await(left_);
        staging_recv_->waitRecv();
        fn(out_bytes + off, in_bytes + off, staging_.data(), len / es);
      }
    }
  }
  // This rank now holds the reduced segment me + 1.
  pass_around(out, layout, (me + 1) % n);
}

void SyncMesh::pass_around(void* out, const Layout& layout, int held) {
  const int n = size_;
  const size_t bytes = layout.count * layout.es;
  auto output_recv = mesh_->getPair(left_)->createRecvBuffer(slot(kRingOutput, left_), out, bytes);
  auto output_to_output = mesh_->getPair(right_)->createSendBuffer(slot(kRingOutput, rank_), out, bytes);
  // Step s passes on the segment received at step s - 1 (at s = 0, the one
  // held), each piece landing directly in the right neighbour's output.
  for (int s = 0; s < n - 1; ++s) {
    const int send_seg = (held - s + n) % n;
    const int recv_seg = (held - s - 1 + 2 * n) % n;
    for (size_t j = 0; j < layout.pieces; ++j) {
      if (auto [off, len] = layout.span(send_seg, j); len) {
        output_to_output->send(off, len, off);
        output_to_output->waitSend();
      }
      if (auto [off, len] = layout.span(recv_seg, j); len) {
        await(left_);
        output_recv->waitRecv();
      }
    }
  }
}

void SyncMesh::ring_all_gather(const void* in, void* out, size_t bytes) {
  auto* o = static_cast<unsigned char*>(out);
  std::memmove(o + static_cast<size_t>(rank_) * bytes, in, bytes);
  pass_around(out, Layout(bytes * static_cast<size_t>(size_), 1, size_), rank_);
}

void SyncMesh::ring_reduce_scatter(const void* in, void* mine, const Layout& layout, ReduceFn fn) {
  const int n = size_;
  const int me = rank_;
  const size_t es = layout.es;
  const size_t seg_bytes = layout.seg * es;
  // Partial sums alternate between two segment-sized halves: a piece written
  // at step s is sent at step s + 1, before step s + 2 overwrites it.
  if (partials_.size() < 2 * seg_bytes) partials_.resize(2 * seg_bytes);
  auto* in_bytes = static_cast<unsigned char*>(const_cast<void*>(in));
  auto& to_right = mesh_->getPair(right_);
  auto input_to_staging = to_right->createSendBuffer(slot(kRingStaging, me), in_bytes, layout.count * es);
  auto partials_to_staging = to_right->createSendBuffer(slot(kRingStaging, me), partials_.data(), 2 * seg_bytes);

  // As the all_reduce ring, shifted so that this rank ends with segment me.
  for (int s = 0; s < n - 1; ++s) {
    const int send_seg = (me - 1 - s + 2 * n) % n;
    const int recv_seg = (me - 2 - s + 2 * n) % n;
    for (size_t j = 0; j < layout.pieces; ++j) {
      const size_t within = j * layout.piece * es;
      if (auto [off, len] = layout.span(send_seg, j); len) {
        if (s == 0) input_to_staging->send(off, len, 0);
        else partials_to_staging->send(static_cast<size_t>((s - 1) % 2) * seg_bytes + within, len, 0);
        (s == 0 ? input_to_staging : partials_to_staging)->waitSend();
      }
      if (auto [off, len] = layout.span(recv_seg, j); len) {
        await(left_);
        staging_recv_->waitRecv();
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
void SyncMesh::ring_reduce(const void* in, void* out, size_t count, size_t es, ReduceFn fn, int root) {
  const Layout layout(count, es, size_);
  const auto [my_offset, my_bytes] = layout.segment(rank_);
  unsigned char* mine;
  if (rank_ == root) {
    mine = static_cast<unsigned char*>(out) + my_offset;
  } else {
    if (segment_.size() < layout.seg * es) segment_.resize(layout.seg * es);
    mine = segment_.data();
  }
  ring_reduce_scatter(in, mine, layout, fn);
  if (rank_ != root) {
    if (my_bytes == 0) return;
    auto send = mesh_->getPair(root)->createSendBuffer(slot(kRingOutput, rank_), mine, my_bytes);
    send->send(0, my_bytes, my_offset);
    send->waitSend();
    return;
  }
  std::vector<BufferPtr> from(static_cast<size_t>(size_));
  for (int p = 0; p < size_; ++p) {
    if (p == root || layout.segment(p).second == 0) continue;
    from[static_cast<size_t>(p)] = mesh_->getPair(p)->createRecvBuffer(slot(kRingOutput, p), out, count * es);
  }
  for (int p = 0; p < size_; ++p) {
    if (!from[static_cast<size_t>(p)]) continue;
    await(p);
    from[static_cast<size_t>(p)]->waitRecv();
  }
}

}  // namespace comms::gloo_backend
