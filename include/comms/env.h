// Reading environment variables the way libcomms does. libcomms, its tools
// and its plugins read every variable through these functions; plugins do not
// link libcomms, hence header-only. docs/ENVIRONMENT.md lists every variable.
// A malformed value is a comms::Error(kInvalidArgument) naming the variable,
// the value and what is accepted, e.g.
//   COMMS_HINTS_STRICT='maybe' is not a boolean; use 1/0, true/false, yes/no or on/off
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "comms/error.h"

namespace comms::env {

// The value of a variable, or nullopt when unset or empty. The one getenv of
// libcomms, its tools and its plugins.
inline std::optional<std::string> get(std::string_view name) {
  const char* v = std::getenv(std::string(name).c_str());
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

// 1/0, true/false, yes/no, on/off, in any case, blanks around ignored.
// Throws comms::Error(kInvalidArgument) naming `what` on anything else.
inline bool parse_bool(std::string_view text, std::string_view what) {
  std::string_view t = text;
  while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.remove_prefix(1);
  while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.remove_suffix(1);
  std::string s(t);
  for (char& c : s) c = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  std::string message(what);
  message.append("='").append(text).append("' is not a boolean; use 1/0, true/false, yes/no or on/off");
  throw Error(ErrorCode::kInvalidArgument, message);
}

// A boolean variable, or `fallback` when unset or empty.
inline bool get_bool(std::string_view name, bool fallback) {
  auto v = get(name);
  return v ? parse_bool(*v, name) : fallback;
}

}  // namespace comms::env
