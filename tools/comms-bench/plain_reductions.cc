#include "plain_reductions.h"

#include <algorithm>
#include <type_traits>

#include "comms/numeric.h"

namespace comms::bench {
namespace {

// How an element is stored and computed with.
template <class T>
struct Native {
  using Storage = T;
  using Math = T;
  static T load(T v) { return v; }
  static T store(T v) { return v; }
};
// 16- and 8-bit floats: stored as their bits, reduced in float.
template <class Bits, Bits (*Encode)(float), float (*Decode)(Bits)>
struct FloatBits {
  using Storage = Bits;
  using Math = float;
  static float load(Bits v) { return Decode(v); }
  static Bits store(float f) { return Encode(f); }
};
struct Bool {
  using Storage = uint8_t;
  using Math = bool;
  static bool load(uint8_t v) { return v != 0; }
  static uint8_t store(bool b) { return b; }
};

using Half = FloatBits<uint16_t, numeric::float_to_half, numeric::half_to_float>;
using Bf16 = FloatBits<uint16_t, numeric::float_to_bf16, numeric::bf16_to_float>;
using E4M3 = FloatBits<uint8_t, numeric::float_to_fp8_e4m3, numeric::fp8_e4m3_to_float>;
using E5M2 = FloatBits<uint8_t, numeric::float_to_fp8_e5m2, numeric::fp8_e5m2_to_float>;

// Integer sums and products in the unsigned type, so that overflow wraps
// instead of being undefined; narrow types multiply as unsigned int.
template <class T>
using Wide = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
struct Sum {
  template <class T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) return T(Wide<T>(a) + Wide<T>(b));
    else return a + b;
  }
};
struct Prod {
  template <class T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) return T(Wide<T>(a) * Wide<T>(b));
    else return a * b;
  }
};
struct Min { template <class T> static T apply(T a, T b) { return std::min(a, b); } };
struct Max { template <class T> static T apply(T a, T b) { return std::max(a, b); } };
struct Band { template <class T> static T apply(T a, T b) { return a & b; } };
struct Bor { template <class T> static T apply(T a, T b) { return a | b; } };
struct Bxor { template <class T> static T apply(T a, T b) { return a ^ b; } };
struct Or { static bool apply(bool a, bool b) { return a || b; } };
struct And { static bool apply(bool a, bool b) { return a && b; } };
struct Xor { static bool apply(bool a, bool b) { return a != b; } };

template <class E, class Op>
typename E::Math apply(typename E::Math a, typename E::Math b) {
  if constexpr (std::is_same_v<E, Bool>) return Op::apply(a, b);
  else return Op::template apply<typename E::Math>(a, b);
}

// out may be a or b, element for element, so no iteration reads what an
// earlier one wrote: ivdep lets the vectorizer skip its overlap check.
template <class E, class Op>
void reduce_loop(void* out, const void* a, const void* b, size_t n) {
  using S = typename E::Storage;
  S* o = static_cast<S*>(out);
  const S* x = static_cast<const S*>(a);
  const S* y = static_cast<const S*>(b);
#pragma GCC ivdep
  for (size_t i = 0; i < n; ++i) o[i] = E::store(apply<E, Op>(E::load(x[i]), E::load(y[i])));
}

template <class Storage, class E, class Op>
void in_place_loop(Storage* x, const Storage* y, size_t n) {
  reduce_loop<E, Op>(x, x, y, n);
}

