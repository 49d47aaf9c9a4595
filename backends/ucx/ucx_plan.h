// The UCX backend's plan: the one place that picks the path every op takes
// (the backend runs what it says), and its names for describe()'s "paths".
//
//   send, receive and batches: UCP tag send/recv;
//   a one-rank comm: local copies;
//   all_reduce on a comm over several hosts, some with more than one rank,
//     outside kFlatAcrossHosts{Min,Max}Bytes (hierarchical.h): inside each
//     host, one exchange between hosts; all_gather there too, up to
//     kHierarchicalAllGatherMaxBytes, where every host has as many ranks;
//   barrier, and all_reduce, all_gather, reduce_scatter and broadcast whose
//     data per rank fits the shared-memory path's limit and which the CPU
//     algorithms would run as a direct exchange (or broadcast from the
//     root), when every rank is on this host: the shared-memory collectives
//     (shm_collectives.h), which need no messages;
//   other ops the CPU algorithms take (algorithms.h, on a transport that
//     sends in place): Collectives, with direct copies where the size rules
//     say so;
//   the rest (v-variants, lists, large all_to_all, gather, scatter): the
//     pairwise exchange (vector_collectives.h);
//   and, before any of these, the zero-copy path (zero_copy.h) for
//     all_reduce, reduce, reduce_scatter, all_gather and broadcast from
//     zero_copy_min_bytes per rank, on one host with the shared-memory
//     collectives: it runs the op where every rank's buffers are the comm's
//     allocations (which only the op's buffers tell, so the plan says "try
//     it first"), else every rank takes the path above.
#pragma once

#include <cstddef>
#include <string_view>

#include <string>

#include "algorithms.h"
#include "comms/plugin.h"
#include "plan.h"
#include "zero_copy_kernels.h"

