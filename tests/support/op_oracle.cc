#include "op_oracle.h"

#include <algorithm>
#include <cmath>

#include "comms/numeric.h"

namespace comms::oracle {
namespace {

bool is_fp8(DataType t) { return t == DataType::kFloat8E4M3 || t == DataType::kFloat8E5M2; }

// Wraps an exact integer result to the type, as two's complement hardware does.
double wrap(DataType t, int64_t v) {
  switch (t) {
    case DataType::kInt8: return static_cast<int8_t>(v);
    case DataType::kUint8: return static_cast<uint8_t>(v);
    case DataType::kInt32: return static_cast<int32_t>(v);
    case DataType::kUint32: return static_cast<uint32_t>(v);
    case DataType::kInt64: return static_cast<double>(v);
    case DataType::kUint64: return static_cast<double>(static_cast<uint64_t>(v));
    default: return static_cast<double>(v);
  }
}

}  // namespace

std::vector<DataType> all_data_types() {
  std::vector<DataType> types;
  for (int i = 0; i < kNumDataTypes; ++i) types.push_back(static_cast<DataType>(i));
  return types;
}

std::vector<ReduceOp> reductions_for(DataType t) {
  std::vector<ReduceOp> ops;
  for (int k = 0; k < kNumReduceKinds; ++k) {
    const auto kind = static_cast<ReduceKind>(k);
    if (!reduction_defined(t, kind)) continue;
    ops.push_back(kind == ReduceKind::kPremulSum ? ReduceOp::premul_sum(2.0) : ReduceOp(kind));
  }
  return ops;
}

double reduce_input(DataType t, ReduceKind kind, int r, size_t i) {
  if (t == DataType::kBool) return (r + i) % 3 != 0;
  switch (kind) {
    case ReduceKind::kProduct: return 1 + (r + i) % 2;  // products are powers of two
    case ReduceKind::kBand:
    case ReduceKind::kBor:
    case ReduceKind::kBxor: return 1 + (r * 37 + i * 11) % 101;
    default: break;
  }
  // fp8 has 2-3 mantissa bits: with 0/1 inputs every partial sum (at most 8,
  // or 16 after premul_sum's factor 2) is exact.
  if (is_fp8(t)) return (r + i) % 2;
  return (r + 1) + (i % 3);
}

double expected_reduction(DataType t, const ReduceOp& op, int size, size_t i) {
  if (t == DataType::kBool) {
    bool any = false, all = true, parity = false;
    for (int r = 0; r < size; ++r) {
      const bool b = reduce_input(t, op.kind, r, i) != 0;
      any |= b;
      all &= b;
      parity ^= b;
    }
    switch (op.kind) {
      case ReduceKind::kSum: case ReduceKind::kMax: case ReduceKind::kBor: return any;
      case ReduceKind::kBxor: return parity;
      default: return all;
    }
  }
  int64_t sum = 0, prod = 1, band = -1, bor = 0, bxor = 0;
  double mn = INFINITY, mx = -INFINITY;
  for (int r = 0; r < size; ++r) {
    const double v = reduce_input(t, op.kind, r, i);
    const auto iv = static_cast<int64_t>(v);
    sum += iv;
    prod *= iv;
    mn = std::min(mn, v);
    mx = std::max(mx, v);
    band &= iv;
    bor |= iv;
    bxor ^= iv;
  }
  const bool integral = is_integral(t);
  switch (op.kind) {
    case ReduceKind::kSum: return wrap(t, sum);
    case ReduceKind::kProduct: return wrap(t, prod);
    case ReduceKind::kMin: return mn;
    case ReduceKind::kMax: return mx;
    case ReduceKind::kAvg:
      return integral ? std::trunc(wrap(t, sum) / size) : static_cast<double>(sum) / size;
    case ReduceKind::kPremulSum:
      return integral ? wrap(t, sum * static_cast<int64_t>(op.scalar)) : sum * op.scalar;
    case ReduceKind::kBand: return wrap(t, band);
    case ReduceKind::kBor: return wrap(t, bor);
    case ReduceKind::kBxor: return wrap(t, bxor);
  }
  return 0;
}

double data_value(DataType t, int r, size_t i) {
  const size_t key = static_cast<size_t>(r) * 1000003u + i;
  switch (t) {
    case DataType::kBool: return (r + i) % 2;
    case DataType::kFloat8E5M2: return (r * 3 + i) % 8;
    case DataType::kFloat8E4M3: return (r * 5 + i) % 16;
    case DataType::kBfloat16: return (r * 37 + i) % 256;
    case DataType::kInt8: return (r * 37 + i) % 127;
    case DataType::kUint8: return (r * 37 + i) % 251;
    case DataType::kFloat16: return key % 2048;
    default: return static_cast<double>(key % 16000000);  // exact in float32
  }
}

void store(void* bytes, DataType t, size_t i, double v) {
  auto* p = static_cast<uint8_t*>(bytes);
  switch (t) {
    case DataType::kInt8: reinterpret_cast<int8_t*>(p)[i] = static_cast<int8_t>(static_cast<int64_t>(v)); break;
    case DataType::kUint8: p[i] = static_cast<uint8_t>(static_cast<int64_t>(v)); break;
    case DataType::kInt32: reinterpret_cast<int32_t*>(p)[i] = static_cast<int32_t>(static_cast<int64_t>(v)); break;
    case DataType::kUint32: reinterpret_cast<uint32_t*>(p)[i] = static_cast<uint32_t>(static_cast<int64_t>(v)); break;
    default: numeric::store_from_double(p, t, i, v);
  }
}

double round_to(DataType t, double v) {
  alignas(8) uint8_t one[8] = {};
  store(one, t, 0, v);
  return numeric::load_as_double(one, t, 0);
}

// The inputs make every partial result exact, so a correct backend differs
// from the expectation (rounded once, by round_to) only where it rounds
// itself: avg's division, or its multiply by 1/n (NCCL's avg is a premul_sum),
// then the cast to the type. That is at most one unit in the last place: a
// relative 2^-10 for fp16 and 2^-7 for bf16 (taken as 1e-3 and 8e-3), the
// same for fp32 and fp64 with room (1e-6, 1e-12). fp8 results are exact
// except for avg, whose quotient rounds to 3 (e4m3) or 2 (e5m2) mantissa bits:
// just over half an ulp (0.07, 0.13).
double tolerance(DataType t) {
  switch (t) {
    case DataType::kFloat16: return 1e-3;
    case DataType::kBfloat16: return 8e-3;
    case DataType::kFloat8E4M3: return 0.07;
    case DataType::kFloat8E5M2: return 0.13;
    case DataType::kFloat32: return 1e-6;
    case DataType::kFloat64: return 1e-12;
    default: return 0;
  }
}

bool matches(DataType t, double want, double have) {
  const double tol = tolerance(t);
  return tol == 0 ? have == want : std::fabs(have - want) <= tol * std::max(1.0, std::fabs(want));
}

}  // namespace comms::oracle