// Calls v.operator()<E, Op>() for (t, k); R{} where comms defines no such
// reduction.
template <class R, class V>
R with_reduction(DataType t, ReduceKind k, V&& v) {
  if (!reduction_defined(t, k)) return R{};
  if (t == DataType::kBool) {
    switch (k) {
      case ReduceKind::kBxor: return v.template operator()<Bool, Xor>();
      case ReduceKind::kProduct:
      case ReduceKind::kMin:
      case ReduceKind::kBand: return v.template operator()<Bool, And>();
      default: return v.template operator()<Bool, Or>();
    }
  }
  auto by_kind = [&]<class E>() -> R {
    switch (k) {
      case ReduceKind::kSum:
      case ReduceKind::kAvg:
      case ReduceKind::kPremulSum: return v.template operator()<E, Sum>();
      case ReduceKind::kProduct: return v.template operator()<E, Prod>();
      case ReduceKind::kMin: return v.template operator()<E, Min>();
      case ReduceKind::kMax: return v.template operator()<E, Max>();
      default: break;
    }
    if constexpr (std::is_integral_v<typename E::Math>) {
      switch (k) {
        case ReduceKind::kBand: return v.template operator()<E, Band>();
        case ReduceKind::kBor: return v.template operator()<E, Bor>();
        case ReduceKind::kBxor: return v.template operator()<E, Bxor>();
        default: break;
      }
    }
    return R{};
  };
  switch (t) {
    case DataType::kInt8: return by_kind.template operator()<Native<int8_t>>();
    case DataType::kUint8: return by_kind.template operator()<Native<uint8_t>>();
    case DataType::kInt32: return by_kind.template operator()<Native<int32_t>>();
    case DataType::kUint32: return by_kind.template operator()<Native<uint32_t>>();
    case DataType::kInt64: return by_kind.template operator()<Native<int64_t>>();
    case DataType::kUint64: return by_kind.template operator()<Native<uint64_t>>();
    case DataType::kFloat32: return by_kind.template operator()<Native<float>>();
    case DataType::kFloat64: return by_kind.template operator()<Native<double>>();
    case DataType::kFloat16: return by_kind.template operator()<Half>();
    case DataType::kBfloat16: return by_kind.template operator()<Bf16>();
    case DataType::kFloat8E4M3: return by_kind.template operator()<E4M3>();
    case DataType::kFloat8E5M2: return by_kind.template operator()<E5M2>();
    case DataType::kBool: break;
  }
  return R{};
}

template <class T>
void finish_native(T* d, size_t n, const ReduceOp& op, int ranks) {
  if (op.kind == ReduceKind::kAvg) {
    const T q = static_cast<T>(ranks);
    for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(d[i] / q);
  } else {
    const T f = static_cast<T>(op.scalar);
    for (size_t i = 0; i < n; ++i) d[i] = Prod::apply<T>(d[i], f);
  }
}

}  // namespace

ReduceFn plain_reduce_fn(DataType dtype, ReduceKind kind) {
  return with_reduction<ReduceFn>(dtype, kind, []<class E, class Op>() -> ReduceFn { return reduce_loop<E, Op>; });
}

template <class Storage>
InPlaceFn<Storage> plain_in_place_fn(DataType dtype, ReduceKind kind) {
  return with_reduction<InPlaceFn<Storage>>(dtype, kind, []<class E, class Op>() -> InPlaceFn<Storage> {
    if constexpr (sizeof(typename E::Storage) == sizeof(Storage)) return in_place_loop<Storage, E, Op>;
    else return nullptr;
  });
}

template InPlaceFn<uint8_t> plain_in_place_fn<uint8_t>(DataType, ReduceKind);
template InPlaceFn<uint16_t> plain_in_place_fn<uint16_t>(DataType, ReduceKind);
template InPlaceFn<uint32_t> plain_in_place_fn<uint32_t>(DataType, ReduceKind);
template InPlaceFn<uint64_t> plain_in_place_fn<uint64_t>(DataType, ReduceKind);

void finish_reduction(void* data, DataType dtype, size_t n, const ReduceOp& op, int ranks) {
  if (op.kind != ReduceKind::kAvg && op.kind != ReduceKind::kPremulSum) return;
  switch (dtype) {
    case DataType::kInt8: return finish_native(static_cast<int8_t*>(data), n, op, ranks);
    case DataType::kUint8: return finish_native(static_cast<uint8_t*>(data), n, op, ranks);
    case DataType::kInt32: return finish_native(static_cast<int32_t*>(data), n, op, ranks);
    case DataType::kUint32: return finish_native(static_cast<uint32_t*>(data), n, op, ranks);
    case DataType::kInt64: return finish_native(static_cast<int64_t*>(data), n, op, ranks);
    case DataType::kUint64: return finish_native(static_cast<uint64_t*>(data), n, op, ranks);
    case DataType::kFloat32: return finish_native(static_cast<float*>(data), n, op, ranks);
    case DataType::kFloat64: return finish_native(static_cast<double*>(data), n, op, ranks);
    default: break;
  }
  for (size_t i = 0; i < n; ++i) {
    const double v = numeric::load_as_double(data, dtype, i);
    numeric::store_from_double(data, dtype, i, op.kind == ReduceKind::kAvg ? v / ranks : v * op.scalar);
  }
}

}  // namespace comms::bench
