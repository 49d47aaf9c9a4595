// comms-bench's --raw-nccl baseline (with --device cuda): NCCL's public API
// called directly, on a communicator of its own, with none of libcomms or
// the nccl plugin around it: no validation, no dispatch, no internal
// stream, no events, no Work. Its ncclConfig_t is the one the nccl plugin
// reports for the comm (describe()'s "nccl_config"), each op is the NCCL
// call(s) of nccl_table.h, on the bench's stream; so comms' time minus this
// one is libcomms' and the plugin's overhead together.
#pragma once

#include <chrono>
#include <memory>

#include <nlohmann/json.hpp>

#include "baseline.h"
#include "comms/store.h"

namespace comms::bench {

// Makes `device` current, exchanges a unique id through `store` (rank 0
// publishes it under "nccl/unique_id") and creates the communicator with
// `nccl_config`; collective over the job. Throws comms::Error naming what
// failed.
std::unique_ptr<Baseline> open_raw_nccl(Store& store, int rank, int size, int device, const nlohmann::json& nccl_config,
                                        std::chrono::milliseconds init_timeout, std::chrono::milliseconds op_timeout);

}  // namespace comms::bench
