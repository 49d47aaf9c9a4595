// Routing user hints to the backends of a comm ("gloo.x" to gloo, a bare key
// to the one backend that knows it), checked against each plugin's key table.
#include <map>
#include <set>

#include "comm/comm_impl.h"
#include "config/env.h"
#include "util/log.h"
#include "util/strutil.h"

namespace comms::internal {

std::array<Hints, kNumDeviceTypes> route_hints(const Hints& hints, const BackendSpec& spec,
                                               std::string_view comm_name) {
  std::array<Hints, kNumDeviceTypes> routed;
  // Read before the early return so that a malformed value is reported
  // whether or not this comm has hints.
  const bool strict = env::get_bool("COMMS_HINTS_STRICT", true);
  if (hints.empty()) return routed;
  auto& registry = PluginRegistry::instance();

  auto knows = [](const LoadedPlugin& p, std::string_view key) {
    for (const char* const* k = p.descriptor->hint_keys; k && *k; ++k) {
      if (key == *k) return true;
    }
    return false;
  };
  auto reject = [&](const std::string& message) {
    if (strict) throw Error(ErrorCode::kInvalidArgument, message);
    log::warning(str::cat(message, " (ignored: COMMS_HINTS_STRICT is off)"));
  };

  std::map<std::pair<size_t, std::string>, std::string> given_as;  // (device type, bare key) -> key
  for (const auto& [key, value] : hints) {
    std::vector<DeviceType> targets;
    std::string bare = key;
    if (auto dot = key.find('.'); dot != std::string::npos) {
      const std::string prefix = key.substr(0, dot);
      bare = key.substr(dot + 1);
      for (int t = 0; t < kNumDeviceTypes; ++t) {
        if (spec.backend_for(static_cast<DeviceType>(t)) == prefix) targets.push_back(static_cast<DeviceType>(t));
      }
      if (targets.empty()) {
        reject(str::cat("hint '", key, "' is for backend '", prefix, "', which comm '", comm_name,
                            "' does not have (backends: ", spec.to_string(), ")"));
        continue;
      }
      const auto& p = registry.get(prefix);
      if (!knows(p, bare)) {
        std::vector<std::string> keys;
        for (const char* const* k = p.descriptor->hint_keys; k && *k; ++k) keys.emplace_back(*k);
        reject(str::cat("unknown hint '", key, "' for backend '", prefix,
                            "'; it accepts: ", keys.empty() ? "none" : str::join(keys, ", ")));
        continue;
      }
    } else {
      std::set<std::string> knowers;
      for (int t = 0; t < kNumDeviceTypes; ++t) {
        const auto type = static_cast<DeviceType>(t);
        if (!spec.has(type)) continue;
        if (knows(registry.get(spec.backend_for(type)), key)) {
          targets.push_back(type);
          knowers.insert(spec.backend_for(type));
        }
      }
      if (knowers.size() > 1) {
        throw Error(ErrorCode::kInvalidArgument,
                    str::cat("hint '", key, "' is known to several backends of comm '", comm_name,
                                 "' (", str::join(knowers, ", "),
                                 "); prefix it with the backend, e.g. '", *knowers.begin(), ".", key,
                                 "'"));
      }
      if (targets.empty()) {
        reject(str::cat("unknown hint '", key, "': no backend of comm '", comm_name,
                            "' (", spec.to_string(), ") accepts it"));
        continue;
      }
    }
    for (DeviceType t : targets) {
      // "max_ctas" and "nccl.max_ctas" name the same setting: one must not
      // silently win over the other.
      auto [it, fresh] = given_as.try_emplace({static_cast<size_t>(t), bare}, key);
      if (!fresh) {
        throw Error(ErrorCode::kInvalidArgument,
                    str::cat("hints '", it->second, "' and '", key, "' of comm '", comm_name, "' both set ",
                             spec.backend_for(t), "'s '", bare, "'; give it once"));
      }
      routed[static_cast<size_t>(t)][bare] = value;
    }
  }
  return routed;
}

}  // namespace comms::internal
