#include "util/strutil.h"
#include "comms/backend_spec.h"

#include <vector>

#include "comms/error.h"
#include "comm/backend_select.h"
#include "plugins/plugin_registry.h"

namespace comms {
namespace {

uint32_t bit(DeviceType t) { return 1u << static_cast<unsigned>(t); }

std::string device_list(uint32_t mask) {
  std::vector<std::string_view> names;
  for (int t = 0; t < kNumDeviceTypes; ++t) {
    if (mask & bit(static_cast<DeviceType>(t))) names.push_back(to_string(static_cast<DeviceType>(t)));
  }
  return names.empty() ? "none" : str::join(names, ", ");
}

const PluginCapabilities* find(std::span<const PluginCapabilities> plugins, std::string_view name) {
  for (const auto& p : plugins) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

[[noreturn]] void throw_unknown_backend(std::string_view backend, std::string_view text,
                                        std::span<const PluginCapabilities> plugins) {
  std::vector<std::string> names;
  for (const auto& p : plugins) names.push_back(p.name);
  throw Error(ErrorCode::kNotFound,
              str::cat("no plugin provides backend '", backend, "' (in backend string '", text,
                           "'); available backends: ",
                           names.empty() ? "none" : str::join(names, ", ")));
}

}  // namespace

bool BackendSpec::empty() const {
  for (const auto& e : entries_) {
    if (!e.empty()) return false;
  }
  return true;
}

std::string BackendSpec::to_string() const {
  std::vector<std::string> parts;
  for (int t = 0; t < kNumDeviceTypes; ++t) {
    if (!entries_[t].empty()) {
      parts.push_back(str::cat(comms::to_string(static_cast<DeviceType>(t)), ":", entries_[t]));
    }
  }
  return str::join(parts, ",");
}

BackendSpec BackendSpec::parse(std::string_view text, std::span<const PluginCapabilities> plugins) {
  const std::string lowered = str::lower(str::strip(text));
  BackendSpec spec;
  if (lowered.empty() || lowered == "undefined") {
    spec.set(DeviceType::kCpu, "gloo");
    const auto* nccl = find(plugins, "nccl");
    if (nccl && (nccl->devices_present & bit(DeviceType::kCuda))) spec.set(DeviceType::kCuda, "nccl");
    return spec;
  }
  for (std::string_view raw_item : str::split(lowered, ',')) {
    std::string_view item = str::strip(raw_item);
    if (item.empty()) {
      throw Error(ErrorCode::kInvalidArgument,
                  str::cat("empty entry in backend string '", text,
                               "': expected 'backend' or 'device:backend' items separated by commas"));
    }
    std::vector<std::string_view> parts = str::split(item, ':');
    if (parts.size() == 1) {
      // A bare name maps to every device type its plugin supports.
      const auto* p = find(plugins, item);
      if (!p) throw_unknown_backend(item, text, plugins);
      for (int t = 0; t < kNumDeviceTypes; ++t) {
        const auto type = static_cast<DeviceType>(t);
        if (!(p->device_types & bit(type))) continue;
        if (spec.has(type)) {
          throw Error(ErrorCode::kInvalidArgument,
                      str::cat("device type '", comms::to_string(type),
                                   "' is given twice in backend string '", text, "' (by '",
                                   spec.backend_for(type), "' and '", item, "')"));
        }
        spec.set(type, std::string(item));
      }
      continue;
    }
    std::string_view device = parts.size() == 2 ? str::strip(parts[0]) : "";
    std::string_view backend = parts.size() == 2 ? str::strip(parts[1]) : "";
    if (parts.size() != 2 || device.empty() || backend.empty()) {
      throw Error(ErrorCode::kInvalidArgument,
                  str::cat("malformed entry '", item, "' in backend string '", text,
                               "': expected 'device:backend', e.g. 'cpu:gloo' or 'cuda:nccl'"));
    }
    DeviceType type;
    try {
      type = parse_device_type(device);
    } catch (const Error&) {
      throw Error(ErrorCode::kInvalidArgument,
                  str::cat("unknown device type '", device, "' in backend string '", text,
                               "': expected cpu or cuda"));
    }
    if (spec.has(type)) {
      throw Error(ErrorCode::kInvalidArgument,
                  str::cat("device type '", device, "' appears twice in backend string '",
                               text, "'"));
    }
    const auto* p = find(plugins, backend);
    if (!p) throw_unknown_backend(backend, text, plugins);
    if (!(p->device_types & bit(type))) {
      throw Error(ErrorCode::kInvalidArgument,
                  str::cat("backend '", backend, "' does not support device type '", device,
                               "' (in backend string '", text, "'); it supports: ",
                               device_list(p->device_types)));
    }
    spec.set(type, std::string(backend));
  }
  return spec;
}

BackendSpec internal::select_backends(const BackendSpec& parent, std::string_view filter, FilterAdvice advice) {
  const bool advise = advice == FilterAdvice::kCreateWorld;
  const std::string listed = parent.to_string();
  BackendSpec child;
  const std::string lowered = str::lower(filter);
  for (std::string_view raw : str::split(lowered, ',', true)) {
    const std::string_view item = str::strip(raw);
    const auto colon = item.find(':');
    const std::string backend(str::strip(colon == item.npos ? item : item.substr(colon + 1)));
    std::vector<DeviceType> types;
    if (colon == item.npos) {
      for (int i = 0; i < kNumDeviceTypes; ++i) {
        if (parent.backend_for(static_cast<DeviceType>(i)) == backend) types.push_back(static_cast<DeviceType>(i));
      }
      if (types.empty()) {
        throw Error(ErrorCode::kInvalidArgument,
                    str::cat("Requested backend '", backend, "' is not present in the parent group (parent backends: ",
                             listed, ")",
                             advise ? str::cat("; create the world with it, e.g. init_process_group({.backend = \"",
                                               listed.empty() ? backend : listed + "," + backend, "\"})")
                                    : ""));
      }
    } else {
      const DeviceType t = parse_device_type(str::strip(item.substr(0, colon)));  // kInvalidArgument
      if (!parent.has(t)) {
        throw Error(ErrorCode::kInvalidArgument,
                    str::cat("Requested backend for device '", comms::to_string(t),
                             "' is not present in the parent group (parent backends: ", listed, ")",
                             advise ? "; create the world with a backend for it, e.g. 'cpu:gloo,cuda:nccl'" : ""));
      }
      if (parent.backend_for(t) != backend) {
        throw Error(ErrorCode::kInvalidArgument,
                    str::cat("Requested backend '", backend, "' for device '", comms::to_string(t),
                             "' differs from the parent's '", parent.backend_for(t), "' (parent backends: ", listed,
                             ")"));
      }
      types.push_back(t);
    }
    for (DeviceType t : types) child.set(t, parent.backend_for(t));
  }
  return child;
}

BackendSpec BackendSpec::select(std::string_view filter) const {
  return internal::select_backends(*this, filter, internal::FilterAdvice::kNone);
}

BackendSpec BackendSpec::parse(std::string_view text) {
  const std::string lowered = str::lower(str::strip(text));
  const bool is_default = lowered.empty() || lowered == "undefined";
  auto& registry = internal::PluginRegistry::instance();
  if (!is_default) {
    // Load just the named plugins so a cpu-only program never loads nccl.
    std::vector<PluginCapabilities> named;
    for (std::string_view item : str::split(lowered, ',', true)) {
      std::vector<std::string_view> parts = str::split(item, ':');
      std::string name(str::strip(parts.back()));
      if (name.empty() || find(named, name)) continue;
      try {
        const auto& p = registry.get(name);
        named.push_back({p.name, p.descriptor->device_types, 0});
      } catch (const Error& e) {
        // A file that exists but fails to load keeps its own reason.
        if (e.code() != ErrorCode::kNotFound || !registry.find_file(name).empty()) throw;
        // Reports the string's first error with every available backend
        // listed: the ones not named are known by their file names alone
        // (no device types), so that listing opens none of them.
        std::vector<PluginCapabilities> available;
        for (auto& n : registry.available_names()) {
          const auto* loaded = find(named, n);
          available.push_back(loaded ? *loaded : PluginCapabilities{std::move(n), 0, 0});
        }
        return parse(text, available);
      }
    }
    return parse(text, named);
  }
  // The default names gloo, and nccl when it finds a device: only nccl's
  // plugin is asked, and only when its file is there.
  std::vector<PluginCapabilities> nccl;
  if (!registry.find_file("nccl").empty()) {
    try {
      nccl.push_back(registry.capabilities_of("nccl", /*probe_devices=*/true));
    } catch (const Error&) {
      // As when every plugin was listed: one that does not load is not offered.
    }
  }
  return parse(text, nccl);
}

}  // namespace comms
