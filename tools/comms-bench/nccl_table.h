// --raw-nccl's own table of how comms-bench's ops map onto NCCL's public API
// (nccl.h): the call(s) for each op, the NCCL type and reduction for each
// comms data type and reduction, what NCCL cannot run, and the ncclConfig_t
// for a communicator configured as the nccl plugin reports its own (its
// describe()'s "nccl_config"). No NCCL or CUDA call: tested on CPU.
#pragma once

#include <nccl.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comms/plugin.h"
#include "comms/types.h"

namespace comms::bench {

// ncclAlltoAll, ncclGather and ncclScatter came with NCCL 2.28.
inline constexpr bool kNcclHasAllToAllGatherScatter = NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0);

// The NCCL call(s) that run `type` ("ncclAllReduce"; barrier: a one-float
// all-reduce; send_recv: ncclSend and ncclRecv in one group).
std::string nccl_call_for(plugin::OpType type);

// The NCCL type that moves `dtype` without reducing it: bool and fp8 move
// as uint8 (data movement ignores the type, and uint8 exists everywhere).
ncclDataType_t nccl_copy_type(DataType dtype);

struct NcclReduction {
  ncclDataType_t dtype = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  bool premul_sum = false;  // ncclRedOpCreatePreMulSum around the call
  std::string refusal;      // non-empty: NCCL cannot, and why
};
// How NCCL reduces `dtype` with `kind`: bool as uint8 (sum, max, bor: max;
// product, min, band: min; no xor); no bitwise reductions; fp8 needs NCCL
// >= 2.24 and (cc_major >= 0, the device known) compute capability 9.0, and
// has no avg or premul_sum.
NcclReduction nccl_reduction_for(DataType dtype, ReduceKind kind, int cc_major, int cc_minor);

// Why --raw-nccl cannot run `type` on `dtype` with `kind`; "" when it can.
std::string raw_nccl_refusal(plugin::OpType type, DataType dtype, ReduceKind kind, int cc_major, int cc_minor);

// Sets the fields `nccl_config` (JSON: a field's hint name -> value or null
// for unset) names, on a config from NCCL_CONFIG_INITIALIZER. String fields
// point into `strings`, which must outlive the config. Throws comms::Error
// for a name it does not know or a field the linked nccl.h lacks.
void apply_nccl_config(const nlohmann::json& nccl_config, ncclConfig_t* config, std::vector<std::string>* strings);

}  // namespace comms::bench
