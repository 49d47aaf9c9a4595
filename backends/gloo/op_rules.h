// Each op's rules in the Gloo layer, in one place: plan() picks the path
// every op takes (the backend runs what it says), and path_name() names it
// for describe()'s "paths" (which comms-bench prints).
//
// A one-rank comm copies. Small collectives, every all_reduce, and barrier
// run the CPU algorithms (backends/cpu_algorithms/algorithms.h says which,
// by size) on a mesh of synchronous pairs (gloo_transport.h), when the op's
// timeout is the one that mesh's pairs were made with. Everything else runs
// Gloo's options-style collectives on the async mesh (gloo_ops.cc:
// allreduce's ring, broadcast, allgather(v), alltoall(v), gather, scatter,
// reduce; reduce_scatter as alltoall plus a local reduction). In-place
// forms: Gloo's collectives take in-place as "no input"; gather, scatter,
// all_to_all(v) copy an in-place input aside first (Gloo would read what it
// already overwrote).
#pragma once

#include <sched.h>

#include <chrono>
#include <cstddef>
#include <string_view>

#include "algorithms.h"
#include "comms/plugin.h"
#include "plan.h"

namespace comms::gloo_backend {

using cpu_algorithms::Algorithm;
using cpu_algorithms::kExchangeMaxBytes;
using cpu_algorithms::kSyncPathMaxBytes;
using cpu_algorithms::Path;
using cpu_algorithms::Plan;

// What a Gloo comm's plan reads besides the op.
struct GlooShape {
  int size = 1;
  // The op may run on the sync mesh: it is connected and the op's timeout
  // is the one its pairs were made with (they keep it as their socket
  // timeout).
  bool sync_mesh = false;
};

// The path of an op of `bytes` per rank (cpu_algorithms::bytes_of).
constexpr Plan plan(plugin::OpType type, size_t bytes, GlooShape comm) {
  if (comm.size == 1) return {Path::kOneRank};
  const Algorithm a = comm.sync_mesh ? cpu_algorithms::algorithm_for(type, bytes, comm.size) : Algorithm::kNone;
  return a != Algorithm::kNone ? Plan{Path::kCollectives, a} : Plan{Path::kGlooNative};
}

constexpr std::string_view path_name(plugin::OpType type, Plan p) {
  if (p.path == Path::kOneRank) return "one-rank copy";
  if (p.path == Path::kCollectives) return cpu_algorithms::algorithm_name(type, p.algorithm);
  switch (type) {
    case plugin::OpType::kReduceScatter:
    case plugin::OpType::kReduceScatterV: return "alltoall(v) + local reduce";
    case plugin::OpType::kSend:
    case plugin::OpType::kRecv:
    case plugin::OpType::kBatchP2P: return "unbound-buffer send/recv";
    default: return "options-style collective";
  }
}

// How sync-mesh reads wait, from COMMS_GLOO_BUSY_POLL / gloo.busy_poll:
//   "auto" (default): spin on the socket for up to kAutoSpin, then block,
//     when the ranks on this host do not outnumber its cores; else block;
//   "1": spin until the message arrives (Gloo's busy-poll mode);
//   "0": block at once.
// A prompt peer then costs no wake-up, and a late one gets the core back
// after kAutoSpin (docs/DESIGN.md, "A bounded spin before sleeping").
inline constexpr std::string_view kDefaultBusyPoll = "auto";
inline constexpr std::chrono::microseconds kAutoSpin{100};

inline std::chrono::microseconds read_spin(std::string_view mode, int local_size) {
  if (mode != "auto") return std::chrono::microseconds{0};
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  return local_size <= cores ? kAutoSpin : std::chrono::microseconds{0};
}

}  // namespace comms::gloo_backend
