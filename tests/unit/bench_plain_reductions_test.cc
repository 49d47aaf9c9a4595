// comms-bench's own reduction loops (tools/comms-bench/plain_reductions.h),
// which the floor and --gloo-native reduce with, compute what comms'
// reductions define, in the cases the floor's own tests do not reach: bool,
// 16-bit floats, integer wrap-around, the in-place shape and the finish of
// avg and premul_sum.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "comms/numeric.h"
#include "plain_reductions.h"

namespace comms::bench {
namespace {

TEST(BenchPlainReductions, BoolReducesAsLogicalOrAndAndXor) {
  const std::vector<uint8_t> a = {0, 0, 1, 2}, b = {0, 3, 0, 1};
  auto reduced = [&](ReduceKind k) {
    std::vector<uint8_t> out(4);
    plain_reduce_fn(DataType::kBool, k)(out.data(), a.data(), b.data(), 4);
    return out;
  };
  EXPECT_EQ(reduced(ReduceKind::kSum), (std::vector<uint8_t>{0, 1, 1, 1}));
  EXPECT_EQ(reduced(ReduceKind::kMax), (std::vector<uint8_t>{0, 1, 1, 1}));
  EXPECT_EQ(reduced(ReduceKind::kProduct), (std::vector<uint8_t>{0, 0, 0, 1}));
  EXPECT_EQ(reduced(ReduceKind::kBand), (std::vector<uint8_t>{0, 0, 0, 1}));
  EXPECT_EQ(reduced(ReduceKind::kBxor), (std::vector<uint8_t>{0, 1, 1, 0}));
}

TEST(BenchPlainReductions, IntegersWrapAndBitwiseOpsExistOnlyForThem) {
  const std::vector<int8_t> a = {127, -128, 0x0f}, b = {1, -1, 0x3c};
  std::vector<int8_t> out(3);
  plain_reduce_fn(DataType::kInt8, ReduceKind::kSum)(out.data(), a.data(), b.data(), 3);
  EXPECT_EQ(out, (std::vector<int8_t>{-128, 127, 0x4b}));
  plain_reduce_fn(DataType::kInt8, ReduceKind::kBxor)(out.data(), a.data(), b.data(), 3);
  EXPECT_EQ(out[2], 0x33);
  const std::vector<int64_t> big = {INT64_MAX}, two = {2};
  std::vector<int64_t> product(1);
  plain_reduce_fn(DataType::kInt64, ReduceKind::kProduct)(product.data(), big.data(), two.data(), 1);
  EXPECT_EQ(product[0], -2);
  EXPECT_EQ(plain_reduce_fn(DataType::kFloat32, ReduceKind::kBand), nullptr);
  EXPECT_EQ(plain_reduce_fn(DataType::kBfloat16, ReduceKind::kBor), nullptr);
}

TEST(BenchPlainReductions, SixteenBitFloatsReduceInFloatAndRoundBack) {
  const std::vector<uint16_t> a = {numeric::float_to_half(1.5f), numeric::float_to_half(-2.0f)};
  const std::vector<uint16_t> b = {numeric::float_to_half(0.25f), numeric::float_to_half(3.0f)};
  std::vector<uint16_t> out(2);
  plain_reduce_fn(DataType::kFloat16, ReduceKind::kMin)(out.data(), a.data(), b.data(), 2);
  EXPECT_EQ(numeric::half_to_float(out[0]), 0.25f);
  EXPECT_EQ(numeric::half_to_float(out[1]), -2.0f);
}

TEST(BenchPlainReductions, TheInPlaceShapeReducesIntoItsFirstArgument) {
  // Long enough for the vectorized body and a scalar tail.
  std::vector<uint32_t> x(37), y(37);
  for (size_t i = 0; i < x.size(); ++i) {
    const float fx = float(i), fy = 0.5f * float(i);
    std::memcpy(&x[i], &fx, 4);
    std::memcpy(&y[i], &fy, 4);
  }
  plain_in_place_fn<uint32_t>(DataType::kFloat32, ReduceKind::kSum)(x.data(), y.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    float got;
    std::memcpy(&got, &x[i], 4);
    EXPECT_EQ(got, 1.5f * float(i)) << "index " << i;
  }
  EXPECT_EQ(plain_in_place_fn<uint16_t>(DataType::kFloat32, ReduceKind::kSum), nullptr) << "wrong width";
}

TEST(BenchPlainReductions, AvgAndPremulSumFinishTheSum) {
  std::vector<int32_t> ints = {7, -7, 9};
  finish_reduction(ints.data(), DataType::kInt32, 3, ReduceOp::avg(), 2);
  EXPECT_EQ(ints, (std::vector<int32_t>{3, -3, 4})) << "integers truncate toward zero";
  std::vector<double> doubles = {1.0, 4.0};
  finish_reduction(doubles.data(), DataType::kFloat64, 2, ReduceOp::premul_sum(0.5), 4);
  EXPECT_EQ(doubles, (std::vector<double>{0.5, 2.0}));
  std::vector<uint16_t> bf = {numeric::float_to_bf16(6.0f)};
  finish_reduction(bf.data(), DataType::kBfloat16, 1, ReduceOp::avg(), 3);
  EXPECT_EQ(numeric::bf16_to_float(bf[0]), 2.0f);
  std::vector<float> untouched = {5.0f};
  finish_reduction(untouched.data(), DataType::kFloat32, 1, ReduceOp::sum(), 2);
  EXPECT_EQ(untouched[0], 5.0f);
}

}  // namespace
}  // namespace comms::bench
