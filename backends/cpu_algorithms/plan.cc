#include "plan.h"

#include <cstring>
#include <stdexcept>
#include <vector>

namespace comms::cpu_algorithms {

using plugin::OpType;

void throw_no_reduction() { throw std::invalid_argument("no reduction for this dtype and kind"); }

void finish_reduction(const plugin::OpDesc& op, void* data, size_t n, int size) {
  if (op.reduce.kind == ReduceKind::kAvg) divide(data, op.dtype, n, size);
  else if (op.reduce.kind == ReduceKind::kPremulSum) scale(data, op.dtype, n, op.reduce.scalar);
}

void run_on_one_rank(const plugin::OpDesc& op) {
  const size_t es = element_size(op.dtype);
  auto copy = [](void* dst, const void* src, size_t n) {
    if (dst != src && n) std::memmove(dst, src, n);
  };
  switch (op.type) {
    case OpType::kAllReduce:
    case OpType::kReduce:
    case OpType::kReduceScatter:
      if (op.output) {
        copy(op.output, op.input, op.count * es);
        finish_reduction(op, op.output, op.count, 1);
      }
      return;
    case OpType::kReduceScatterV:
      copy(op.output, op.input, op.counts[0] * es);
      finish_reduction(op, op.output, op.counts[0], 1);
      return;
    case OpType::kAllGather:
    case OpType::kGather:
    case OpType::kScatter:
    case OpType::kAllToAll:
      return copy(op.output, op.input, op.count * es);
    case OpType::kAllGatherList:
      return copy(op.output_list[0], op.input, op.count * es);
    case OpType::kAllGatherV:
    case OpType::kAllToAllV:
      return copy(op.output, op.input, op.counts[0] * es);
    case OpType::kSend:
    case OpType::kRecv:
      throw std::invalid_argument("point-to-point needs a peer");
    case OpType::kBroadcast:
    case OpType::kBarrier:
    case OpType::kBatchP2P:  // validated: no peer but self exists, so empty
      return;
  }
}

void run_collective(Collectives& collectives, Algorithm a, const plugin::OpDesc& op) {
  const int size = collectives.size();
  const size_t es = element_size(op.dtype);
  const size_t bytes = op.count * es;
  switch (op.type) {
    case OpType::kBarrier: return collectives.barrier();
    case OpType::kBroadcast: return collectives.broadcast(a, op.input, op.output, bytes, op.root);
    case OpType::kAllReduce:
      collectives.all_reduce(a, op.input, op.output, op.count, es, reduction_of(op));
      return finish_reduction(op, op.output, op.count, size);
    case OpType::kReduce:
      collectives.reduce(a, op.input, op.output, op.count, es, reduction_of(op), op.root);
      if (collectives.rank() == op.root) finish_reduction(op, op.output, op.count, size);
      return;
    case OpType::kReduceScatter:
      collectives.reduce_scatter(a, op.input, op.output, op.count, es, reduction_of(op));
      return finish_reduction(op, op.output, op.count, size);
    case OpType::kAllGather: return collectives.all_gather(a, op.input, op.output, bytes);
    case OpType::kAllToAll: return collectives.all_to_all(op.input, op.output, bytes);
    case OpType::kGather: return collectives.gather(op.input, op.output, bytes, op.root);
    case OpType::kScatter: return collectives.scatter(op.input, op.output, bytes, op.root);
    default: throw std::logic_error("no Collectives algorithm for this op");
  }
}

void run_pairwise(VectorCollectives& pairwise, const plugin::OpDesc& op) {
  const auto deadline = Clock::now() + op.timeout;
  const size_t size = static_cast<size_t>(pairwise.size());
  const size_t es = element_size(op.dtype);
  const size_t bytes = op.count * es;
  auto to_bytes = [es](std::span<const size_t> counts) {
    std::vector<size_t> b(counts.size());
    for (size_t i = 0; i < counts.size(); ++i) b[i] = counts[i] * es;
    return b;
  };
  switch (op.type) {
    case OpType::kAllReduce:
    case OpType::kReduce:
    case OpType::kReduceScatter:
    case OpType::kAllGather:
      return;  // count 0: the plans give every other size to Collectives
    case OpType::kBroadcast:
      if (!bytes) return;
      if (pairwise.rank() == op.root && op.output != op.input) std::memmove(op.output, op.input, bytes);
      return pairwise.broadcast(op.output, bytes, op.root, deadline);
    case OpType::kAllGatherList: return pairwise.all_gather_list(op.input, op.output_list, bytes, deadline);
    case OpType::kAllGatherV: return pairwise.all_gather_v(op.input, op.output, to_bytes(op.counts), deadline);
    case OpType::kReduceScatterV: {
      pairwise.reduce_scatter_v(op.input, op.output, op.counts, es, reduction_of(op), deadline);
      const size_t mine = op.counts[static_cast<size_t>(pairwise.rank())];
      if (mine) finish_reduction(op, op.output, mine, static_cast<int>(size));
      return;
    }
    case OpType::kAllToAll: {
      const std::vector<size_t> blocks(size, bytes);
      return pairwise.all_to_all_v(op.input, op.output, blocks, blocks, deadline);
    }
    case OpType::kAllToAllV:
      return pairwise.all_to_all_v(op.input, op.output, to_bytes(op.counts), to_bytes(op.output_counts), deadline);
    case OpType::kGather: return bytes ? pairwise.gather(op.input, op.output, bytes, op.root, deadline) : void();
    case OpType::kScatter: return bytes ? pairwise.scatter(op.input, op.output, bytes, op.root, deadline) : void();
    default: throw std::logic_error("no CPU algorithm for this op");
  }
}

}  // namespace comms::cpu_algorithms
