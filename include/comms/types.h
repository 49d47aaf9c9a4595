// Element types, reduction operators, devices and the non-owning buffer view
// that every operation of the Comm API takes.
#pragma once

#include "comms/export.h"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

namespace comms {

enum class DataType : uint8_t {
  kInt8,
  kUint8,
  kInt32,
  kUint32,
  kInt64,
  kUint64,
  kFloat16,
  kBfloat16,
  kFloat32,
  kFloat64,
  kFloat8E4M3,
  kFloat8E5M2,
  kBool,
};
inline constexpr int kNumDataTypes = 13;

constexpr size_t element_size(DataType t) {
  switch (t) {
    case DataType::kInt8:
    case DataType::kUint8:
    case DataType::kFloat8E4M3:
    case DataType::kFloat8E5M2:
    case DataType::kBool:
      return 1;
    case DataType::kFloat16:
    case DataType::kBfloat16:
      return 2;
    case DataType::kInt32:
    case DataType::kUint32:
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
    case DataType::kUint64:
    case DataType::kFloat64:
      return 8;
  }
  return 0;
}

constexpr bool is_floating_point(DataType t) {
  switch (t) {
    case DataType::kFloat16:
    case DataType::kBfloat16:
    case DataType::kFloat32:
    case DataType::kFloat64:
    case DataType::kFloat8E4M3:
    case DataType::kFloat8E5M2:
      return true;
    default:
      return false;
  }
}

constexpr bool is_integral(DataType t) {
  return !is_floating_point(t) && t != DataType::kBool;
}

// "int8", "bfloat16", "float8_e4m3", "bool", ... (inline: plugins use it
// without linking libcomms).
constexpr std::string_view to_string(DataType t) {
  switch (t) {
    case DataType::kInt8: return "int8";
    case DataType::kUint8: return "uint8";
    case DataType::kInt32: return "int32";
    case DataType::kUint32: return "uint32";
    case DataType::kInt64: return "int64";
    case DataType::kUint64: return "uint64";
    case DataType::kFloat16: return "float16";
    case DataType::kBfloat16: return "bfloat16";
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kFloat8E4M3: return "float8_e4m3";
    case DataType::kFloat8E5M2: return "float8_e5m2";
    case DataType::kBool: return "bool";
  }
  return "unknown";
}
// Accepts the names above plus the common aliases (float, double, half, bf16,
// int, long, fp8_e4m3, ...). Throws comms::Error(kInvalidArgument) naming the
// accepted names.
COMMS_API DataType parse_data_type(std::string_view text);

enum class ReduceKind : uint8_t {
  kSum,
  kProduct,
  kMin,
  kMax,
  kAvg,
  kBand,
  kBor,
  kBxor,
  kPremulSum,
};
inline constexpr int kNumReduceKinds = 9;

// A reduction operator. premul_sum multiplies every rank's input by `scalar`
// before summing, as NCCL's ncclRedOpCreatePreMulSum does.
struct ReduceOp {
  ReduceKind kind = ReduceKind::kSum;
  double scalar = 1.0;  // used by premul_sum only

  constexpr ReduceOp() = default;
  constexpr ReduceOp(ReduceKind k) : kind(k) {}  // NOLINT: implicit on purpose

  static constexpr ReduceOp sum() { return ReduceKind::kSum; }
  static constexpr ReduceOp product() { return ReduceKind::kProduct; }
  static constexpr ReduceOp min() { return ReduceKind::kMin; }
  static constexpr ReduceOp max() { return ReduceKind::kMax; }
  static constexpr ReduceOp avg() { return ReduceKind::kAvg; }
  static constexpr ReduceOp band() { return ReduceKind::kBand; }
  static constexpr ReduceOp bor() { return ReduceKind::kBor; }
  static constexpr ReduceOp bxor() { return ReduceKind::kBxor; }
  static constexpr ReduceOp premul_sum(double factor) {
    ReduceOp op(ReduceKind::kPremulSum);
    op.scalar = factor;
    return op;
  }
};

constexpr std::string_view to_string(ReduceKind k) {
  switch (k) {
    case ReduceKind::kSum: return "sum";
    case ReduceKind::kProduct: return "product";
    case ReduceKind::kMin: return "min";
    case ReduceKind::kMax: return "max";
    case ReduceKind::kAvg: return "avg";
    case ReduceKind::kBand: return "band";
    case ReduceKind::kBor: return "bor";
    case ReduceKind::kBxor: return "bxor";
    case ReduceKind::kPremulSum: return "premul_sum";
  }
  return "unknown";
}
// "sum", "prod"/"product", "min", "max", "avg", "band", "bor", "bxor",
// "premul_sum:<factor>". Throws comms::Error(kInvalidArgument).
COMMS_API ReduceOp parse_reduce_op(std::string_view text);
COMMS_API std::string to_string(const ReduceOp& op);

// Whether the reduction is defined for the element type, independent of any
// backend: bitwise ops need integers or bool, avg and premul_sum need numbers.
constexpr bool reduction_defined(DataType t, ReduceKind k) {
  switch (k) {
    case ReduceKind::kBand:
    case ReduceKind::kBor:
    case ReduceKind::kBxor:
      return !is_floating_point(t);
    case ReduceKind::kAvg:
    case ReduceKind::kPremulSum:
      return t != DataType::kBool;
    default:
      return true;
  }
}

enum class DeviceType : uint8_t { kCpu = 0, kCuda = 1 };
inline constexpr int kNumDeviceTypes = 2;
COMMS_API std::string_view to_string(DeviceType t);
// "cpu" or "cuda". Throws comms::Error(kInvalidArgument).
COMMS_API DeviceType parse_device_type(std::string_view text);

struct COMMS_API Device {
  DeviceType type = DeviceType::kCpu;
  int index = -1;  // -1: unspecified; for cuda that means the local rank

