// One-sided windows: memory every rank of a comm registered together, into
// which the other ranks write (put) without the owner taking part, and
// signals that let the owner know the data is there.
//
//   comms::Window w = comms::register_window(*comm, BufferView::of(buf));
//   w.put(BufferView::of(src), /*peer=*/1, /*offset=*/0, /*signal=*/true);
//   ...on rank 1: w.wait_signal(/*peer=*/0, 1);  // buf now holds src
//
// Semantics (NCCL's ncclPutSignal/ncclWaitSignal, MPI-3 RMA's passive
// target):
// - put(src, peer, offset) copies src into peer's window at byte `offset`.
//   It returns (or its Work completes) once src may be reused, not once the
//   data arrived. Puts from one rank to one peer land in issue order.
// - A signal (signal(peer), or put(..., signal=true)) adds one to peer's
//   count of signals from this rank, after every earlier put of this rank to
//   peer is visible there. wait_signal(counts) waits until counts[r] more
//   signals from each rank r arrived than earlier waits consumed, and
//   consumes exactly those. A wait that times out consumes nothing and, like
//   a refused op, leaves the comm usable (the signals may still come).
// - flush() returns once every put this rank issued is visible at its target.
// - Ops are numbered with the comm's other ops and fail the same way
//   (comms::Error naming comm, op, sequence number and rank): an offset or
//   size outside the peer's window, a peer out of range or a buffer on
//   another device is kInvalidArgument before anything moves; a dead peer is
//   kPeerFailure; a backend without windows is kUnsupported naming it.
//
// Which backends have windows: has_windows() says (UCX does; Gloo does not).
//
// Lifetime: registration and deregistration are collective over the comm.
// A window lasts until deregister() (or the handle's destructor, which then
// must run on every rank), and at most as long as the backend: finalize(),
// offload_backend(), abort() and a failed comm release it; the handle then
// reports registered() == false and refuses ops (kInvalidArgument, or the
// comm's failure), without touching the memory. The buffer must outlive the
// registration.
#pragma once

#include "comms/export.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "comms/comm.h"
#include "comms/options.h"
#include "comms/types.h"
#include "comms/work.h"

namespace comms {

namespace internal {
struct WindowState;
}

class COMMS_API Window {
 public:
  Window();
  // Made by register_window().
  COMMS_LOCAL explicit Window(std::shared_ptr<internal::WindowState> state);
  ~Window();  // deregisters (collective); never throws (failures are logged)
  Window(Window&&) noexcept;
  Window& operator=(Window&&) noexcept;
  Window(const Window&) = delete;
  Window& operator=(const Window&) = delete;

  // Collective: every rank deregisters its part. Throws the backend's
  // failure. Idempotent; does nothing once the backend released the window.
  void deregister();
  // False after deregister(), and once the backend that registered it was
  // finalized, offloaded, reloaded or failed.
  bool registered() const;
  // This rank's part as registered (empty for a default-constructed handle).
  BufferView buffer() const;
  // The bytes rank `peer` registered (every rank knows every rank's size).
  size_t size_of(int peer) const;

  // Copies src into peer's window at byte `offset`; with `signal`, then
  // signals peer. opts: async, timeout (tags and hints are refused).
  Work put(BufferView src, int peer, size_t offset, bool signal = false, const OpOptions& opts = {});
  Work signal(int peer, const OpOptions& opts = {});
  // counts: one per rank of the comm (size() entries).
  Work wait_signal(std::span<const uint64_t> counts, const OpOptions& opts = {});
  // Waits for `count` signals from `peer` alone.
  Work wait_signal(int peer, uint64_t count, const OpOptions& opts = {});
  Work flush(const OpOptions& opts = {});

 private:
  std::shared_ptr<internal::WindowState> state_;
};

// Whether the comm's backend for `type` has windows.
COMMS_API bool has_windows(const Comm& comm, DeviceType type);
// Collective over the comm: registers this rank's `buffer` (sizes may
// differ per rank) with the comm's backend for buffer.device. Throws
// kUnsupported when that backend has no windows, kInvalidArgument for a
// null or empty buffer or a backend that is not connected yet.
COMMS_API Window register_window(Comm& comm, BufferView buffer);

}  // namespace comms
