#include "gloo_transport.h"

#include <sched.h>
#include <sys/socket.h>

#include <cerrno>

#include <gloo/common/error.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/address.h>

#include "sockets.h"

namespace comms::gloo_backend {

using cpu_algorithms::Channel;
using cpu_algorithms::Clock;
using cpu_algorithms::Region;
using cpu_algorithms::TransportError;

GlooTransport::GlooTransport(std::shared_ptr<::gloo::Context> mesh, std::chrono::microseconds spin,
                             const std::set<int>& opened)
    : mesh_(std::move(mesh)),
      spin_us_(spin.count()),
      rank_(mesh_->rank),
      size_(mesh_->size),
      base_slot_(mesh_->nextSlot(cpu_algorithms::kNumChannels * size_)),
      fds_(static_cast<size_t>(size_), -1),
      links_(static_cast<size_t>(size_)) {
  std::vector<sockaddr_storage> locals;
  std::vector<int> ranks;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const auto& pair = mesh_->getPair(p);
    locals.push_back(static_cast<const ::gloo::transport::tcp::Address&>(pair->address()).getSockaddr());
    ranks.push_back(p);
  }
  for (const auto& [socket, i] : sockets_bound_to(opened, locals)) fds_[static_cast<size_t>(ranks[i])] = socket.fd;
}

GlooTransport::~GlooTransport() = default;

::gloo::transport::Buffer& GlooTransport::send_buffer(int peer, Channel ch, const Region& r) {
  auto& entries = links_[static_cast<size_t>(peer)].send[static_cast<size_t>(ch)];
  for (auto& e : entries) {
    if (e.buffer && e.base == r.base && e.bytes == r.bytes) return *e.buffer;
  }
  // Replace an empty entry, else the older one (entries[1] moves to [0]).
  if (entries[0].buffer && entries[1].buffer) entries[0] = std::move(entries[1]);
  auto& e = entries[0].buffer ? entries[1] : entries[0];
  e.buffer.reset();
  e.buffer = mesh_->getPair(peer)->createSendBuffer(slot(ch, rank_), r.base, r.bytes);
  e.base = r.base;
  e.bytes = r.bytes;
  e.persistent = r.persistent;
  dirty_ |= !r.persistent;
  return *e.buffer;
}

::gloo::transport::Buffer& GlooTransport::recv_buffer(int peer, Channel ch, const Region& r) {
  auto& e = links_[static_cast<size_t>(peer)].recv[static_cast<size_t>(ch)];
  if (e.buffer && e.base == r.base && e.bytes == r.bytes) return *e.buffer;
  e.buffer.reset();  // unregisters the slot before the new buffer takes it
  e.buffer = mesh_->getPair(peer)->createRecvBuffer(slot(ch, peer), r.base, r.bytes);
  e.base = r.base;
  e.bytes = r.bytes;
  e.persistent = r.persistent;
  dirty_ |= !r.persistent;
  return *e.buffer;
}

void GlooTransport::op_done() {
  if (!dirty_) return;
  dirty_ = false;
  for (auto& link : links_) {
    for (auto& entries : link.send) {
      for (auto& e : entries) {
        if (!e.persistent) e = Registered{};
      }
    }
    for (auto& e : link.recv) {
      if (!e.persistent) e = Registered{};
    }
  }
}

void GlooTransport::send(int peer, Channel ch, Region src, size_t offset, size_t len, size_t dst_offset,
                         Clock::time_point deadline) {
  try {
    auto& buffer = send_buffer(peer, ch, src);
    buffer.send(offset, len, dst_offset);
    buffer.waitSend();
  } catch (const ::gloo::IoException& e) {
    fail(e, peer, deadline);
  }
}

void GlooTransport::recv(int peer, Channel ch, Region dst, size_t, size_t, Clock::time_point deadline) {
  try {
    auto& buffer = recv_buffer(peer, ch, dst);  // the sender names the offset
    await(peer);
    buffer.waitRecv();
  } catch (const ::gloo::IoException& e) {
    fail(e, peer, deadline);
  }
}

void GlooTransport::fail(const std::exception& e, int peer, Clock::time_point deadline) const {
  // Gloo's pairs time out each read at the mesh's timeout, which is the op's
  // (the backend runs ops with another timeout elsewhere): an I/O error at
  // the deadline is that timeout, whatever Gloo's text says.
  using Kind = TransportError::Kind;
  const Kind kind = aborted_ ? Kind::kAborted
                             : Clock::now() + std::chrono::milliseconds(1) >= deadline ? Kind::kTimeout
                                                                                       : Kind::kPeerFailure;
  throw TransportError(kind, peer, e.what());
}

void GlooTransport::abort() {
  aborted_ = true;
  for (int fd : fds_) {
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  }
}

void GlooTransport::await(int peer) {
  const int fd = fds_[static_cast<size_t>(peer)];
  const int64_t spin_us = spin_us_.load(std::memory_order_relaxed);
  if (fd < 0 || spin_us <= 0) return;
  const auto deadline = Clock::now() + std::chrono::microseconds(spin_us);
  char byte;
  for (;;) {
    // Data, end of stream or an error: Gloo's read takes it from here.
    if (::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) != -1 || (errno != EAGAIN && errno != EINTR)) return;
    if (Clock::now() >= deadline) return;
    // A peer woken onto this core (loopback wake-ups favour the waker's
    // core) runs now instead of after the spin.
    sched_yield();
  }
}

}  // namespace comms::gloo_backend
