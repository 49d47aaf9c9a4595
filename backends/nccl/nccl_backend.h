// The NCCL backend: one NCCL communicator, one internal stream and one
// watchdog thread per comm. Reaches NCCL and CUDA only through NcclApi.
//
// Threading: submit/split/set_hints/finalize come from one thread at a time
// (the plugin contract). abort(), Work::wait/is_completed and the watchdog
// may run concurrently with them; one mutex guards the NCCL communicator.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "comms/plugin.h"
#include "nccl_api.h"
#include "nccl_hints.h"

namespace comms::nccl {

// What NCCL is asked to do for a (dtype, reduction) pair: bool travels as
// uint8 with a logical equivalent of the operator (sum/bor -> max,
// product/band -> min), fp8 needs sm_90. `reason` is empty when supported.
struct ReductionPlan {
  ncclDataType_t dtype = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  bool premul_sum = false;
  std::string reason;
};
// cc_major < 0: the device's compute capability is unknown (not checked).
ReductionPlan plan_reduction(DataType dtype, ReduceKind kind, int cc_major, int cc_minor);
// The element type used for ops that only move data (fp8 and bool as uint8).
ncclDataType_t copy_dtype(DataType dtype);

// Encodes `value` as one element of `dtype` into `out` (8 bytes), for
// ncclRedOpCreatePreMulSum's host-resident scalar.
void encode_scalar(double value, DataType dtype, void* out);

struct NcclBackendOptions {
  // How often the watchdog checks outstanding ops and NCCL's async error.
  std::chrono::milliseconds watchdog_interval{20};
};

// Validates the init (device type, hints) and builds a backend; nothing is
// connected until init().
Status create_nccl_backend(std::shared_ptr<NcclApi> api, const plugin::BackendInit& init,
                           std::unique_ptr<plugin::Backend>* out,
                           NcclBackendOptions options = {});

// The descriptor's join_grown (plugin ABI 2.7): a newcomer's backend of a
// grown comm, by ncclCommGrow with the id a member published in
// desc.child.store, when every participant votes for it there; else
// kUnsupported, having built nothing (libcomms then calls create()).
Status join_grown_nccl_backend(std::shared_ptr<NcclApi> api, const plugin::GrowDesc& desc,
                               std::unique_ptr<plugin::Backend>* out, NcclBackendOptions options = {});

// The descriptor's dry run: translate for the loaded NCCL and render JSON.
Status explain_nccl_hints(NcclApi& api, const Hints& hints, std::string* json);

}  // namespace comms::nccl
