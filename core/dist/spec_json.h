// Group specs and model-parallel configs as JSON: what the members of a
// growing world send a newcomer through the store, so that its group list
// replays the same (internal).
#pragma once

#include <nlohmann/json.hpp>

#include "comms/dist.h"
#include "comms/parallel.h"

namespace comms::dist {

nlohmann::json options_to_json(const BackendOptions& options);
BackendOptions options_from_json(const nlohmann::json& j);

nlohmann::json spec_to_json(const GroupSpec& spec);
GroupSpec spec_from_json(const nlohmann::json& j);

nlohmann::json config_to_json(const ParallelConfig& config);
ParallelConfig config_from_json(const nlohmann::json& j);

}  // namespace comms::dist
