#include "send_buffers.h"

#include <string>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/transport/pair.h>
#include <gloo/types.h>

#include "op_rules.h"

namespace comms::gloo_backend {

constexpr uint8_t kSizingSlotPrefix = 0x7f;

void size_send_buffers(::gloo::Context& sync_mesh, ::gloo::Context& async_mesh, std::chrono::milliseconds timeout) {
  constexpr size_t kBytes = kSyncPathMaxBytes;
  std::vector<char> out(kBytes), in(kBytes);
  const int me = sync_mesh.rank;
  const int sync_slot = sync_mesh.nextSlot();  // one per pair, the same on every rank
  // Peers in ascending order and the lower rank of a pair sending first:
  // no exchange depends on buffer space, and none waits on a later one.
  for (int r = 0; r < sync_mesh.size; ++r) {
    if (r == me) continue;
    auto& pair = sync_mesh.getPair(r);
    auto send = pair->createSendBuffer(sync_slot, out.data(), kBytes);
    auto recv = pair->createRecvBuffer(sync_slot, in.data(), kBytes);
    if (me < r) send->send();
    recv->waitRecv();
    if (me > r) send->send();
    send->waitSend();
  }
  auto send = async_mesh.createUnboundBuffer(out.data(), kBytes);
  auto recv = async_mesh.createUnboundBuffer(in.data(), kBytes);
  const uint64_t slot = ::gloo::Slot::build(kSizingSlotPrefix, 0);
  for (int r = 0; r < async_mesh.size; ++r) {
    if (r == me) continue;
    recv->recv(r, slot);
    send->send(r, slot);
    if (!recv->waitRecv(timeout) || !send->waitSend(timeout)) {
      throw ::gloo::IoException("sizing the send buffers: no answer from rank " + std::to_string(r));
    }
  }
}

}  // namespace comms::gloo_backend
