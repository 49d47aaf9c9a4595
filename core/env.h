// Every environment variable the library reads goes through here, so that
// the documented table (docs/ENVIRONMENT.md) and `comms-info` can list them
// all, and a unit test keeps the two in step.
#pragma once

#include <chrono>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace comms::env {

struct Variable {
  const char* name;
  const char* default_value;  // as text; "" when unset means "not used"
  const char* description;
};

// Every variable the library and its tools read, in documentation order.
// COMMS_BACKEND_LIB_<NAME> stands for the whole family.
std::span<const Variable> documented();

// The value of a documented variable, or nullopt when unset or empty.
std::optional<std::string> get(std::string_view name);

// Parses "250ms", "30s", "5m", "1h" or a plain number of seconds. Throws
// comms::Error(kInvalidArgument) naming `what` on anything else.
std::chrono::milliseconds parse_duration(std::string_view text, std::string_view what);

// A documented integer variable, or `fallback` when unset. Throws
// comms::Error(kInvalidArgument) naming the variable when malformed.
int get_int(std::string_view name, int fallback);

}  // namespace comms::env
