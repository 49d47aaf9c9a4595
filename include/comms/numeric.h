// Conversions between float and the 16- and 8-bit floating types, with
// round-to-nearest-even. fp8 conversions saturate to the largest finite value
// (like CUDA's __NV_SATFINITE), so a reduction never produces an infinity that
// e4m3 cannot represent. Header-only so that plugins can use it without
// linking libcomms.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "comms/types.h"

namespace comms::numeric {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: value = man * 2^-24.
    float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (man << 13));
  return bits_float(sign | ((exp + 112) << 23) | (man << 13));
}

inline uint16_t float_to_half(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {
    // Subnormal half (or zero): round abs * 2^24 to an integer.
    const float scaled = std::ldexp(bits_float(abs), 24);
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  // Normal: rebias and round the 13 dropped mantissa bits to nearest even.
  uint32_t h = ((abs >> 13) - (112u << 10));
  const uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return sign | static_cast<uint16_t>(h);
}

inline float bf16_to_float(uint16_t b) { return bits_float(uint32_t(b) << 16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

namespace internal {

// A minifloat with kExp exponent bits and kMan mantissa bits. e4m3 is the
// "fn" variant: no infinities, 0x7f/0xff are NaN, largest finite is 448.
template <int kExp, int kMan, bool kIeeeSpecials>
struct Minifloat {
  static constexpr int kBias = (1 << (kExp - 1)) - 1;
  static constexpr uint8_t kMaxFiniteCode =
      kIeeeSpecials ? uint8_t(((((1 << kExp) - 2) << kMan)) | ((1 << kMan) - 1))
                    : uint8_t((((1 << kExp) - 1) << kMan) | ((1 << kMan) - 2));
  static constexpr uint8_t kNanCode =
      kIeeeSpecials ? uint8_t((((1 << kExp) - 1) << kMan) | (1 << (kMan - 1)))
                    : uint8_t((1 << (kExp + kMan)) - 1);

  static float decode(uint8_t code) {
    const bool neg = code & 0x80u;
    const int exp = (code >> kMan) & ((1 << kExp) - 1);
    const int man = code & ((1 << kMan) - 1);
    float v;
    if (kIeeeSpecials && exp == (1 << kExp) - 1) {
      v = man ? NAN : INFINITY;
    } else if (!kIeeeSpecials && (code & 0x7fu) == kNanCode) {
      v = NAN;
    } else if (exp == 0) {
      v = std::ldexp(static_cast<float>(man), 1 - kBias - kMan);
    } else {
      v = std::ldexp(static_cast<float>(man | (1 << kMan)), exp - kBias - kMan);
    }
    return neg ? -v : v;
  }

  static uint8_t encode(float f) {
    if (std::isnan(f)) return kNanCode;
    const uint8_t sign = std::signbit(f) ? 0x80u : 0u;
    const double a = std::fabs(static_cast<double>(f));
    constexpr int kMinNormalExp = 1 - kBias;
    uint32_t code;
    if (a < std::ldexp(1.0, kMinNormalExp)) {
      // Subnormal: a rounded mantissa of 2^kMan lands exactly on the
      // smallest normal's code, so no special case is needed.
      code = static_cast<uint32_t>(std::nearbyint(std::ldexp(a, kMan - kMinNormalExp)));
    } else {
      int e2;
      std::frexp(a, &e2);  // a = fr * 2^e2, fr in [0.5, 1)
      int e = e2 - 1;
      double q = std::nearbyint(std::ldexp(a, kMan - e));  // in [2^kMan, 2^(kMan+1)]
      if (q >= double(1 << (kMan + 1))) {
        q /= 2;
        ++e;
      }
      const int biased = e + kBias;
      if (biased >= (1 << kExp) || std::isinf(a)) return sign | kMaxFiniteCode;
      code = (uint32_t(biased) << kMan) | (uint32_t(q) - (1u << kMan));
    }
    if (code > kMaxFiniteCode) code = kMaxFiniteCode;
    return sign | static_cast<uint8_t>(code);
  }
};

}  // namespace internal

using E4M3 = internal::Minifloat<4, 3, false>;
using E5M2 = internal::Minifloat<5, 2, true>;

inline float fp8_e4m3_to_float(uint8_t v) { return E4M3::decode(v); }
inline uint8_t float_to_fp8_e4m3(float f) { return E4M3::encode(f); }
inline float fp8_e5m2_to_float(uint8_t v) { return E5M2::decode(v); }
inline uint8_t float_to_fp8_e5m2(float f) { return E5M2::encode(f); }

// Reads element `i` of a buffer of `dtype` as a double (bool reads as 0/1).
inline double load_as_double(const void* data, DataType dtype, size_t i) {
  switch (dtype) {
    case DataType::kInt8: return static_cast<const int8_t*>(data)[i];
    case DataType::kUint8: return static_cast<const uint8_t*>(data)[i];
    case DataType::kInt32: return static_cast<const int32_t*>(data)[i];
    case DataType::kUint32: return static_cast<const uint32_t*>(data)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const int64_t*>(data)[i]);
    case DataType::kUint64: return static_cast<double>(static_cast<const uint64_t*>(data)[i]);
    case DataType::kFloat16: return half_to_float(static_cast<const uint16_t*>(data)[i]);
    case DataType::kBfloat16: return bf16_to_float(static_cast<const uint16_t*>(data)[i]);
    case DataType::kFloat32: return static_cast<const float*>(data)[i];
    case DataType::kFloat64: return static_cast<const double*>(data)[i];
    case DataType::kFloat8E4M3: return fp8_e4m3_to_float(static_cast<const uint8_t*>(data)[i]);
    case DataType::kFloat8E5M2: return fp8_e5m2_to_float(static_cast<const uint8_t*>(data)[i]);
    case DataType::kBool: return static_cast<const uint8_t*>(data)[i] != 0;
  }
  return 0;
}

// Writes `v` as element `i` (integers truncate toward zero, bool is v != 0).
inline void store_from_double(void* data, DataType dtype, size_t i, double v) {
  switch (dtype) {
    case DataType::kInt8: static_cast<int8_t*>(data)[i] = static_cast<int8_t>(v); break;
    case DataType::kUint8: static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(v); break;
    case DataType::kInt32: static_cast<int32_t*>(data)[i] = static_cast<int32_t>(v); break;
    case DataType::kUint32: static_cast<uint32_t*>(data)[i] = static_cast<uint32_t>(v); break;
    case DataType::kInt64: static_cast<int64_t*>(data)[i] = static_cast<int64_t>(v); break;
    case DataType::kUint64: static_cast<uint64_t*>(data)[i] = static_cast<uint64_t>(v); break;
    case DataType::kFloat16:
      static_cast<uint16_t*>(data)[i] = float_to_half(static_cast<float>(v));
      break;
    case DataType::kBfloat16:
      static_cast<uint16_t*>(data)[i] = float_to_bf16(static_cast<float>(v));
      break;
    case DataType::kFloat32: static_cast<float*>(data)[i] = static_cast<float>(v); break;
    case DataType::kFloat64: static_cast<double*>(data)[i] = v; break;
    case DataType::kFloat8E4M3:
      static_cast<uint8_t*>(data)[i] = float_to_fp8_e4m3(static_cast<float>(v));
      break;
    case DataType::kFloat8E5M2:
      static_cast<uint8_t*>(data)[i] = float_to_fp8_e5m2(static_cast<float>(v));
      break;
    case DataType::kBool: static_cast<uint8_t*>(data)[i] = v != 0; break;
  }
}

}  // namespace comms::numeric
