// A pipelined ring all_reduce of our own, for messages past Gloo's sync
// algorithms (kSyncPathMaxBytes). It runs on the sync mesh, so the calling
// thread does every read, write and reduction with no event-loop hand-off.
//
// The message is cut into `size` segments and each segment into pieces of
// kPieceBytes; a reduce-scatter and an all-gather around the ring move one
// piece per step, so reducing a piece overlaps its neighbours' transfers.
// Sync pairs write with blocking writes: each rank writes one piece and then
// reads one, so a link never needs more than two unread pieces buffered, and
// the kernel send buffers (sized by size_send_buffers) hold several. Reduced
// pieces arrive in a piece-sized staging buffer; gathered pieces land straight
// in the caller's output. Only the calling thread reads a sync pair, so a
// buffer registered at the start of an op is in place before any of its
// pieces is read, wherever the neighbour is.
#pragma once

#include <cstddef>
#include <memory>

#include <gloo/context.h>
#include <gloo/transport/buffer.h>

#include "reductions.h"

namespace comms::gloo_backend {

class SyncRing {
 public:
  static constexpr size_t kPieceBytes = 128 * 1024;

  // Collective: every rank constructs it at the same point of its mesh's
  // life, since it reserves slots. `mesh` must outlive it, pairs in sync mode.
  explicit SyncRing(::gloo::Context& mesh);

  // out = reduction over ranks of in (in may equal out). Every element is
  // reduced once, by one rank, then gathered, so all ranks get the same bits.
  void all_reduce(const void* in, void* out, size_t count, size_t element_size, ReduceFn fn);

 private:
  ::gloo::Context& mesh_;
  int left_, right_;
  int staging_slot_, output_slot_;
  alignas(64) unsigned char staging_[kPieceBytes];
};

}  // namespace comms::gloo_backend
