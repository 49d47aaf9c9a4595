// What this libcomms finds and how it would configure itself, for tools and
// diagnostics (comms-info, comms-bench, comms-conformance use these).
#pragma once

#include "comms/export.h"

#include <optional>
#include <string>
#include <vector>

#include "comms/backend_spec.h"
#include "comms/options.h"
#include "comms/types.h"

namespace comms {

// One backend plugin: what its descriptor says, or why it cannot be loaded.
struct PluginInfo {
  std::string name;
  std::string path;
  std::string version;              // of the plugin and the library it wraps
  std::vector<DeviceType> devices;  // device types it supports
  std::vector<std::string> hint_keys;
  std::string error;                // non-empty: not loadable, and why
  // What the backend claims to implement (PluginDescriptor::capabilities):
  // op names as plugin::op_name gives them ("all_reduce", "send", ...), data
  // types and reductions. A plugin that declares nothing claims everything
  // (declares_capabilities false, every list full).
  bool declares_capabilities = false;
  std::vector<std::string> ops;
  std::vector<DataType> dtypes;
  std::vector<ReduceKind> reductions;
};

// Every plugin in the search path, each loaded; failures are reported in
// PluginInfo::error, not thrown.
COMMS_API std::vector<PluginInfo> list_plugins();

// The directories searched for plugins, in order (COMMS_PLUGIN_PATH, next to
// libcomms, the build tree).
COMMS_API std::vector<std::string> plugin_search_path();

// Loads a plugin from an exact file; its name comes from its descriptor and
// it wins over the search path afterwards. Throws Error(kInvalidArgument)
// for a file that is not a comms plugin or has another ABI version.
COMMS_API PluginInfo load_plugin(const std::string& path);

// The named backend's plugin, loaded from the search path (Error(kNotFound)
// if there is none).
COMMS_API PluginInfo plugin_info(const std::string& backend);

// Devices of `type` the named backend reports usable now: 0 if none or the
// type is not supported, -1 if the plugin does not count devices. Loads the
// plugin (Error(kNotFound) if there is none); may initialise a device runtime.
COMMS_API int plugin_device_count(const std::string& backend, DeviceType type);

// A dry run of creation hints: routes them like a comm would and returns, as
// one JSON object, the configuration each backend of `spec` would take. No
// comm, connection or device is created. Throws like new_comm for bad hints;
// messages name the would-be comm `comm_name`.
COMMS_API std::string explain_hints(const BackendSpec& spec, const Hints& hints,
                                    const std::string& comm_name = "explain_hints");

// One environment variable the library reads, with its value in this process.
struct EnvironmentEntry {
  std::string name;
  std::optional<std::string> value;  // nullopt: unset; secrets read "(set, not shown)"
};

// Every documented variable (docs/ENVIRONMENT.md): libcomms' own, then those
// each plugin found declares (PluginDescriptor::env_variables; this opens
// every plugin, as comms-info does), then each set COMMS_BACKEND_LIB_<NAME>.
COMMS_API std::vector<EnvironmentEntry> environment();

}  // namespace comms
