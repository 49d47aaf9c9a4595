#include "sync_ring.h"

#include <algorithm>

#include <gloo/transport/pair.h>

namespace comms::gloo_backend {

SyncRing::SyncRing(::gloo::Context& mesh) : mesh_(mesh) {
  left_ = (mesh.rank + mesh.size - 1) % mesh.size;
  right_ = (mesh.rank + 1) % mesh.size;
  staging_slot_ = mesh.nextSlot();
  output_slot_ = mesh.nextSlot();
}

void SyncRing::all_reduce(const void* in, void* out, size_t count, size_t es, ReduceFn fn) {
  const int n = mesh_.size;
  const int me = mesh_.rank;
  const size_t bytes = count * es;
  auto* in_bytes = static_cast<unsigned char*>(const_cast<void*>(in));
  auto* out_bytes = static_cast<unsigned char*>(out);

  // Per op: Gloo's buffers unregister their slot when destroyed, send
  // buffers included, so a persistent staging buffer would not survive a
  // send buffer of the same slot on the same pair (size 2).
  auto& from_left = mesh_.getPair(left_);
  auto staging_recv = from_left->createRecvBuffer(staging_slot_, staging_, kPieceBytes);
  auto output_recv = from_left->createRecvBuffer(output_slot_, out, bytes);
  auto& to_right = mesh_.getPair(right_);
  auto input_to_staging = to_right->createSendBuffer(staging_slot_, in_bytes, bytes);
  auto output_to_staging = to_right->createSendBuffer(staging_slot_, out_bytes, bytes);
  auto output_to_output = to_right->createSendBuffer(output_slot_, out_bytes, bytes);

  // Segment k is elements [k * seg, (k + 1) * seg) clipped to count; both
  // ends of a link compute the same pieces, so empty ones are skipped alike.
  const size_t seg = (count + n - 1) / n;
  const size_t piece = kPieceBytes / es;
  const size_t pieces = (seg + piece - 1) / piece;
  auto span = [&](int segment, size_t j) {
    const size_t begin = std::min(count, static_cast<size_t>(segment) * seg + j * piece);
    const size_t end = std::min({count, static_cast<size_t>(segment) * seg + (j + 1) * piece,
                                 static_cast<size_t>(segment + 1) * seg});
    return std::pair<size_t, size_t>{begin * es, (std::max(end, begin) - begin) * es};
  };

  // Reduce-scatter: at step s send segment me - s (own input at s = 0, the
  // partial result after), receive segment me - s - 1 and add own input.
  for (int s = 0; s < n - 1; ++s) {
    const int send_seg = (me - s + n) % n;
    const int recv_seg = (me - s - 1 + 2 * n) % n;
    auto& source = s == 0 ? input_to_staging : output_to_staging;
    for (size_t j = 0; j < pieces; ++j) {
      if (auto [off, len] = span(send_seg, j); len) {
        source->send(off, len, 0);
        source->waitSend();
      }
      if (auto [off, len] = span(recv_seg, j); len) {
        staging_recv->waitRecv();
        fn(out_bytes + off, in_bytes + off, staging_, len / es);
      }
    }
  }
  // All-gather: rank me now holds the reduced segment me + 1; pass segments
  // on, each landing directly in the right neighbour's output.
  for (int s = 0; s < n - 1; ++s) {
    const int send_seg = (me + 1 - s + n) % n;
    const int recv_seg = (me - s + n) % n;
    for (size_t j = 0; j < pieces; ++j) {
      if (auto [off, len] = span(send_seg, j); len) {
        output_to_output->send(off, len, off);
        output_to_output->waitSend();
      }
      if (auto [off, len] = span(recv_seg, j); len) output_recv->waitRecv();
    }
  }
}

}  // namespace comms::gloo_backend
