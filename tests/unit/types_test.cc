#include <gtest/gtest.h>

#include <cmath>

#include "comms/comms.h"
#include "comms/numeric.h"
#include "config/env.h"

namespace comms {
namespace {

TEST(Device, ParsesCpuAndCudaWithOrWithoutIndex) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse(" CUDA "), Device::cuda());
  EXPECT_EQ(Device::parse("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device::parse("cuda:3").to_string(), "cuda:3");
  EXPECT_EQ(Device::parse("cpu:0"), Device::cpu());
  EXPECT_EQ(Device::cuda().to_string(), "cuda");
}

TEST(Device, RejectsUnknownTypesAndBadIndicesWithAReason) {
  for (const char* bad : {"tpu", "cuda:", "cuda:-1", "cuda:x", "cpu:1", ""}) {
    try {
      Device::parse(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << bad;
      EXPECT_NE(std::string(e.what()).find("'" + std::string(bad) + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(DataType, NamesRoundTripAndAliasesParse) {
  for (int i = 0; i < kNumDataTypes; ++i) {
    auto t = static_cast<DataType>(i);
    EXPECT_EQ(parse_data_type(to_string(t)), t) << to_string(t);
  }
  EXPECT_EQ(parse_data_type("float"), DataType::kFloat32);
  EXPECT_EQ(parse_data_type("BF16"), DataType::kBfloat16);
  EXPECT_THROW(parse_data_type("float128"), Error);
  EXPECT_EQ(element_size(DataType::kBfloat16), 2u);
  EXPECT_EQ(element_size(DataType::kFloat8E5M2), 1u);
  EXPECT_EQ(data_type_of<int64_t>(), DataType::kInt64);
  EXPECT_EQ(BufferView::of(static_cast<const double*>(nullptr), 0).dtype, DataType::kFloat64);
}

TEST(ReduceOp, ParsesEveryKindAndPremulFactor) {
  for (int i = 0; i < kNumReduceKinds; ++i) {
    auto k = static_cast<ReduceKind>(i);
    if (k == ReduceKind::kPremulSum) continue;
    EXPECT_EQ(parse_reduce_op(to_string(k)).kind, k);
  }
  EXPECT_EQ(parse_reduce_op("prod").kind, ReduceKind::kProduct);
  auto p = parse_reduce_op("premul_sum:0.25");
  EXPECT_EQ(p.kind, ReduceKind::kPremulSum);
  EXPECT_DOUBLE_EQ(p.scalar, 0.25);
  EXPECT_THROW(parse_reduce_op("premul_sum:x"), Error);
  EXPECT_THROW(parse_reduce_op("mean"), Error);
}

TEST(ReduceOp, DefinednessFollowsTheTypeFamily) {
  EXPECT_FALSE(reduction_defined(DataType::kFloat32, ReduceKind::kBxor));
  EXPECT_TRUE(reduction_defined(DataType::kInt8, ReduceKind::kBxor));
  EXPECT_TRUE(reduction_defined(DataType::kBool, ReduceKind::kBand));
  EXPECT_FALSE(reduction_defined(DataType::kBool, ReduceKind::kAvg));
  EXPECT_TRUE(reduction_defined(DataType::kFloat8E4M3, ReduceKind::kPremulSum));
}

TEST(Numeric, HalfAndBfloat16RoundToNearestEven) {
  EXPECT_EQ(numeric::float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(numeric::half_to_float(0x3c00), 1.0f);
  EXPECT_EQ(numeric::float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(numeric::float_to_half(1e6f), 0x7c00);  // overflow -> inf
  EXPECT_EQ(numeric::half_to_float(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  // 1 + 2^-11 is halfway between two halves: ties to even (1.0).
  EXPECT_EQ(numeric::float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(numeric::float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(numeric::bf16_to_float(0x4049), 3.140625f);
  for (uint32_t h = 0; h < 0x7c00; h += 7) {
    EXPECT_EQ(numeric::float_to_half(numeric::half_to_float(static_cast<uint16_t>(h))), h);
  }
}

TEST(Numeric, Fp8RoundTripsEveryFiniteCodeAndSaturates) {
  for (int c = 0; c < 256; ++c) {
    const float e4 = numeric::fp8_e4m3_to_float(static_cast<uint8_t>(c));
    if (!std::isnan(e4)) {
      EXPECT_EQ(numeric::float_to_fp8_e4m3(e4), c) << c;
    }
    const float e5 = numeric::fp8_e5m2_to_float(static_cast<uint8_t>(c));
    if (std::isfinite(e5)) {
      EXPECT_EQ(numeric::float_to_fp8_e5m2(e5), c) << c;
    }
  }
  EXPECT_EQ(numeric::fp8_e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(numeric::float_to_fp8_e4m3(1000.0f), 0x7e);
  EXPECT_EQ(numeric::float_to_fp8_e4m3(-1000.0f), 0xfe);
  EXPECT_EQ(numeric::fp8_e5m2_to_float(0x7b), 57344.0f);
  EXPECT_EQ(numeric::float_to_fp8_e5m2(1e9f), 0x7b);
  EXPECT_TRUE(std::isnan(numeric::fp8_e4m3_to_float(0x7f)));
}

TEST(Options, HintsParseAndFormat) {
  Hints h = parse_hints(" gloo.interface = lo , busy_poll=0 ");
  EXPECT_EQ(h.at("gloo.interface"), "lo");
  EXPECT_EQ(h.at("busy_poll"), "0");
  EXPECT_EQ(format_hints(h), "busy_poll=0,gloo.interface=lo");
  EXPECT_THROW(parse_hints("novalue"), Error);
  EXPECT_THROW(parse_hints("=1"), Error);
}

TEST(Hints, AKeyGivenTwiceIsAnErrorNotLastOneWins) {
  for (const char* text : {"max_ctas=8,max_ctas=9", "max_ctas=8, max_ctas =8"}) {
    try {
      parse_hints(text);
      ADD_FAILURE() << text << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_EQ(std::string(e.what()),
                std::string("hint 'max_ctas' is given twice in '") + text + "'; give each hint once");
    }
  }
}

TEST(Environment, DurationsAcceptUnitsAndRejectJunk) {
  EXPECT_EQ(env::parse_duration("250ms", "X").count(), 250);
  EXPECT_EQ(env::parse_duration("30s", "X").count(), 30000);
  EXPECT_EQ(env::parse_duration("2m", "X").count(), 120000);
  EXPECT_EQ(env::parse_duration("1.5", "X").count(), 1500);
  for (const char* bad : {"", "0", "-1s", "ten", "5 parsecs", "nan", "NaNs", "inf", "1e300h"}) {
    try {
      const auto d = env::parse_duration(bad, "COMMS_OP_TIMEOUT");
      ADD_FAILURE() << "'" << bad << "' was read as " << d.count() << " ms";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("COMMS_OP_TIMEOUT='") + bad + "' is not a positive duration"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace comms
