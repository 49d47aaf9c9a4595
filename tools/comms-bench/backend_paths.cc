#include "backend_paths.h"

namespace comms::bench {

BackendPaths BackendPaths::from_describe(const nlohmann::json& described, DeviceType device) {
  const nlohmann::json::json_pointer at("/backends/" + std::string(to_string(device)) + "/config/paths");
  if (!described.contains(at)) return {};
  return BackendPaths(described.at(at));
}

std::string BackendPaths::path(std::string_view op, size_t bytes_per_rank) const {
  if (!paths_.is_object()) return {};
  const auto entries = paths_.find(std::string(op));
  if (entries == paths_.end() || !entries->is_array()) return {};
  for (const auto& e : *entries) {
    if (!e.is_object() || !e.contains("path") || !e["path"].is_string()) return {};
    const auto bound = e.find("max_bytes");
    if (bound == e.end() || bound->is_null()) return e["path"].get<std::string>();
    if (!bound->is_number_unsigned()) return {};
    if (bytes_per_rank <= bound->get<size_t>()) return e["path"].get<std::string>();
  }
  return {};
}

std::optional<int64_t> zero_copy_ops(const nlohmann::json& described, DeviceType device) {
  const nlohmann::json::json_pointer at("/backends/" + std::string(to_string(device)) + "/config/zero_copy/ops");
  if (!described.contains(at) || !described.at(at).is_number_integer()) return std::nullopt;
  return described.at(at).get<int64_t>();
}

}  // namespace comms::bench
