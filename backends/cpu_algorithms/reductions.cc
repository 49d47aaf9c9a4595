#include "reductions.h"

#include <algorithm>
#include <array>
#include <utility>
#include <cstdint>
#include <type_traits>

#include "comms/numeric.h"

namespace comms::cpu_algorithms {
namespace {

// Integer arithmetic goes through the unsigned type so overflow wraps (as it
// does in NCCL) instead of being undefined behaviour.
template <class T>
T wrap_add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

template <class T>
T wrap_mul(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    // Promote narrow types to unsigned int so the product cannot overflow int.
    using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
    return static_cast<T>(static_cast<U>(static_cast<W>(static_cast<U>(a)) * static_cast<W>(static_cast<U>(b))));
  } else {
    return a * b;
  }
}

struct Sum { template <class T> static T apply(T a, T b) { return wrap_add(a, b); } };
struct Prod { template <class T> static T apply(T a, T b) { return wrap_mul(a, b); } };
struct Min { template <class T> static T apply(T a, T b) { return std::min(a, b); } };
struct Max { template <class T> static T apply(T a, T b) { return std::max(a, b); } };
struct Band { template <class T> static T apply(T a, T b) { return a & b; } };
struct Bor { template <class T> static T apply(T a, T b) { return a | b; } };
struct Bxor { template <class T> static T apply(T a, T b) { return a ^ b; } };

template <class T, class Op>
void native_kernel(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  // A cache line per step: GCC's -O2 vectorizes a loop only when its trip
  // count is fixed and it may ignore aliasing, which holds since out is a, b
  // or apart from both, never a partial overlap. The plain loop stayed
  // scalar, one element per iteration.
  constexpr size_t kLine = 64 / sizeof(T);
  size_t i = 0;
  for (; i + kLine <= n; i += kLine) {
#pragma GCC ivdep
    for (size_t k = 0; k < kLine; ++k) o[i + k] = Op::template apply<T>(x[i + k], y[i + k]);
  }
  for (; i < n; ++i) o[i] = Op::template apply<T>(x[i], y[i]);
}

// Types without C++ arithmetic: decode to float, reduce, round back.
template <class Bits, float (*Decode)(Bits), Bits (*Encode)(float), class Op>
void float_kernel(void* out, const void* a, const void* b, size_t n) {
  Bits* o = static_cast<Bits*>(out);
  const Bits* x = static_cast<const Bits*>(a);
  const Bits* y = static_cast<const Bits*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = Encode(Op::template apply<float>(Decode(x[i]), Decode(y[i])));
}

float e4m3_decode(uint8_t v) { return numeric::fp8_e4m3_to_float(v); }
uint8_t e4m3_encode(float f) { return numeric::float_to_fp8_e4m3(f); }
float e5m2_decode(uint8_t v) { return numeric::fp8_e5m2_to_float(v); }
uint8_t e5m2_encode(float f) { return numeric::float_to_fp8_e5m2(f); }

// bool: sum/max/bor are "or", product/min/band are "and", bxor is "xor".
template <bool kIsOr, bool kIsXor>
void bool_kernel(void* out, const void* a, const void* b, size_t n) {
  uint8_t* o = static_cast<uint8_t*>(out);
  const uint8_t* x = static_cast<const uint8_t*>(a);
  const uint8_t* y = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < n; ++i) {
    const bool p = x[i] != 0, q = y[i] != 0;
    o[i] = kIsXor ? (p != q) : kIsOr ? (p || q) : (p && q);
  }
}

template <class Op>
ReduceFn for_type(DataType t) {
  constexpr bool kBitwise = std::is_same_v<Op, Band> || std::is_same_v<Op, Bor> || std::is_same_v<Op, Bxor>;
  switch (t) {
    case DataType::kInt8: return native_kernel<int8_t, Op>;
    case DataType::kUint8: return native_kernel<uint8_t, Op>;
    case DataType::kInt32: return native_kernel<int32_t, Op>;
    case DataType::kUint32: return native_kernel<uint32_t, Op>;
    case DataType::kInt64: return native_kernel<int64_t, Op>;
    case DataType::kUint64: return native_kernel<uint64_t, Op>;
    default: break;
  }
  if constexpr (!kBitwise) {
    switch (t) {
      case DataType::kFloat32: return native_kernel<float, Op>;
      case DataType::kFloat64: return native_kernel<double, Op>;
      case DataType::kFloat16: return float_kernel<uint16_t, numeric::half_to_float, numeric::float_to_half, Op>;
      case DataType::kBfloat16: return float_kernel<uint16_t, numeric::bf16_to_float, numeric::float_to_bf16, Op>;
      case DataType::kFloat8E4M3: return float_kernel<uint8_t, e4m3_decode, e4m3_encode, Op>;
      case DataType::kFloat8E5M2: return float_kernel<uint8_t, e5m2_decode, e5m2_encode, Op>;
      default: break;
    }
  }
  return nullptr;
}

template <class T>
void scale_native(void* data, size_t n, double factor) {
  T* d = static_cast<T*>(data);
  const T f = static_cast<T>(factor);
  for (size_t i = 0; i < n; ++i) d[i] = wrap_mul(d[i], f);
}

template <class T>
void divide_native(void* data, size_t n, int divisor) {
  T* d = static_cast<T*>(data);
  if constexpr (std::is_integral_v<T>) {
    const T q = static_cast<T>(divisor);
    for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(d[i] / q);
  } else {
    const T q = static_cast<T>(divisor);
    for (size_t i = 0; i < n; ++i) d[i] = d[i] / q;
  }
}

