// Which of the CPU algorithms runs an op, by its size: the size rules that
// each backend's plan function reads (backends/gloo/op_rules.h,
// backends/ucx/ucx_plan.h).
//
//   all_reduce, reduce, all_gather, reduce_scatter, all_to_all, gather and
//     scatter up to kExchangeMaxBytes summed over ranks (size x count x
//     element): one direct exchange, reductions local and in rank order;
//   all_reduce, reduce_scatter, all_gather and reduce above that: a
//     pipelined ring (on a transport that sends in place, all_reduce from
//     kAllReduceDirectMinSegmentBytes per segment: direct copies where every
//     rank copies directly with every other, as UCX's ranks on one host;
//     the ring where not; reduce_scatter likewise from that size per
//     block, each rank reducing only its own);
//   all_gather on such a transport from kAllGatherDirectMinBytes per rank,
//     whether or not the exchange would fit: direct copies (or, where some
//     rank does not copy directly, the exchange or the ring by size);
//   broadcast up to kSyncPathMaxBytes, and at every size on a transport
//     that sends in place (UCX): the root sends to every rank (from
//     kBroadcastDirectMinBytes there, direct copies: root and receiver
//     split the copy where both copy directly);
//   barrier: a token from every rank to every other.
// kNone: the op is not one of these; a backend runs it its own way.
//
// Large ops on a transport that sends in place (Transport::sends_in_place)
// follow the switch points below, each chosen by a measurement in
// docs/appendix/MEASUREMENTS.md ("The 64 KiB to 64 MiB band on UCX", "Direct
// copies on one host").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "comms/plugin.h"

