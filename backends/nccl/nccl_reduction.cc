// What NCCL is asked to do for each comms data type and reduction
// (nccl_backend.h: plan_reduction, copy_dtype, encode_scalar).
#include <cstring>
#include <optional>

#include "comms/numeric.h"
#include "nccl_backend.h"

namespace comms::nccl {

namespace {

constexpr bool kHasFp8 = NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0);

std::optional<ncclDataType_t> native_dtype(DataType t) {
  switch (t) {
    case DataType::kInt8: return ncclInt8;
    case DataType::kUint8: return ncclUint8;
    case DataType::kInt32: return ncclInt32;
    case DataType::kUint32: return ncclUint32;
    case DataType::kInt64: return ncclInt64;
    case DataType::kUint64: return ncclUint64;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBfloat16: return ncclBfloat16;
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
    case DataType::kFloat8E4M3: return ncclFloat8e4m3;
    case DataType::kFloat8E5M2: return ncclFloat8e5m2;
#else
    case DataType::kFloat8E4M3:
    case DataType::kFloat8E5M2: return std::nullopt;
#endif
    case DataType::kBool: return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace

ncclDataType_t copy_dtype(DataType t) {
  // Data movement is type-agnostic; uint8 keeps fp8 and bool working on
  // every architecture and NCCL version.
  if (t == DataType::kBool || t == DataType::kFloat8E4M3 || t == DataType::kFloat8E5M2) {
    return ncclUint8;
  }
  return *native_dtype(t);
}

ReductionPlan plan_reduction(DataType dtype, ReduceKind kind, int cc_major, int cc_minor) {
  ReductionPlan plan;
  auto reject = [&](std::string why) {
    plan.reason = "nccl cannot reduce " + std::string(to_string(dtype)) + " with " +
                  std::string(to_string(kind)) + ": " + std::move(why);
    return plan;
  };
  if (!reduction_defined(dtype, kind)) return reject("the reduction is not defined for this type");
  if (dtype == DataType::kBool) {
    plan.dtype = ncclUint8;
    switch (kind) {
      case ReduceKind::kSum:
      case ReduceKind::kMax:
      case ReduceKind::kBor: plan.op = ncclMax; return plan;  // logical or
      case ReduceKind::kProduct:
      case ReduceKind::kMin:
      case ReduceKind::kBand: plan.op = ncclMin; return plan;  // logical and
      default: return reject("NCCL has no logical xor");
    }
  }
  if (kind == ReduceKind::kBand || kind == ReduceKind::kBor || kind == ReduceKind::kBxor) {
    return reject("NCCL has no bitwise reductions");
  }
  const bool fp8 = dtype == DataType::kFloat8E4M3 || dtype == DataType::kFloat8E5M2;
  if (fp8 && !kHasFp8) {
    return reject("fp8 needs NCCL >= 2.24; this build links NCCL " +
                  nccl_version_string(NCCL_VERSION_CODE));
  }
  if (fp8 && cc_major >= 0 && cc_major < 9) {
    return reject("fp8 reductions need a device of compute capability 9.0 (sm_90) or newer; "
                  "this one is " + std::to_string(cc_major) + "." + std::to_string(cc_minor));
  }
  // NCCL (through 2.28 at least) reduces fp8 with sum, product, min and
  // max; avg and premul_sum fail at launch with "invalid argument", as seen
  // on an H100 with NCCL 2.28.3.
  if (fp8 && (kind == ReduceKind::kAvg || kind == ReduceKind::kPremulSum)) {
    return reject("NCCL has no " + std::string(to_string(kind)) + " for fp8 (it has sum, product, min and max)");
  }
  plan.dtype = *native_dtype(dtype);
  switch (kind) {
    case ReduceKind::kSum: plan.op = ncclSum; break;
    case ReduceKind::kProduct: plan.op = ncclProd; break;
    case ReduceKind::kMin: plan.op = ncclMin; break;
    case ReduceKind::kMax: plan.op = ncclMax; break;
    case ReduceKind::kAvg: plan.op = ncclAvg; break;
    case ReduceKind::kPremulSum: plan.premul_sum = true; break;
    default: break;
  }
  return plan;
}

void encode_scalar(double value, DataType dtype, void* out) {
  std::memset(out, 0, 8);
  numeric::store_from_double(out, dtype, 0, value);
}

}  // namespace comms::nccl
