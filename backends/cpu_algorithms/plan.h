// How a CPU backend runs one op. Each backend picks the op's path once, in
// its plan function (the Gloo backend's in backends/gloo/op_rules.h, the UCX
// backend's in backends/ucx/ucx_plan.h), from the size rules of
// algorithms.h and what its comm has (ranks, a sync mesh, shared memory,
// direct copies); the chosen Plan is passed down to the runners below,
// which decide nothing themselves.
#pragma once

#include <cstddef>
#include <cstdint>

#include "algorithms.h"
#include "collectives.h"
#include "comms/plugin.h"
#include "reductions.h"
#include "vector_collectives.h"

namespace comms::cpu_algorithms {

enum class Path : uint8_t {
  kOneRank,       // a one-rank comm: local copies (run_on_one_rank)
  kCollectives,   // Collectives, with Plan::algorithm (run_collective)
  kPairwise,      // VectorCollectives' pairwise exchange (run_pairwise)
  kShm,           // UCX: the shared-memory collectives beside the transport
  kGlooNative,    // Gloo: its options-style collectives on the async mesh
  kPointToPoint,  // the backend's own send and receive
  kHierarchical,  // UCX across hosts: inside each host, then between leaders (hierarchical.h)
};

struct Plan {
  Path path = Path::kOneRank;
  Algorithm algorithm = Algorithm::kNone;  // for kCollectives
  // UCX: first the zero-copy path (backends/ucx/zero_copy.h), which runs
  // the op when every rank's buffers lie in the comm's allocations and
  // otherwise, alike on every rank, leaves it to path and algorithm.
  bool zero_copy_first = false;
};

// The bytes the plans and algorithm_for read: the op's per-rank count
// (all_to_all: per block) times the element size.
inline size_t bytes_of(const plugin::OpDesc& op) { return op.count * element_size(op.dtype); }

// The kernel of a reducing op (all_reduce, reduce, reduce_scatter(_v)).
// Throws std::invalid_argument where the dtype has no such reduction:
// libcomms asks supports_reduction first, so only a caller below it sees this.
[[noreturn, gnu::cold]] void throw_no_reduction();
inline ReduceFn reduction_of(const plugin::OpDesc& op) {
  const ReduceFn fn = reduce_fn(op.dtype, op.reduce.kind);
  if (!fn) throw_no_reduction();
  return fn;
}

// avg divides by size, premul_sum scales: after the sum.
void finish_reduction(const plugin::OpDesc& op, void* data, size_t n, int size);

// Path::kOneRank: a copy (plus the avg/premul finish), or nothing for
// broadcast, barrier and an empty batch. Throws std::invalid_argument for a
// send or receive (no peer exists).
void run_on_one_rank(const plugin::OpDesc& op);

// Path::kCollectives, with the avg/premul finish; the caller set the op's
// timeout on `collectives`. Throws TransportError, CountMismatch, or
// std::invalid_argument for a missing reduction.
void run_collective(Collectives& collectives, Algorithm a, const plugin::OpDesc& op);

// Path::kPairwise: every other collective, with op.timeout as its deadline.
// Throws TransportError, or std::invalid_argument for a missing reduction.
void run_pairwise(VectorCollectives& vector, const plugin::OpDesc& op);

}  // namespace comms::cpu_algorithms