// Gloo's algorithm classes need a typed function pointer per (dtype, op);
// these instantiate one per kernel.
template <class Storage, ReduceFn* Table, size_t Index>
void in_place_adapter(Storage* x, const Storage* y, size_t n) {
  Table[Index](x, x, y, n);
}

}  // namespace

namespace {

ReduceFn kernel_for(DataType t, ReduceKind k) {
  if (!reduction_defined(t, k)) return nullptr;
  if (t == DataType::kBool) {
    switch (k) {
      case ReduceKind::kSum:
      case ReduceKind::kMax:
      case ReduceKind::kBor: return bool_kernel<true, false>;
      case ReduceKind::kProduct:
      case ReduceKind::kMin:
      case ReduceKind::kBand: return bool_kernel<false, false>;
      case ReduceKind::kBxor: return bool_kernel<false, true>;
      default: return nullptr;
    }
  }
  switch (k) {
    case ReduceKind::kSum:
    case ReduceKind::kAvg:
    case ReduceKind::kPremulSum: return for_type<Sum>(t);
    case ReduceKind::kProduct: return for_type<Prod>(t);
    case ReduceKind::kMin: return for_type<Min>(t);
    case ReduceKind::kMax: return for_type<Max>(t);
    case ReduceKind::kBand: return for_type<Band>(t);
    case ReduceKind::kBor: return for_type<Bor>(t);
    case ReduceKind::kBxor: return for_type<Bxor>(t);
  }
  return nullptr;
}

constexpr size_t kCombos = size_t(kNumDataTypes) * kNumReduceKinds;
ReduceFn g_kernels[kCombos];  // filled once from kernel_for

void fill_kernels() {
  static bool done = [] {
    for (int t = 0; t < kNumDataTypes; ++t)
      for (int k = 0; k < kNumReduceKinds; ++k)
        g_kernels[size_t(t) * kNumReduceKinds + k] = kernel_for(static_cast<DataType>(t), static_cast<ReduceKind>(k));
    return true;
  }();
  (void)done;
}

}  // namespace

// A table look-up: every small reducing op asks.
ReduceFn reduce_fn(DataType t, ReduceKind k) {
  if (static_cast<size_t>(t) >= size_t(kNumDataTypes) || static_cast<size_t>(k) >= size_t(kNumReduceKinds)) {
    return nullptr;
  }
  fill_kernels();
  return g_kernels[size_t(t) * kNumReduceKinds + size_t(k)];
}

namespace {

template <class Storage, size_t... I>
constexpr auto adapter_table(std::index_sequence<I...>) {
  return std::array<InPlaceFn<Storage>, sizeof...(I)>{&in_place_adapter<Storage, g_kernels, I>...};
}

}  // namespace

template <class Storage>
InPlaceFn<Storage> in_place_fn(DataType dtype, ReduceKind kind) {
  fill_kernels();
  static constexpr auto table = adapter_table<Storage>(std::make_index_sequence<kCombos>());
  const size_t i = size_t(dtype) * kNumReduceKinds + size_t(kind);
  if (element_size(dtype) != sizeof(Storage) || g_kernels[i] == nullptr) return nullptr;
  return table[i];
}

template InPlaceFn<uint8_t> in_place_fn<uint8_t>(DataType, ReduceKind);
template InPlaceFn<uint16_t> in_place_fn<uint16_t>(DataType, ReduceKind);
template InPlaceFn<uint32_t> in_place_fn<uint32_t>(DataType, ReduceKind);
template InPlaceFn<uint64_t> in_place_fn<uint64_t>(DataType, ReduceKind);

void scale(void* data, DataType t, size_t n, double factor) {
  switch (t) {
    case DataType::kInt8: return scale_native<int8_t>(data, n, factor);
    case DataType::kUint8: return scale_native<uint8_t>(data, n, factor);
    case DataType::kInt32: return scale_native<int32_t>(data, n, factor);
    case DataType::kUint32: return scale_native<uint32_t>(data, n, factor);
    case DataType::kInt64: return scale_native<int64_t>(data, n, factor);
    case DataType::kUint64: return scale_native<uint64_t>(data, n, factor);
    case DataType::kFloat32: return scale_native<float>(data, n, factor);
    case DataType::kFloat64: return scale_native<double>(data, n, factor);
    default:
      for (size_t i = 0; i < n; ++i) {
        numeric::store_from_double(data, t, i, numeric::load_as_double(data, t, i) * factor);
      }
  }
}

void divide(void* data, DataType t, size_t n, int divisor) {
  switch (t) {
    case DataType::kInt8: return divide_native<int8_t>(data, n, divisor);
    case DataType::kUint8: return divide_native<uint8_t>(data, n, divisor);
    case DataType::kInt32: return divide_native<int32_t>(data, n, divisor);
    case DataType::kUint32: return divide_native<uint32_t>(data, n, divisor);
    case DataType::kInt64: return divide_native<int64_t>(data, n, divisor);
    case DataType::kUint64: return divide_native<uint64_t>(data, n, divisor);
    case DataType::kFloat32: return divide_native<float>(data, n, divisor);
    case DataType::kFloat64: return divide_native<double>(data, n, divisor);
    default:
      for (size_t i = 0; i < n; ++i) {
        numeric::store_from_double(data, t, i, numeric::load_as_double(data, t, i) / divisor);
      }
  }
}

}  // namespace comms::cpu_algorithms
