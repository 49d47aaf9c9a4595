// The raw-Gloo baselines of comms-bench.
// --raw-gloo: the same algorithm the Gloo backend picks for an op
// (algorithms.h), called directly on the caller's buffers, with none of
// libcomms around it (no validation, no dispatch, no Work). The difference
// to the same op through comms is libcomms' overhead.
// --gloo-native: Gloo's own algorithm classes where the backend runs
// algorithms of its own (backends/cpu_algorithms), to show what those gain.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "comms/plugin.h"
#include "comms/store.h"

namespace comms::gloo_backend {

class RawGloo {
 public:
  enum class Baseline {
    kSameAlgorithm,  // what the backend runs, minus libcomms: its overhead
    kGlooNative,     // Gloo's own algorithm classes where the backend has its own
  };

  // Connects an async mesh and a sync mesh over `store`. Collective over the
  // job. busy_poll: "auto", "1" or "0", as the backend resolved it (its
  // describe()), so reads wait as the backend's do. One rank connects
  // nothing: each op is the copy the backend makes for a one-rank comm.
  RawGloo(Store& store, int rank, int size, int local_size, std::chrono::milliseconds timeout,
          std::string_view busy_poll, Baseline baseline = Baseline::kSameAlgorithm);
  ~RawGloo();
  RawGloo(const RawGloo&) = delete;
  RawGloo& operator=(const RawGloo&) = delete;

  // Runs one op. Counts as in plugin::OpDesc; `peer` is for send/recv
  // (send to and receive from peer at once, as comms-bench's send_recv does).
  void run(plugin::OpType type, const void* input, void* output, size_t count, DataType dtype,
           ReduceKind kind, int root, int peer);

  std::string algorithm(plugin::OpType type, size_t bytes) const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace comms::gloo_backend