  static constexpr Device cpu() { return {DeviceType::kCpu, -1}; }
  static constexpr Device cuda(int index = -1) { return {DeviceType::kCuda, index}; }
  // "cpu", "cuda", "cuda:3" (case and surrounding whitespace ignored).
  static Device parse(std::string_view text);
  std::string to_string() const;

  friend constexpr bool operator==(const Device&, const Device&) = default;
};

// Storage types for the element types C++ has no type for. They only carry
// the bits; comms/numeric.h converts them.
struct float16_t { uint16_t bits; };
struct bfloat16_t { uint16_t bits; };
struct float8_e4m3_t { uint8_t bits; };
struct float8_e5m2_t { uint8_t bits; };

template <class T>
constexpr DataType data_type_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, bool>) return DataType::kBool;
  else if constexpr (std::is_same_v<U, int8_t>) return DataType::kInt8;
  else if constexpr (std::is_same_v<U, uint8_t>) return DataType::kUint8;
  else if constexpr (std::is_same_v<U, int32_t>) return DataType::kInt32;
  else if constexpr (std::is_same_v<U, uint32_t>) return DataType::kUint32;
  else if constexpr (std::is_same_v<U, int64_t> || std::is_same_v<U, long long>)
    return DataType::kInt64;
  else if constexpr (std::is_same_v<U, uint64_t> || std::is_same_v<U, unsigned long long>)
    return DataType::kUint64;
  else if constexpr (std::is_same_v<U, float16_t>) return DataType::kFloat16;
  else if constexpr (std::is_same_v<U, bfloat16_t>) return DataType::kBfloat16;
  else if constexpr (std::is_same_v<U, float>) return DataType::kFloat32;
  else if constexpr (std::is_same_v<U, double>) return DataType::kFloat64;
  else if constexpr (std::is_same_v<U, float8_e4m3_t>) return DataType::kFloat8E4M3;
  else if constexpr (std::is_same_v<U, float8_e5m2_t>) return DataType::kFloat8E5M2;
  else static_assert(sizeof(T) == 0, "no comms::DataType for this C++ type");
}

// A non-owning view of `count` elements of `dtype` at `data` on `device`.
// Inputs are read through the same type; the library never writes to a view
// that is only used as an input.
struct BufferView {
  void* data = nullptr;
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
  Device device = Device::cpu();

  constexpr size_t bytes() const { return count * element_size(dtype); }

  template <class T>
  static BufferView of(T* ptr, size_t count, Device device = Device::cpu()) {
    return {const_cast<std::remove_cv_t<T>*>(ptr), count, data_type_of<T>(), device};
  }
  template <class T, size_t N>
  static BufferView of(std::span<T, N> s, Device device = Device::cpu()) {
    return of(s.data(), s.size(), device);
  }
  template <class Container>
  static BufferView of(Container& c, Device device = Device::cpu()) {
    return of(c.data(), c.size(), device);
  }
};

// One send or receive of a batch issued together (Comm::batch_p2p).
struct P2POp {
  enum class Kind : uint8_t { kSend, kRecv };
  Kind kind = Kind::kSend;
  BufferView buffer;
  int peer = -1;
  uint32_t tag = 0;

  static P2POp send(BufferView b, int peer, uint32_t tag = 0) { return {Kind::kSend, b, peer, tag}; }
  static P2POp recv(BufferView b, int peer, uint32_t tag = 0) { return {Kind::kRecv, b, peer, tag}; }
};

}  // namespace comms
