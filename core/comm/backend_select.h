// The one parser of a child's backend filter against its parent's backend
// map, shared by Comm::split (BackendSpec::select) and comms::dist's
// new_group/split_group, so both accept the same filters with the same errors.
#pragma once

#include <string_view>

#include "comms/backend_spec.h"

namespace comms::internal {

// What a "not present in the parent group" error suggests besides listing
// the parent's backends: nothing (a split), or how to create the world with
// the missing backend (comms::dist, where the world is the parent).
enum class FilterAdvice { kNone, kCreateWorld };

// See BackendSpec::select. Throws comms::Error(kInvalidArgument).
BackendSpec select_backends(const BackendSpec& parent, std::string_view filter, FilterAdvice advice);

}  // namespace comms::internal
