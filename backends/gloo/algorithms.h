// Which Gloo algorithm runs each op. One function, used by the backend and by
// comms-bench's raw-Gloo baseline, so the baseline times the same algorithm.
//
// Small collectives, every all_reduce, and barrier run on a mesh of
// synchronous pairs (the calling thread reads its own socket), with
// algorithms of our own on Gloo's transport (sync_mesh.h):
//   all_reduce, reduce, all_gather, reduce_scatter, all_to_all, gather and
//     scatter up to 64 KiB summed over ranks (size x count x element):
//     one direct exchange, reductions local and in rank order;
//   all_reduce, reduce_scatter, all_gather and reduce above that: a
//     pipelined ring;
//   broadcast up to 256 KiB: the root sends to every rank;
//   barrier: a token from every rank to every other.
// Everything else runs Gloo's options-style collectives on the async mesh
// (allreduce's ring, broadcast, allgather(v), alltoall(v), gather, scatter,
// reduce; reduce_scatter as alltoall plus a local reduction), as do ops
// with a timeout other than the comm's.
#pragma once

#include <sched.h>

#include <chrono>
#include <cstddef>
#include <string_view>

#include "comms/plugin.h"

namespace comms::gloo_backend {

inline constexpr size_t kSyncPathMaxBytes = 256 * 1024;
inline constexpr size_t kExchangeMaxBytes = 64 * 1024;

enum class SyncAlgorithm : uint8_t { kNone, kExchange, kPipelinedRing, kBroadcast, kBarrier };

// bytes: the op's per-rank count (all_to_all: per block) times the element size.
constexpr SyncAlgorithm sync_algorithm_for(plugin::OpType type, size_t bytes, int size) {
  const bool exchange_fits = bytes != 0 && bytes * static_cast<size_t>(size) <= kExchangeMaxBytes;
  switch (type) {
    case plugin::OpType::kBarrier:
      return SyncAlgorithm::kBarrier;
    case plugin::OpType::kAllReduce:
      if (bytes == 0) return SyncAlgorithm::kNone;
      return exchange_fits ? SyncAlgorithm::kExchange : SyncAlgorithm::kPipelinedRing;
    case plugin::OpType::kAllGather:
    case plugin::OpType::kReduceScatter:
    case plugin::OpType::kReduce:
      if (bytes == 0) return SyncAlgorithm::kNone;
      return exchange_fits ? SyncAlgorithm::kExchange : SyncAlgorithm::kPipelinedRing;
    case plugin::OpType::kAllToAll:
    case plugin::OpType::kGather:
    case plugin::OpType::kScatter:
      return exchange_fits ? SyncAlgorithm::kExchange : SyncAlgorithm::kNone;
    case plugin::OpType::kBroadcast:
      return bytes == 0 || bytes > kSyncPathMaxBytes ? SyncAlgorithm::kNone : SyncAlgorithm::kBroadcast;
    default:
      return SyncAlgorithm::kNone;
  }
}

constexpr std::string_view algorithm_name(plugin::OpType type, SyncAlgorithm a) {
  switch (a) {
    case SyncAlgorithm::kExchange:
      switch (type) {
        case plugin::OpType::kAllReduce:
        case plugin::OpType::kReduceScatter: return "sync exchange + local reduce";
        case plugin::OpType::kReduce: return "sync gather to root + local reduce";
        case plugin::OpType::kGather: return "sync gather to root";
        case plugin::OpType::kScatter: return "sync scatter from root";
        default: return "sync exchange";
      }
    case SyncAlgorithm::kPipelinedRing:
      return type == plugin::OpType::kReduce ? "sync ring reduce-scatter + gather to root" : "sync pipelined ring";
    case SyncAlgorithm::kBroadcast: return "sync broadcast from root";
    case SyncAlgorithm::kBarrier: return "sync token exchange";
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

// How sync-mesh reads wait, from COMMS_GLOO_BUSY_POLL / gloo.busy_poll:
//   "auto" (default): spin on the socket for up to kAutoSpin, then block,
//     when the ranks on this host do not outnumber its cores; else block;
//   "1": spin until the message arrives (Gloo's busy-poll mode);
//   "0": block at once.
// The bounded spin takes a 4 KiB all_reduce at 2 ranks from ~55 us to
// ~17 us without handing a core to a peer that is late.
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
