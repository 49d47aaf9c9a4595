#include "nccl_table.h"

#include <string_view>

#include "util/strutil.h"

namespace comms::bench {

using plugin::OpType;

namespace {

constexpr bool kNcclHasFp8 = NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0);

ncclDataType_t native_type(DataType t) {
  switch (t) {
    case DataType::kInt8: return ncclInt8;
    case DataType::kUint8: return ncclUint8;
    case DataType::kInt32: return ncclInt32;
    case DataType::kUint32: return ncclUint32;
    case DataType::kInt64: return ncclInt64;
    case DataType::kUint64: return ncclUint64;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBfloat16: return ncclBfloat16;
    case DataType::kFloat64: return ncclFloat64;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
    case DataType::kFloat8E4M3: return ncclFloat8e4m3;
    case DataType::kFloat8E5M2: return ncclFloat8e5m2;
#endif
    default: return ncclFloat32;
  }
}

std::string version_text(int code) { return str::cat(code / 10000, ".", code / 100 % 100, ".", code % 100); }

}  // namespace

std::string nccl_call_for(OpType type) {
  switch (type) {
    case OpType::kAllReduce: return "ncclAllReduce";
    case OpType::kReduce: return "ncclReduce";
    case OpType::kReduceScatter: return "ncclReduceScatter";
    case OpType::kBroadcast: return "ncclBroadcast";
    case OpType::kAllGather: return "ncclAllGather";
    case OpType::kAllToAll: return "ncclAlltoAll";
    case OpType::kGather: return "ncclGather";
    case OpType::kScatter: return "ncclScatter";
    case OpType::kBarrier: return "ncclAllReduce (1 float)";
    case OpType::kSend: return "ncclSend+ncclRecv (grouped)";
    default: return std::string(plugin::op_name(type));
  }
}

ncclDataType_t nccl_copy_type(DataType dtype) {
  if (dtype == DataType::kBool || dtype == DataType::kFloat8E4M3 || dtype == DataType::kFloat8E5M2) return ncclUint8;
  return native_type(dtype);
}

NcclReduction nccl_reduction_for(DataType dtype, ReduceKind kind, int cc_major, int cc_minor) {
  NcclReduction r;
  auto refuse = [&](std::string_view why) {
    r.refusal = str::cat("nccl cannot reduce ", to_string(dtype), " with ", to_string(kind), ": ", why);
    return r;
  };
  if (!reduction_defined(dtype, kind)) return refuse("the reduction is not defined for this type");
  if (dtype == DataType::kBool) {
    r.dtype = ncclUint8;
    switch (kind) {
      case ReduceKind::kSum:
      case ReduceKind::kMax:
      case ReduceKind::kBor: r.op = ncclMax; return r;  // logical or
      case ReduceKind::kProduct:
      case ReduceKind::kMin:
      case ReduceKind::kBand: r.op = ncclMin; return r;  // logical and
      default: return refuse("NCCL has no logical xor");
    }
  }
  if (kind == ReduceKind::kBand || kind == ReduceKind::kBor || kind == ReduceKind::kBxor) {
    return refuse("NCCL has no bitwise reductions");
  }
  const bool fp8 = dtype == DataType::kFloat8E4M3 || dtype == DataType::kFloat8E5M2;
  if (fp8 && !kNcclHasFp8) return refuse(str::cat("fp8 needs NCCL >= 2.24; this build has nccl.h ", version_text(NCCL_VERSION_CODE)));
  if (fp8 && cc_major >= 0 && cc_major < 9) {
    return refuse(str::cat("fp8 reductions need a device of compute capability 9.0 (sm_90) or newer; this one is ",
                           cc_major, ".", cc_minor));
  }
  // NCCL's fp8 kernels cover sum, product, min and max; avg and premul_sum
  // fail at launch.
  if (fp8 && (kind == ReduceKind::kAvg || kind == ReduceKind::kPremulSum)) {
    return refuse(str::cat("NCCL has no ", to_string(kind), " for fp8 (it has sum, product, min and max)"));
  }
  r.dtype = native_type(dtype);
  switch (kind) {
    case ReduceKind::kProduct: r.op = ncclProd; break;
    case ReduceKind::kMin: r.op = ncclMin; break;
    case ReduceKind::kMax: r.op = ncclMax; break;
    case ReduceKind::kAvg: r.op = ncclAvg; break;
    case ReduceKind::kPremulSum: r.premul_sum = true; break;
    default: r.op = ncclSum; break;
  }
  return r;
}

