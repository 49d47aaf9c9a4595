#include <string>

#include "util/strutil.h"
#include "comms/comm.h"
#include "comms/comms.h"
#include "comms/error.h"
#include "comms/types.h"

namespace comms {

const char* library_version() { return COMMS_VERSION; }

namespace {

struct NamedType {
  std::string_view name;
  DataType type;
};

// Canonical names first; aliases after.
constexpr NamedType kTypeNames[] = {
    {"int8", DataType::kInt8},         {"uint8", DataType::kUint8},
    {"int32", DataType::kInt32},       {"uint32", DataType::kUint32},
    {"int64", DataType::kInt64},       {"uint64", DataType::kUint64},
    {"float16", DataType::kFloat16},   {"bfloat16", DataType::kBfloat16},
    {"float32", DataType::kFloat32},   {"float64", DataType::kFloat64},
    {"float8_e4m3", DataType::kFloat8E4M3}, {"float8_e5m2", DataType::kFloat8E5M2},
    {"bool", DataType::kBool},
    // aliases
    {"char", DataType::kInt8},         {"int", DataType::kInt32},
    {"long", DataType::kInt64},        {"half", DataType::kFloat16},
    {"fp16", DataType::kFloat16},      {"bf16", DataType::kBfloat16},
    {"float", DataType::kFloat32},     {"fp32", DataType::kFloat32},
    {"double", DataType::kFloat64},    {"fp64", DataType::kFloat64},
    {"fp8_e4m3", DataType::kFloat8E4M3}, {"fp8_e5m2", DataType::kFloat8E5M2},
};

std::string normalized(std::string_view text) {
  return str::lower(str::strip(text));
}

}  // namespace

DataType parse_data_type(std::string_view text) {
  const std::string t = normalized(text);
  for (const auto& n : kTypeNames) {
    if (n.name == t) return n.type;
  }
  std::string names;
  for (int i = 0; i < kNumDataTypes; ++i) {
    str::append(names, i ? ", " : "", kTypeNames[i].name);
  }
  throw Error(ErrorCode::kInvalidArgument,
              str::cat("unknown data type '", text, "'; expected one of ", names));
}

std::string to_string(const ReduceOp& op) {
  if (op.kind == ReduceKind::kPremulSum) return str::cat("premul_sum:", op.scalar);
  return std::string(to_string(op.kind));
}

ReduceOp parse_reduce_op(std::string_view text) {
  std::string t = normalized(text);
  if (std::string_view(t).starts_with( "premul_sum")) {
    std::string_view rest = std::string_view(t).substr(10);
    double factor = 1.0;
    if (str::consume_prefix(rest, ":") && str::parse_double(rest, &factor)) {
      return ReduceOp::premul_sum(factor);
    }
    if (rest.empty()) return ReduceOp::premul_sum(1.0);
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("bad premul_sum '", text, "'; expected premul_sum:<factor>"));
  }
  if (t == "prod") t = "product";
  for (int i = 0; i < kNumReduceKinds; ++i) {
    auto k = static_cast<ReduceKind>(i);
    if (k != ReduceKind::kPremulSum && to_string(k) == t) return ReduceOp(k);
  }
  throw Error(ErrorCode::kInvalidArgument,
              str::cat("unknown reduce op '", text,
                           "'; expected sum, product, min, max, avg, band, bor, bxor or "
                           "premul_sum:<factor>"));
}

std::string_view to_string(DeviceType t) {
  switch (t) {
    case DeviceType::kCpu: return "cpu";
    case DeviceType::kCuda: return "cuda";
  }
  return "unknown";
}

DeviceType parse_device_type(std::string_view text) {
  const std::string t = normalized(text);
  if (t == "cpu") return DeviceType::kCpu;
  if (t == "cuda") return DeviceType::kCuda;
  throw Error(ErrorCode::kInvalidArgument,
              str::cat("unknown device type '", text, "'; expected cpu or cuda"));
}

Device Device::parse(std::string_view text) {
  const std::string t = normalized(text);
  std::string_view type_part = t;
  std::string_view index_part;
  if (auto colon = t.find(':'); colon != std::string::npos) {
    type_part = std::string_view(t).substr(0, colon);
    index_part = std::string_view(t).substr(colon + 1);
  }
  Device d{parse_device_type(type_part), -1};
  if (t.find(':') != std::string::npos) {
    int index = -1;
    if (!str::parse_int(index_part, &index) || index < 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  str::cat("bad device '", text,
                               "': the index after ':' must be a non-negative integer"));
    }
    if (d.type == DeviceType::kCpu && index != 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  str::cat("bad device '", text, "': cpu has no index other than 0"));
    }
    d.index = d.type == DeviceType::kCpu ? -1 : index;
  }
  return d;
}

std::string Device::to_string() const {
  std::string s(comms::to_string(type));
  if (index >= 0) str::append(s, ":", index);
  return s;
}

std::string_view to_string(BackendState s) {
  switch (s) {
    case BackendState::kAbsent: return "absent";
    case BackendState::kLazy: return "lazy";
    case BackendState::kReady: return "ready";
    case BackendState::kOffloaded: return "offloaded";
    case BackendState::kFailed: return "failed";
  }
  return "unknown";
}

}  // namespace comms
