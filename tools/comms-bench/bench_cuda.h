// comms-bench on CUDA buffers (--device cuda): the rank's device buffers and
// the stream every op runs on, the comm's and the baselines' alike. Only
// bench_cuda.cc and raw_nccl.cc see CUDA; in a build without CUDA
// check_cuda() refuses.
//
// Timing: an iteration is the host's wall time from issuing the op until
// cudaStreamSynchronize on the bench's stream returns, for comms and its
// baseline alike. That is what a caller who waits for its result sees: it includes
// libcomms' and the plugin's host work (validation, dispatch, the event
// hops to and from the plugin's internal stream) and the device-side cost of
// those hops. GPU events around the op would time only the device's
// timeline (host work before the first event runs is not in it) at about
// 0.5 us resolution, against a 2 us budget. The synchronize's wake-up is the
// same on both sides and cancels in the difference; every iteration starts
// on an idle stream, so no queued work blurs the next op.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comms/plugin.h"

namespace comms::bench {

// Refuses, before any rendezvous, what --device cuda cannot run: a build
// without CUDA, an op/type/reduction NCCL lacks (nccl_table.h; `raw`: also
// the ops only the plugin emulates on an older NCCL), and no CUDA device for
// `local_rank`. Throws comms::Error naming the reason and the flags.
void check_cuda(plugin::OpType type, DataType dtype, ReduceKind kind, bool raw, int local_rank);

class CudaBench {
 public:
  // Makes cuda:`device` current and creates the stream ops run on: at the
  // device's greatest priority when `high_priority` (the nccl plugin's
  // stream priority class for the comm, from its describe()), else CUDA's
  // default.
  static std::unique_ptr<CudaBench> open(int device, bool high_priority);
  virtual ~CudaBench() = default;

  virtual int device() const = 0;
  virtual void* stream() const = 0;  // the cudaStream_t, for OpOptions::stream
  // The device's compute capability, checked against NCCL's fp8 rule.
  virtual void check_supported(plugin::OpType type, DataType dtype, ReduceKind kind, bool raw) const = 0;
  virtual size_t free_memory() const = 0;  // cudaMemGetInfo

  // Two device buffers of at least `bytes` each (contents undefined).
  virtual void reserve(size_t bytes) = 0;
  virtual uint8_t* input() = 0;
  virtual uint8_t* output() = 0;
  // Stream-ordered copies of the host mirrors (each at most the reserved
  // size) to and from the device buffers; they return when done.
  virtual void upload(const std::vector<uint8_t>& in, const std::vector<uint8_t>& out) = 0;
  virtual void download(std::vector<uint8_t>& in, std::vector<uint8_t>& out) = 0;
  virtual void synchronize() = 0;  // cudaStreamSynchronize; throws on an error

  // --graph: captures what `issue` enqueues on stream() into a CUDA graph
  // (one for comms, one for raw), replacing the previous; replay launches it
  // (returns at once, like an op). uncapture drops it.
  virtual void capture(bool raw, const std::function<void()>& issue) = 0;
  virtual bool captured(bool raw) const = 0;
  virtual void replay(bool raw) = 0;
  virtual void uncapture(bool raw) = 0;
  // Releases the buffers and the stream; throws on a failure to release.
  virtual void close() = 0;
};

}  // namespace comms::bench
