// The zero-copy kernels (zero_copy_kernels.h): every rank's share run on
// its own thread over buffers of one process, as ranks run them over
// mapped peer memory. Each op, in place on no rank, every rank and only
// rank 0, at 2 and 3 ranks, with a count that spans several blocks and
// does not divide into cache lines; results compared byte for byte with
// the rank-order reduction computed here.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "plan.h"
#include "zero_copy_kernels.h"

namespace comms::cpu_algorithms {
namespace {

using plugin::OpType;

enum class InPlace { kNone, kAll, kRankZero };

struct Case {
  OpType type;
  DataType dtype;
  ReduceKind kind;
  int size;
  InPlace in_place;
  int root = 0;
};

std::string name_of(const Case& c) {
  return std::string(plugin::op_name(c.type)) + " " + std::string(to_string(c.dtype)) + " size " +
         std::to_string(c.size) + " in_place " + std::to_string(static_cast<int>(c.in_place)) + " root " +
         std::to_string(c.root);
}

bool is_reduction(OpType t) { return t == OpType::kAllReduce || t == OpType::kReduce || t == OpType::kReduceScatter; }

void run_case(const Case& c) {
  SCOPED_TRACE(name_of(c));
  const size_t n = static_cast<size_t>(c.size);
  const size_t count = 3 * kZeroCopyBlockBytes / 4 + 5;  // several blocks, not whole cache lines
  plugin::OpDesc op;
  op.type = c.type;
  op.dtype = c.dtype;
  op.count = count;
  op.root = c.root;
  op.reduce.kind = c.kind;
  op.reduce.scalar = 0.5;
  const size_t es = element_size(c.dtype), bytes = count * es;
  // Each rank's storage, its input and output inside it as the in-place
  // convention of plugin::OpDesc places them; inputs filled with small
  // integers every dtype holds exactly.
  std::vector<std::vector<unsigned char>> storage(n), original(n);
  std::vector<const void*> inputs(n);
  std::vector<void*> outputs(n);
  std::mt19937 rng(7);
  std::vector<std::vector<unsigned char>> input_copy(n);
  for (size_t r = 0; r < n; ++r) {
    const bool ip = c.in_place == InPlace::kAll || (c.in_place == InPlace::kRankZero && r == 0);
    const ZeroCopyNeeds need = zero_copy_needs(op, static_cast<int>(r), c.size);
    const size_t in_bytes = need.input_bytes ? need.input_bytes : bytes;
    const size_t out_bytes = need.output_bytes ? need.output_bytes : bytes;
    storage[r].assign(ip ? std::max(in_bytes, out_bytes) : in_bytes + out_bytes, 0xEE);
    unsigned char* base = storage[r].data();
    size_t in_at = 0, out_at = ip ? 0 : in_bytes;
    if (ip && c.type == OpType::kAllGather) in_at = r * bytes;
    if (ip && c.type == OpType::kReduceScatter) out_at = r * bytes;
    inputs[r] = base + in_at;
    outputs[r] = base + out_at;
    std::vector<unsigned char> in(in_bytes);
    for (size_t i = 0; i < in_bytes / es; ++i) {
      const int v = static_cast<int>(rng() % 50) + 1;
      switch (c.dtype) {
        case DataType::kFloat32: { float f = float(v); std::memcpy(&in[i * es], &f, es); break; }
        case DataType::kFloat64: { double d = v; std::memcpy(&in[i * es], &d, es); break; }
        case DataType::kInt32: { int32_t x = v; std::memcpy(&in[i * es], &x, es); break; }
        default: { uint8_t x = static_cast<uint8_t>(v); std::memcpy(&in[i * es], &x, es); break; }
      }
    }
    std::memcpy(base + in_at, in.data(), in_bytes);
    input_copy[r] = std::move(in);
    original[r] = storage[r];
  }
  // The expected output of each rank (empty: not checked).
  std::vector<std::vector<unsigned char>> want(n);
  auto reduced = [&](size_t at) {
    std::vector<unsigned char> v(bytes);
    const ReduceFn fn = reduction_of(op);
    fn(v.data(), input_copy[0].data() + at, input_copy[1].data() + at, count);
    for (size_t r = 2; r < n; ++r) fn(v.data(), v.data(), input_copy[r].data() + at, count);
    finish_reduction(op, v.data(), count, c.size);
    return v;
  };
  for (size_t r = 0; r < n; ++r) {
    switch (c.type) {
      case OpType::kAllReduce: want[r] = reduced(0); break;
      case OpType::kReduce: if (r == size_t(c.root)) want[r] = reduced(0); break;
      case OpType::kReduceScatter: want[r] = reduced(r * bytes); break;
      case OpType::kBroadcast: want[r] = input_copy[size_t(c.root)]; break;
      case OpType::kAllGather:
        for (size_t q = 0; q < n; ++q) want[r].insert(want[r].end(), input_copy[q].begin(), input_copy[q].end());
        break;
      default: FAIL();
    }
  }
  std::vector<std::thread> ranks;
  for (int r = 0; r < c.size; ++r) {
    ranks.emplace_back([&, r] { run_zero_copy_share(op, r, c.size, inputs.data(), outputs.data()); });
  }
  for (auto& t : ranks) t.join();
  for (size_t r = 0; r < n; ++r) {
    if (want[r].empty()) {
      // A reduce's non-root: its storage is untouched.
      EXPECT_EQ(storage[r], original[r]) << "rank " << r << "'s buffers changed";
      continue;
    }
    const auto* got = static_cast<const unsigned char*>(outputs[r]);
    for (size_t i = 0; i < want[r].size(); i += es) {
      if (std::memcmp(got + i, want[r].data() + i, es) != 0) {
        ADD_FAILURE() << "rank " << r << " element " << i / es << " differs";
        break;
      }
    }
  }
}

TEST(ZeroCopyKernels, EveryOpGivesTheRankOrderResultInPlaceOrNotOnEveryRank) {
  for (int size : {2, 3}) {
    for (InPlace ip : {InPlace::kNone, InPlace::kAll, InPlace::kRankZero}) {
      for (OpType t : {OpType::kAllReduce, OpType::kReduce, OpType::kReduceScatter, OpType::kAllGather,
                       OpType::kBroadcast}) {
        for (int root = 0; root < (t == OpType::kReduce || t == OpType::kBroadcast ? size : 1); ++root) {
          run_case({t, DataType::kFloat32, ReduceKind::kSum, size, ip, root});
        }
      }
    }
  }
}

TEST(ZeroCopyKernels, ReductionsOfEveryKindAndWidthMatchTheRankOrder) {
  for (int size : {2, 3}) {
    for (InPlace ip : {InPlace::kNone, InPlace::kAll, InPlace::kRankZero}) {
      run_case({OpType::kAllReduce, DataType::kFloat64, ReduceKind::kAvg, size, ip});
      run_case({OpType::kAllReduce, DataType::kInt32, ReduceKind::kMax, size, ip});
      run_case({OpType::kReduceScatter, DataType::kUint8, ReduceKind::kMin, size, ip});
      run_case({OpType::kReduceScatter, DataType::kFloat32, ReduceKind::kPremulSum, size, ip});
      run_case({OpType::kAllGather, DataType::kUint8, ReduceKind::kSum, size, ip});
    }
  }
}

TEST(ZeroCopyKernels, NeedsNameOnlyTheBuffersTheOpTouches) {
  plugin::OpDesc op;
  op.count = 10;
  op.dtype = DataType::kInt32;
  op.root = 1;
  op.type = OpType::kBroadcast;
  EXPECT_EQ(zero_copy_needs(op, 0, 3).input_bytes, 0u);
  EXPECT_EQ(zero_copy_needs(op, 1, 3).input_bytes, 40u);
  op.type = OpType::kReduce;
  EXPECT_EQ(zero_copy_needs(op, 0, 3).output_bytes, 0u);
  EXPECT_EQ(zero_copy_needs(op, 1, 3).output_bytes, 40u);
  op.type = OpType::kReduceScatter;
  EXPECT_EQ(zero_copy_needs(op, 2, 3).input_bytes, 120u);
  op.type = OpType::kAllGather;
  EXPECT_EQ(zero_copy_needs(op, 2, 3).output_bytes, 120u);
  EXPECT_FALSE(zero_copy_kernel_exists(OpType::kAllToAll));
}

}  // namespace
}  // namespace comms::cpu_algorithms
