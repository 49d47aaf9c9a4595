// One rank's share of a collective whose every buffer, every rank's, is
// addressable in this process: the same traffic as comms-bench's floor
// (tools/comms-bench/floor.cc), done by the ranks' own threads. Each rank
// reads its 1/size of every input once and writes the result straight into
// every output that needs it: no staging, no kernel copy.
//
// The buffers may be peers' memory mapped into this process (the UCX
// backend's zero-copy path over host-shared allocations) or a per-comm
// shared scratch that ranks copied ordinary buffers into (a staged path):
// nothing here knows where they came from, nor waits on anyone. The caller
// makes sure every rank's buffers are ready before any rank starts, and
// that no rank returns before every rank has finished its share.
//
// Shares are split at cache lines, so no two ranks write one line, and
// worked in kBlockBytes blocks, so a block read once serves every
// destination from cache. In place (input and output alias, on some ranks
// or all) is safe: a block of every input is read before that block is
// written anywhere. Reductions run in rank order, whatever this rank's
// own, as Collectives::all_reduce does: the same bits on every rank and on
// every path.
#pragma once

#include <cstddef>

#include "comms/plugin.h"

namespace comms::cpu_algorithms {

inline constexpr size_t kZeroCopyBlockBytes = 32 * 1024;

// The ops these kernels run: all_reduce, reduce, reduce_scatter,
// all_gather and broadcast.
constexpr bool zero_copy_kernel_exists(plugin::OpType type) {
  using plugin::OpType;
  return type == OpType::kAllReduce || type == OpType::kReduce || type == OpType::kReduceScatter ||
         type == OpType::kAllGather || type == OpType::kBroadcast;
}

// What `rank` must make addressable for an op of this shape (count, dtype,
// root as in plugin::OpDesc): bytes of its input and of its output, 0 where
// the op never touches that buffer on that rank (a broadcast's non-root
// input, a reduce's non-root output).
struct ZeroCopyNeeds {
  size_t input_bytes = 0;
  size_t output_bytes = 0;
};
ZeroCopyNeeds zero_copy_needs(const plugin::OpDesc& op, int rank, int size);

// Rank `rank`'s share of `op` (its type, count, dtype, reduce and root;
// its input and output pointers are not read): inputs[r] and outputs[r]
// are rank r's buffers as this process addresses them (null where
// zero_copy_needs says the op does not touch it). Throws
// std::invalid_argument for a missing reduction.
void run_zero_copy_share(const plugin::OpDesc& op, int rank, int size, const void* const* inputs,
                         void* const* outputs);

}  // namespace comms::cpu_algorithms