namespace comms::cpu_algorithms {

inline constexpr size_t kSyncPathMaxBytes = 256 * 1024;
inline constexpr size_t kExchangeMaxBytes = 64 * 1024;

enum class Algorithm : uint8_t { kNone, kExchange, kPipelinedRing, kDirectCopies, kBroadcast, kBarrier };

// The ring's piece size on an in-place transport; `bytes` is the op's whole
// per-rank buffer (all_reduce: count x element). Each segment (bytes / size)
// moves in pieces of this size, so segment / piece is the pipeline depth.
// Rule: pieces stay under UCX's eager limit (comms sets 64 KiB + 1), so the
// sender copies into the peer's shared-memory FIFO while the peer copies the
// previous piece out and a send never waits for the peer's receive; 64 KiB
// up to 1 MiB, 32 KiB above (deeper pipeline). Other transports: 128 KiB.
// Measured: docs/appendix/MEASUREMENTS.md, "The 64 KiB to 64 MiB band on UCX".
inline constexpr size_t kRingPieceBytes = 128 * 1024;
constexpr size_t ring_piece_bytes(size_t bytes, bool in_place) {
  if (!in_place) return kRingPieceBytes;
  return bytes <= 1024 * 1024 ? 64 * 1024 : 32 * 1024;
}

// A broadcast on an in-place transport goes from the root's buffer straight
// into each receiver's. From kBroadcastDirectMinBytes, where both ends copy
// directly (Transport::copies_direct; UCX on one host: cross-memory
// attach), the root writes the first broadcast_direct_share bytes into each
// receiver while the receiver reads the rest out of the root's buffer: each
// byte copied once, by two cores at once. Elsewhere in pieces of
// kBroadcastPieceBytes (eager, as the ring's) up to
// kBroadcastPiecedMaxBytes, and as one rendezvous message above. Rule: the
// split copy wins from 64 KiB at 2 ranks; below it the eager pieces do.
// Measured: docs/appendix/MEASUREMENTS.md, "Direct copies on one host".
inline constexpr size_t kBroadcastDirectMinBytes = 64 * 1024;
constexpr bool broadcast_may_copy_directly(size_t bytes) { return bytes >= kBroadcastDirectMinBytes; }
inline constexpr size_t kBroadcastPieceBytes = 64 * 1024;
inline constexpr size_t kBroadcastPiecedMaxBytes = 4 * 1024 * 1024;
constexpr size_t broadcast_piece_bytes(size_t bytes) {
  return bytes <= kBroadcastPiecedMaxBytes ? kBroadcastPieceBytes : bytes;
}
// The root's share of each receiver's buffer in a direct broadcast: 1/size,
// page-aligned down, so the root (size - 1 shares) and each receiver
// (size - 1 shares) copy alike.
constexpr size_t broadcast_direct_share(size_t bytes, int size) {
  return bytes / static_cast<size_t>(size) & ~size_t{4095};
}

// An all_reduce whose segments (its bytes / ranks) are at least
// kAllReduceDirectMinSegmentBytes, where every rank copies directly with
// every other: each rank reduces its segment in chunks of
// kAllReduceDirectChunkBytes read out of the peers' inputs and writes each
// reduced chunk into their outputs. Elsewhere, the ring. Rule: below 32 KiB
// per segment the ring's pipeline wins; the chunk size barely matters
// (128 KiB to 2 MiB alike). Measured: docs/appendix/MEASUREMENTS.md,
// "Direct copies on one host".
inline constexpr size_t kAllReduceDirectMinSegmentBytes = 32 * 1024;
// The size rule alone (algorithm_for reads it); the ranks' direct copies
// decide the rest.
constexpr bool all_reduce_may_copy_directly(size_t bytes, int size) {
  return bytes / static_cast<size_t>(size) >= kAllReduceDirectMinSegmentBytes;
}
inline constexpr size_t kAllReduceDirectChunkBytes = 256 * 1024;

// An all_gather of at least kAllGatherDirectMinBytes per rank, where every
// rank copies directly with every other: each rank reads every peer's block
// out of the peer's input, one copy per byte. Rule: from 8 KiB per rank at 2
// ranks one read beats the shared-memory slots' two copies and the
// exchange's (measured: docs/PERFORMANCE.md, "UCX against Open MPI").
inline constexpr size_t kAllGatherDirectMinBytes = 8 * 1024;

// bytes: the op's per-rank count (all_to_all: per block) times the element size.
// in_place: the transport sends in place (Transport::sends_in_place).
// kDirectCopies: each pair of ranks trades headers first and copies
// directly only where both ends can (Collectives); it is never chosen for a
// transport that does not send in place.
constexpr Algorithm algorithm_for(plugin::OpType type, size_t bytes, int size, bool in_place = false) {
  const bool exchange_fits = bytes != 0 && bytes * static_cast<size_t>(size) <= kExchangeMaxBytes;
  switch (type) {
    case plugin::OpType::kBarrier:
      return Algorithm::kBarrier;
    case plugin::OpType::kAllReduce:
    case plugin::OpType::kAllGather:
    case plugin::OpType::kReduceScatter:
    case plugin::OpType::kReduce:
      if (bytes == 0) return Algorithm::kNone;
      if (type == plugin::OpType::kAllGather && in_place && bytes >= kAllGatherDirectMinBytes) {
        return Algorithm::kDirectCopies;
      }
      if (exchange_fits) return Algorithm::kExchange;
      if (type == plugin::OpType::kAllReduce && in_place && all_reduce_may_copy_directly(bytes, size)) {
        return Algorithm::kDirectCopies;
      }
      if (type == plugin::OpType::kReduceScatter && in_place && bytes >= kAllReduceDirectMinSegmentBytes) {
        return Algorithm::kDirectCopies;  // its block is all_reduce's segment
      }
      return Algorithm::kPipelinedRing;
    case plugin::OpType::kAllToAll:
    case plugin::OpType::kGather:
    case plugin::OpType::kScatter:
      return exchange_fits ? Algorithm::kExchange : Algorithm::kNone;
    case plugin::OpType::kBroadcast:
      if (bytes == 0 || (bytes > kSyncPathMaxBytes && !in_place)) return Algorithm::kNone;
      return in_place && broadcast_may_copy_directly(bytes) ? Algorithm::kDirectCopies : Algorithm::kBroadcast;
    default:
      return Algorithm::kNone;
  }
}

// The name a backend's path table (describe()'s "paths") prints; empty for
// kNone. kDirectCopies names the copies; a backend whose rank does not copy
// directly with every peer names the fallback instead (fallback_of).
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
    case Algorithm::kDirectCopies:
      switch (type) {
        case plugin::OpType::kBroadcast: return "direct copies: root and receivers split";
        case plugin::OpType::kAllGather: return "direct copies: each rank reads every peer's block";
        case plugin::OpType::kReduceScatter: return "direct copies: each rank reduces its block";
        default: return "direct copies: each rank reduces its segment";
      }
    case Algorithm::kBroadcast: return "sync broadcast from root";
    case Algorithm::kBarrier: return "sync token exchange";
    case Algorithm::kNone: break;
  }
  return {};
}

// What kDirectCopies runs where some pair does not copy directly: the
// broadcast's pieces, the all_reduce's and reduce_scatter's ring, and the
// all_gather's exchange or ring by size. `bytes` and `size` as algorithm_for's.
constexpr Algorithm fallback_of(plugin::OpType type, Algorithm a, size_t bytes, int size) {
  if (a != Algorithm::kDirectCopies) return a;
  if (type == plugin::OpType::kBroadcast) return Algorithm::kBroadcast;
  return algorithm_for(type, bytes, size, /*in_place=*/false);
}

}  // namespace comms::cpu_algorithms