std::string raw_nccl_refusal(OpType type, DataType dtype, ReduceKind kind, int cc_major, int cc_minor) {
  switch (type) {
    case OpType::kAllReduce:
    case OpType::kReduce:
    case OpType::kReduceScatter: return nccl_reduction_for(dtype, kind, cc_major, cc_minor).refusal;
    case OpType::kAllToAll:
    case OpType::kGather:
    case OpType::kScatter:
      if (kNcclHasAllToAllGatherScatter) return {};
      return str::cat("raw nccl: ", plugin::op_name(type), " needs NCCL >= 2.28 (ncclAlltoAll, ncclGather, ncclScatter); "
                      "this build has nccl.h ", version_text(NCCL_VERSION_CODE));
    case OpType::kAllGather:
    case OpType::kBroadcast:
    case OpType::kBarrier:
    case OpType::kSend: return {};
    default: return str::cat("raw nccl: ", plugin::op_name(type), " is not one of comms-bench's ops");
  }
}

namespace {

// Sets one field where the linked ncclConfig_t has it; `known` tells the
// caller the name matched.
#define COMMS_BENCH_INT_FIELD(name, field)                                                            \
  if (key == name) {                                                                                  \
    if constexpr (requires(Config c) { c.field; }) {                                            \
      config->field = value.get<int>();                                                               \
      return true;                                                                                    \
    }                                                                                                 \
    return false;                                                                                     \
  }
#define COMMS_BENCH_STRING_FIELD(name, field)                                                         \
  if (key == name) {                                                                                  \
    if constexpr (requires(Config c) { c.field; }) {                                            \
      config->field = strings->emplace_back(value.get<std::string>()).c_str();                        \
      return true;                                                                                    \
    }                                                                                                 \
    return false;                                                                                     \
  }

// True when set; false when nccl.h lacks the field; throws for an unknown
// name. A template, so that a field nccl.h lacks is a false requires and not
// a compile error.
template <class Config>
bool set_field(const std::string& key, const nlohmann::json& value, Config* config, std::vector<std::string>* strings) {
  COMMS_BENCH_INT_FIELD("blocking", blocking)
  COMMS_BENCH_INT_FIELD("cga_cluster_size", cgaClusterSize)
  COMMS_BENCH_INT_FIELD("min_ctas", minCTAs)
  COMMS_BENCH_INT_FIELD("max_ctas", maxCTAs)
  COMMS_BENCH_STRING_FIELD("net_name", netName)
  COMMS_BENCH_INT_FIELD("split_share", splitShare)
  COMMS_BENCH_INT_FIELD("traffic_class", trafficClass)
  COMMS_BENCH_STRING_FIELD("comm_name", commName)
  COMMS_BENCH_INT_FIELD("collnet_enable", collnetEnable)
  COMMS_BENCH_INT_FIELD("cta_policy", CTAPolicy)
  COMMS_BENCH_INT_FIELD("shrink_share", shrinkShare)
  COMMS_BENCH_INT_FIELD("nvls_ctas", nvlsCTAs)
  COMMS_BENCH_INT_FIELD("nchannels_per_net_peer", nChannelsPerNetPeer)
  COMMS_BENCH_INT_FIELD("nvlink_centric_sched", nvlinkCentricSched)
  COMMS_BENCH_INT_FIELD("graph_usage_mode", graphUsageMode)
  COMMS_BENCH_INT_FIELD("num_rma_ctx", numRmaCtx)
  COMMS_BENCH_INT_FIELD("max_p2p_peers", maxP2pPeers)
  COMMS_BENCH_INT_FIELD("graph_stream_ordering", graphStreamOrdering)
  throw Error(ErrorCode::kInvalidArgument,
              str::cat("raw nccl: the nccl plugin reports config field '", key, "', which comms-bench does not know"));
}
#undef COMMS_BENCH_INT_FIELD
#undef COMMS_BENCH_STRING_FIELD

}  // namespace

void apply_nccl_config(const nlohmann::json& nccl_config, ncclConfig_t* config, std::vector<std::string>* strings) {
  // The strings must not move once pointed to.
  strings->clear();
  strings->reserve(nccl_config.size());
  for (const auto& [key, value] : nccl_config.items()) {
    if (value.is_null()) continue;
    if (!set_field(key, value, config, strings)) {
      throw Error(ErrorCode::kUnsupported, str::cat("raw nccl: the comm's nccl config sets ", key, ", which the nccl.h "
                                                    "comms-bench was built with (", version_text(NCCL_VERSION_CODE),
                                                    ") lacks"));
    }
  }
  // NCCL compares minCTAs with maxCTAs even when maxCTAs is unset (INT_MIN)
  // and refuses the config, so min_ctas alone needs maxCTAs' default, 64.
  if (nccl_config.contains("min_ctas") && !nccl_config["min_ctas"].is_null() &&
      (!nccl_config.contains("max_ctas") || nccl_config["max_ctas"].is_null())) {
    config->maxCTAs = 64;
  }
}

}  // namespace comms::bench
