// Every environment variable the library reads goes through here, so that
// the documented table (docs/ENVIRONMENT.md) and `comms-info` can list them
// all, and a unit test keeps the two in step.
#pragma once

#include <chrono>
#include <climits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "comms/env.h"  // get, parse_bool, get_bool: shared with the plugins

namespace comms::env {

struct Variable {
  const char* name;
  const char* default_value;  // as text; "" when unset means "not used"
  const char* description;
};

// Every variable libcomms and its tools read, in documentation order; each
// plugin declares its own (PluginDescriptor::env_variables).
// COMMS_BACKEND_LIB_<NAME> stands for the whole family.
std::span<const Variable> documented();

// Parses "250ms", "30s", "5m", "1h" or a plain number of seconds. Throws
// comms::Error(kInvalidArgument) naming `what` on anything else.
std::chrono::milliseconds parse_duration(std::string_view text, std::string_view what);

// Every set, non-empty variable whose name starts with `prefix` (a family
// such as COMMS_BACKEND_LIB_<NAME>), as (name, value) in environment order.
std::vector<std::pair<std::string, std::string>> with_prefix(std::string_view prefix);

// A documented integer variable, or `fallback` when unset. Throws
// comms::Error(kInvalidArgument) naming the variable when malformed or
// outside [min, max].
int get_int(std::string_view name, int fallback, int min = INT_MIN, int max = INT_MAX);

// A duration variable (parse_duration's syntax), or nullopt when unset.
std::optional<std::chrono::milliseconds> get_duration(std::string_view name);

// A variable that takes one of `choices` (lower case; the value is compared
// case-insensitively, blanks around ignored), returned in lower case;
// `fallback` when unset. Anything else throws, e.g. "COMMS_ROUTE='x' is not
// a route; use direct or split" for kind "a route".
std::string get_choice(std::string_view name, std::string_view fallback,
                       const std::vector<std::string_view>& choices, std::string_view kind);

}  // namespace comms::env
