#include "zero_copy_kernels.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "plan.h"

namespace comms::cpu_algorithms {

using plugin::OpType;

namespace {

constexpr size_t kLine = 64;

// Sources copied or reduced (in rank order) into every destination, all at
// the same element offsets.
struct Piece {
  std::vector<const unsigned char*> srcs;
  std::vector<unsigned char*> dsts;
};

bool overlaps(const unsigned char* a, const unsigned char* b, size_t bytes) {
  return a < b + bytes && b < a + bytes;
}

class Share {
 public:
  // fn: the reduction, or null for copies.
  Share(const plugin::OpDesc& op, int size, ReduceFn fn) : op_(op), size_(size), es_(element_size(op.dtype)), fn_(fn) {}

  // Elements [begin, end) of every piece, in blocks.
  void run(const std::vector<Piece>& pieces, size_t begin, size_t end) {
    const size_t block = std::max<size_t>(1, kZeroCopyBlockBytes / es_);
    for (const Piece& p : pieces) {
      for (size_t b = begin; b < end; b += block) {
        const size_t k = std::min(block, end - b);
        if (fn_) reduce_block(p, b * es_, k);
        else copy_block(p, b * es_, k * es_);
      }
    }
  }

 private:
  void copy_block(const Piece& p, size_t off, size_t bytes) const {
    const unsigned char* src = p.srcs[0] + off;
    for (unsigned char* d : p.dsts) {
      if (d + off != src) std::memmove(d + off, src, bytes);
    }
  }

  // The sum goes first into a destination that no later source overlaps
  // (fn writes out[i] after reading a[i] and b[i], so out may alias the
  // first two), else into a scratch block; then into every other
  // destination. Every source of the block is read before any
  // destination other than that first one is written.
  void reduce_block(const Piece& p, size_t off, size_t k) {
    const size_t bytes = k * es_;
    unsigned char* first = nullptr;
    for (unsigned char* d : p.dsts) {
      bool clear = true;
      for (size_t j = 2; j < p.srcs.size() && clear; ++j) clear = !overlaps(d + off, p.srcs[j] + off, bytes);
      if (clear) {
        first = d + off;
        break;
      }
    }
    if (!first) {
      if (!scratch_) scratch_.reset(new (std::align_val_t{kLine}) unsigned char[kZeroCopyBlockBytes]);
      first = scratch_.get();
    }
    if (p.srcs.size() == 1) {
      if (first != p.srcs[0] + off) std::memmove(first, p.srcs[0] + off, bytes);
    } else {
      fn_(first, p.srcs[0] + off, p.srcs[1] + off, k);
      for (size_t j = 2; j < p.srcs.size(); ++j) fn_(first, first, p.srcs[j] + off, k);
    }
    finish_reduction(op_, first, k, size_);
    for (unsigned char* d : p.dsts) {
      if (d + off != first) std::memcpy(d + off, first, bytes);
    }
  }

  struct AlignedDelete {
    void operator()(unsigned char* p) const { ::operator delete[](p, std::align_val_t{kLine}); }
  };
  const plugin::OpDesc& op_;
  const int size_;
  const size_t es_;
  const ReduceFn fn_;
  std::unique_ptr<unsigned char[], AlignedDelete> scratch_;
};

}  // namespace

ZeroCopyNeeds zero_copy_needs(const plugin::OpDesc& op, int rank, int size) {
  const size_t bytes = op.count * element_size(op.dtype), n = static_cast<size_t>(size);
  const bool root = rank == op.root;
  switch (op.type) {
    case OpType::kAllReduce: return {bytes, bytes};
    case OpType::kReduceScatter: return {bytes * n, bytes};
    case OpType::kAllGather: return {bytes, bytes * n};
    case OpType::kBroadcast: return {root ? bytes : 0, bytes};
    case OpType::kReduce: return {bytes, root ? bytes : 0};
    default: throw std::logic_error("no zero-copy kernel for this op");
  }
}

void run_zero_copy_share(const plugin::OpDesc& op, int rank, int size, const void* const* inputs,
                         void* const* outputs) {
  const size_t n = static_cast<size_t>(size), es = element_size(op.dtype), bytes = op.count * es;
  auto in = [&](size_t r, size_t at = 0) { return static_cast<const unsigned char*>(inputs[r]) + at; };
  auto out = [&](size_t r, size_t at = 0) { return static_cast<unsigned char*>(outputs[r]) + at; };
  auto all_in = [&](size_t at) {
    std::vector<const unsigned char*> v(n);
    for (size_t r = 0; r < n; ++r) v[r] = in(r, at);
    return v;
  };
  const bool reduce = op.type == OpType::kAllReduce || op.type == OpType::kReduce || op.type == OpType::kReduceScatter;
  const ReduceFn fn = reduce ? reduction_of(op) : nullptr;  // on every rank, whether its share is empty or not
  std::vector<Piece> pieces;
  switch (op.type) {
    case OpType::kAllReduce:
      pieces.push_back({all_in(0), {}});
      for (size_t r = 0; r < n; ++r) pieces.back().dsts.push_back(out(r));
      break;
    case OpType::kReduce:
      pieces.push_back({all_in(0), {out(static_cast<size_t>(op.root))}});
      break;
    case OpType::kReduceScatter:
      for (size_t j = 0; j < n; ++j) pieces.push_back({all_in(j * bytes), {out(j)}});
      break;
    case OpType::kAllGather:
      for (size_t j = 0; j < n; ++j) {
        pieces.push_back({{in(j)}, {}});
        for (size_t r = 0; r < n; ++r) pieces.back().dsts.push_back(out(r, j * bytes));
      }
      break;
    case OpType::kBroadcast:
      pieces.push_back({{in(static_cast<size_t>(op.root))}, {}});
      for (size_t r = 0; r < n; ++r) pieces.back().dsts.push_back(out(r));
      break;
    default: throw std::logic_error("no zero-copy kernel for this op");
  }
  // This rank's elements of each piece: whole cache lines, as the floor
  // splits them between its threads.
  const size_t unit = std::max<size_t>(1, kLine / es);
  const size_t units = (op.count + unit - 1) / unit, r = static_cast<size_t>(rank);
  const size_t begin = std::min(op.count, units * r / n * unit);
  const size_t end = std::min(op.count, units * (r + 1) / n * unit);
  if (begin >= end) return;
  Share(op, size, fn).run(pieces, begin, end);
}

}  // namespace comms::cpu_algorithms
