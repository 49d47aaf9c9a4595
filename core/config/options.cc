#include "util/strutil.h"
#include "comms/error.h"
#include "comms/options.h"

namespace comms {

Hints parse_hints(const std::string& text) {
  Hints hints;
  for (std::string_view item : str::split(text, ',', true)) {
    item = str::strip(item);
    auto eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  str::cat("bad hint '", item, "' in '", text, "': expected key=value"));
    }
    std::string key(str::strip(item.substr(0, eq)));
    if (hints.count(key)) {
      throw Error(ErrorCode::kInvalidArgument,
                  str::cat("hint '", key, "' is given twice in '", text, "'; give each hint once"));
    }
    hints[std::move(key)] = std::string(str::strip(item.substr(eq + 1)));
  }
  return hints;
}

std::string format_hints(const Hints& hints) {
  std::string out;
  for (const auto& [k, v] : hints) str::append(out, out.empty() ? "" : ",", k, "=", v);
  return out;
}

}  // namespace comms
