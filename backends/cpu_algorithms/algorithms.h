// Which of the CPU algorithms runs an op, by its size. One function, used by
// the Gloo backend, by comms-bench's raw-Gloo baseline (so the baseline times
// the same algorithm) and by the tests.
//
//   all_reduce, reduce, all_gather, reduce_scatter, all_to_all, gather and
//     scatter up to kExchangeMaxBytes summed over ranks (size x count x
//     element): one direct exchange, reductions local and in rank order;
//   all_reduce, reduce_scatter, all_gather and reduce above that: a
//     pipelined ring;
//   broadcast up to kSyncPathMaxBytes: the root sends to every rank;
//   barrier: a token from every rank to every other.
// kNone: the op is not one of these; a backend runs it its own way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "comms/plugin.h"

namespace comms::cpu_algorithms {

inline constexpr size_t kSyncPathMaxBytes = 256 * 1024;
inline constexpr size_t kExchangeMaxBytes = 64 * 1024;

enum class Algorithm : uint8_t { kNone, kExchange, kPipelinedRing, kBroadcast, kBarrier };

// bytes: the op's per-rank count (all_to_all: per block) times the element size.
constexpr Algorithm algorithm_for(plugin::OpType type, size_t bytes, int size) {
  const bool exchange_fits = bytes != 0 && bytes * static_cast<size_t>(size) <= kExchangeMaxBytes;
  switch (type) {
    case plugin::OpType::kBarrier:
      return Algorithm::kBarrier;
    case plugin::OpType::kAllReduce:
    case plugin::OpType::kAllGather:
    case plugin::OpType::kReduceScatter:
    case plugin::OpType::kReduce:
      if (bytes == 0) return Algorithm::kNone;
      return exchange_fits ? Algorithm::kExchange : Algorithm::kPipelinedRing;
    case plugin::OpType::kAllToAll:
    case plugin::OpType::kGather:
    case plugin::OpType::kScatter:
      return exchange_fits ? Algorithm::kExchange : Algorithm::kNone;
    case plugin::OpType::kBroadcast:
      return bytes == 0 || bytes > kSyncPathMaxBytes ? Algorithm::kNone : Algorithm::kBroadcast;
    default:
      return Algorithm::kNone;
  }
}

// The name comms-bench and describe-style output print; empty for kNone.
constexpr std::string_view algorithm_name(plugin::OpType type, Algorithm a) {
  switch (a) {
    case Algorithm::kExchange:
      switch (type) {
        case plugin::OpType::kAllReduce:
        case plugin::OpType::kReduceScatter: return "sync exchange + local reduce";
        case plugin::OpType::kReduce: return "sync gather to root + local reduce";
        case plugin::OpType::kGather: return "sync gather to root";
        case plugin::OpType::kScatter: return "sync scatter from root";
        default: return "sync exchange";
      }
    case Algorithm::kPipelinedRing:
      return type == plugin::OpType::kReduce ? "sync ring reduce-scatter + gather to root" : "sync pipelined ring";
    case Algorithm::kBroadcast: return "sync broadcast from root";
    case Algorithm::kBarrier: return "sync token exchange";
    case Algorithm::kNone: break;
  }
  return {};
}

}  // namespace comms::cpu_algorithms
