// Which Gloo algorithm runs each op. One function, used by the backend and by
// comms-bench's raw-Gloo baseline, so the baseline times the same algorithm.
//
// Small all_reduce, broadcast and barrier run on a mesh of synchronous pairs
// (the calling thread reads its own socket; busy-polling only when asked):
//   all_reduce up to 64 KiB gathered (size x message): gather every rank's
//     buffer (AllgatherRing, n-1 steps) and reduce locally in rank order;
//   all_reduce up to 256 KiB: AllreduceRing;
//   all_reduce above that: our own pipelined ring (sync_ring.h);
//   broadcast up to 256 KiB: BroadcastOneToAll;   barrier: BarrierAllToAll.
// Everything else runs Gloo's options-style collectives on the async mesh
// (allreduce's ring, broadcast, allgather(v), alltoall(v), gather, scatter,
// reduce; reduce_scatter as alltoall plus a local reduction).
#pragma once

#include <sched.h>

#include <cstddef>
#include <string_view>

#include "comms/plugin.h"

namespace comms::gloo_backend {

inline constexpr size_t kSyncPathMaxBytes = 256 * 1024;
inline constexpr size_t kGatherReduceMaxBytes = 64 * 1024;

enum class SyncAlgorithm : uint8_t { kNone, kGatherReduce, kRing, kPipelinedRing, kBroadcast, kBarrier };

constexpr SyncAlgorithm sync_algorithm_for(plugin::OpType type, size_t bytes, int size) {
  switch (type) {
    case plugin::OpType::kBarrier:
      return SyncAlgorithm::kBarrier;
    case plugin::OpType::kAllReduce:
      if (bytes == 0) return SyncAlgorithm::kNone;
      if (bytes > kSyncPathMaxBytes) return SyncAlgorithm::kPipelinedRing;
      return bytes * static_cast<size_t>(size) <= kGatherReduceMaxBytes ? SyncAlgorithm::kGatherReduce
                                                                        : SyncAlgorithm::kRing;
    case plugin::OpType::kBroadcast:
      return bytes == 0 || bytes > kSyncPathMaxBytes ? SyncAlgorithm::kNone : SyncAlgorithm::kBroadcast;
    default:
      return SyncAlgorithm::kNone;
  }
}

constexpr std::string_view algorithm_name(plugin::OpType type, SyncAlgorithm a) {
  switch (a) {
    case SyncAlgorithm::kGatherReduce: return "sync AllgatherRing + local reduce";
    case SyncAlgorithm::kRing: return "sync AllreduceRing";
    case SyncAlgorithm::kPipelinedRing: return "sync pipelined ring";
    case SyncAlgorithm::kBroadcast: return "sync BroadcastOneToAll";
    case SyncAlgorithm::kBarrier: return "sync BarrierAllToAll";
    case SyncAlgorithm::kNone: break;
  }
  switch (type) {
    case plugin::OpType::kReduceScatter:
    case plugin::OpType::kReduceScatterV: return "alltoall(v) + local reduce";
    case plugin::OpType::kSend:
    case plugin::OpType::kRecv:
    case plugin::OpType::kBatchP2P: return "unbound-buffer send/recv";
    default: return "options-style collective";
  }
}

// Whether COMMS_GLOO_BUSY_POLL / gloo.busy_poll ("0", "1", "auto") makes the
// sync mesh spin. Opt-in: on 2 ranks / 2 cores it gave 15 us per 4 KiB
// all_reduce, but 8 ms per op once a cached sync broadcast had run
// (docs/PERFORMANCE.md). "auto" spins only with a core to spare.
inline bool busy_poll_enabled(std::string_view mode, int local_size) {
  if (mode == "1") return true;
  if (mode != "auto") return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  return local_size < cores;
}

}  // namespace comms::gloo_backend
