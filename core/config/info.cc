// The public introspection calls (comms/info.h) and the Comm accessors that
// expose its bootstrap: thin wrappers over the registry, the hint router and
// the environment table.
#include "comms/info.h"

#include <nlohmann/json.hpp>

#include "comm/comm_impl.h"
#include "config/env.h"
#include "util/json_text.h"
#include "plugins/plugin_registry.h"
#include "util/strutil.h"

namespace comms {
namespace {

PluginInfo info_of(const std::string& name, const std::string& path,
                   const plugin::PluginDescriptor* d, const std::string& error) {
  PluginInfo info;
  info.name = name;
  info.path = path;
  info.error = error;
  if (!d) return info;
  info.version = d->version ? d->version : "";
  for (int t = 0; t < kNumDeviceTypes; ++t) {
    if (d->device_types & plugin::device_bit(static_cast<DeviceType>(t))) {
      info.devices.push_back(static_cast<DeviceType>(t));
    }
  }
  for (const char* const* k = d->hint_keys; k && *k; ++k) info.hint_keys.emplace_back(*k);
  // Null for a plugin of ABI 2.0 (the registry copies only its prefix).
  const plugin::Capabilities claims = d->capabilities ? *d->capabilities : plugin::Capabilities{};
  info.declares_capabilities = d->capabilities != nullptr;
  for (int t = 0; t < plugin::kNumOpTypes; ++t) {
    if (claims.ops & plugin::op_bit(static_cast<plugin::OpType>(t))) {
      info.ops.emplace_back(plugin::op_name(static_cast<plugin::OpType>(t)));
    }
  }
  for (int t = 0; t < kNumDataTypes; ++t) {
    if (claims.dtypes & plugin::dtype_bit(static_cast<DataType>(t))) info.dtypes.push_back(static_cast<DataType>(t));
  }
  for (int k = 0; k < kNumReduceKinds; ++k) {
    if (claims.reductions & plugin::reduce_bit(static_cast<ReduceKind>(k))) {
      info.reductions.push_back(static_cast<ReduceKind>(k));
    }
  }
  return info;
}

}  // namespace

int Comm::local_rank() const { return internal::CommAccess::impl(*this).config().local_rank; }
int Comm::local_size() const { return internal::CommAccess::impl(*this).config().local_size; }
std::shared_ptr<Store> Comm::store() const { return internal::CommAccess::impl(*this).config().store; }

std::vector<PluginInfo> list_plugins() {
  std::vector<PluginInfo> out;
  for (const auto& p : internal::PluginRegistry::instance().discover()) {
    out.push_back(info_of(p.name, p.path, p.descriptor, p.error));
  }
  return out;
}

std::vector<std::string> plugin_search_path() {
  return internal::PluginRegistry::instance().search_dirs();
}

PluginInfo load_plugin(const std::string& path) {
  const auto& p = internal::PluginRegistry::instance().load_file(path);
  return info_of(p.name, p.path, p.descriptor, "");
}

PluginInfo plugin_info(const std::string& backend) {
  const auto& p = internal::PluginRegistry::instance().get(backend);
  return info_of(p.name, p.path, p.descriptor, "");
}

int plugin_device_count(const std::string& backend, DeviceType type) {
  const auto* d = internal::PluginRegistry::instance().get(backend).descriptor;
  if (!(d->device_types & plugin::device_bit(type))) return 0;
  return d->device_count ? d->device_count(type) : -1;
}

std::string explain_hints(const BackendSpec& spec, const Hints& hints, const std::string& comm_name) {
  auto routed = internal::route_hints(hints, spec, comm_name);
  nlohmann::json out = nlohmann::json::object();
  for (int t = 0; t < kNumDeviceTypes; ++t) {
    const auto type = static_cast<DeviceType>(t);
    if (!spec.has(type)) continue;
    const auto& plugin = internal::PluginRegistry::instance().get(spec.backend_for(type));
    if (!plugin.descriptor->explain_hints) {
      if (!routed[t].empty()) {
        throw Error(ErrorCode::kUnsupported,
                    str::cat("backend '", plugin.name, "' cannot explain hints without a comm"));
      }
      continue;
    }
    std::string text;
    Status s = plugin.descriptor->explain_hints(routed[t], &text);
    if (!s.is_ok()) throw Error(s.code, str::cat(plugin.name, ": ", s.message));
    nlohmann::json explained;  // items() must not outlive it
    try {
      explained = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw Error(ErrorCode::kInternal, str::cat("plugin '", plugin.name, "' explained hints as invalid JSON (",
                                                 e.what(), "): ", text));
    }
    for (auto& [k, v] : explained.items()) out[k] = v;
  }
  return json_text(out);
}

std::vector<EnvironmentEntry> environment() {
  std::vector<EnvironmentEntry> out;
  for (const auto& v : env::documented()) {
    std::string name = v.name;
    if (name.find('<') != std::string::npos) continue;  // a family, listed below
    auto value = env::get(name);
    // A secret is shown as set, never returned: this ends up in logs.
    if (value && name == "COMMS_STORE_TOKEN") value = "(set, not shown)";
    out.push_back({name, value});
  }
  // The plugins' own variables, as each declares them.
  for (const auto& v : internal::PluginRegistry::instance().env_variables()) out.push_back({v.name, env::get(v.name)});
  for (const auto& [name, value] : env::with_prefix("COMMS_BACKEND_LIB_")) out.push_back({name, value});
  return out;
}

}  // namespace comms