namespace comms::ucx_backend {

using cpu_algorithms::Algorithm;
using cpu_algorithms::Path;
using cpu_algorithms::Plan;

// The most bytes a rank puts in its shared-memory slot per op
// (reduce_scatter: its whole input). It bounds the segment
// (ShmCollectives::kDepth slots per rank); it was not tuned by measurement
// (docs/DESIGN.md, "UCX: small collectives through shared memory").
inline constexpr size_t kShmMaxBytes = 16 * 1024;

// An all_reduce over several hosts takes the hierarchical path
// (hierarchical.h) except between these per-rank sizes, where the flat
// algorithms run. Rule: there the flat pipelined ring, one pipeline over
// every rank, beat the hierarchy's three phases in turn; below it the
// hierarchy sends one message across hosts where the flat exchange sends
// one per pair of ranks, above it half the bytes cross. Measured:
// docs/PERFORMANCE.md, "Two hosts".
inline constexpr size_t kFlatAcrossHostsMinBytes = 128 * 1024;
inline constexpr size_t kFlatAcrossHostsMaxBytes = 256 * 1024;
constexpr bool hierarchical_size(size_t bytes) {
  return bytes != 0 && (bytes < kFlatAcrossHostsMinBytes || bytes > kFlatAcrossHostsMaxBytes);
}

// An all_gather over several hosts of equal size takes the hierarchical
// path up to this size per rank. Rule: up to it one message per host
// crosses instead of one per pair of ranks, and the small ops' time is
// their messages; from 64 KiB per rank the flat ring, one pipeline over
// every rank, was as fast or faster (docs/PERFORMANCE.md, "Two hosts").
inline constexpr size_t kHierarchicalAllGatherMaxBytes = 16 * 1024;

// What a UCX comm's plan reads besides the op, fixed when it connects.
struct UcxShape {
  int size = 1;
  // The shared-memory path's limit per rank (kShmMaxBytes), or 0 where the
  // comm has none.
  size_t shm_max_bytes = 0;
  // This rank copies directly with every peer (UcxTransport::copies_direct).
  // Names only: where it does not, kDirectCopies runs its fallback.
  bool copies_direct = false;
  // The ranks span several hosts and some host has several
  // (cpu_algorithms::spans_hosts_with_neighbours).
  bool hierarchical = false;
  // hierarchical, and every host has as many ranks
  // (cpu_algorithms::hosts_of_equal_size).
  bool hierarchical_all_gather = false;
  // The comm has the zero-copy path (it needs the shared-memory
  // collectives), and the smallest op it tries there (bytes per rank;
  // COMMS_UCX_ZERO_COPY_MIN_BYTES).
  bool zero_copy = false;
  size_t zero_copy_min_bytes = 0;
};

constexpr Plan usual_plan(plugin::OpType type, size_t bytes, const UcxShape& comm);

// The path of an op of `bytes` per rank (cpu_algorithms::bytes_of).
constexpr Plan plan(plugin::OpType type, size_t bytes, const UcxShape& comm) {
  Plan p = usual_plan(type, bytes, comm);
  p.zero_copy_first = comm.zero_copy && bytes != 0 && bytes >= comm.zero_copy_min_bytes &&
                      cpu_algorithms::zero_copy_kernel_exists(type) && p.path != Path::kOneRank;
  return p;
}

// Where an op goes when the zero-copy path does not take it.
constexpr Plan usual_plan(plugin::OpType type, size_t bytes, const UcxShape& comm) {
  using plugin::OpType;
  if (type == OpType::kSend || type == OpType::kRecv || type == OpType::kBatchP2P) return {Path::kPointToPoint};
  if (comm.size == 1) return {Path::kOneRank};
  if (comm.hierarchical && type == OpType::kAllReduce && hierarchical_size(bytes)) return {Path::kHierarchical};
  if (comm.hierarchical_all_gather && type == OpType::kAllGather && bytes != 0 &&
      bytes <= kHierarchicalAllGatherMaxBytes) {
    return {Path::kHierarchical};
  }
  const Algorithm a = cpu_algorithms::algorithm_for(type, bytes, comm.size, /*in_place=*/true);
  if (comm.shm_max_bytes != 0) {
    const size_t n = static_cast<size_t>(comm.size);
    const bool shm = type == OpType::kBarrier ||
                     (type == OpType::kBroadcast && a != Algorithm::kNone && bytes <= comm.shm_max_bytes) ||
                     ((type == OpType::kAllReduce || type == OpType::kAllGather) && a == Algorithm::kExchange &&
                      bytes <= comm.shm_max_bytes) ||
                     (type == OpType::kReduceScatter && a == Algorithm::kExchange && bytes * n <= comm.shm_max_bytes);
    if (shm) return {Path::kShm};
  }
  return a != Algorithm::kNone ? Plan{Path::kCollectives, a} : Plan{Path::kPairwise};
}

constexpr std::string_view usual_path_name(plugin::OpType type, size_t bytes, Plan p, const UcxShape& comm) {
  switch (p.path) {
    case Path::kPointToPoint: return "ucp tag send/recv";
    case Path::kOneRank: return "one-rank copy";
    case Path::kShm: return "shm";
    case Path::kHierarchical:
      return type == plugin::OpType::kAllGather
                 ? "hierarchical: all_gather in each host, all_gather between hosts, broadcast"
                 : "hierarchical: reduce in each host, all_reduce between hosts, broadcast";
    case Path::kCollectives:
      return cpu_algorithms::algorithm_name(
          type, comm.copies_direct ? p.algorithm : cpu_algorithms::fallback_of(type, p.algorithm, bytes, comm.size));
    default: return "pairwise exchange";
  }
}

// describe()'s name of the plan's path (comms-bench's algorithm column).
inline std::string path_name(plugin::OpType type, size_t bytes, Plan p, const UcxShape& comm) {
  const std::string_view usual = usual_path_name(type, bytes, p, comm);
  if (!p.zero_copy_first) return std::string(usual);
  return "zero-copy where every rank's buffers are the comm's memory, else " + std::string(usual);
}

}  // namespace comms::ucx_backend
