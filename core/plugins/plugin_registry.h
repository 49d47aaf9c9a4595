// Finds, loads and caches backend plugins (libcomms-<name>.so). Search order
// for a name: COMMS_BACKEND_LIB_<NAME>, then each COMMS_PLUGIN_PATH
// directory, then <dir of libcomms>/comms (installed), then the build tree's
// backends/* when libcomms runs from the build tree. A plugin is opened only
// when a backend string names it (its file name says which backend it
// provides): opening one runs its libraries' constructors, e.g. UCX's
// memory hooks, in every process that loads it. Only discover() opens all.
// Plugins are never unloaded.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "comms/backend_spec.h"
#include "comms/plugin.h"

namespace comms::internal {

// One loaded plugin. Never freed or moved once created: comms keep a
// pointer to it for their whole life.
struct LoadedPlugin {
  std::string name;
  std::string path;
  // The plugin's descriptor as this libcomms reads it: the prefix the
  // plugin's struct_size covers, entries past it null (absent). Points into
  // `entries`; abi_version and struct_size are the plugin's own, so a
  // Backend method added in minor N is called only when
  // plugin::abi_minor(descriptor->abi_version) >= N.
  const plugin::PluginDescriptor* descriptor = nullptr;
  plugin::PluginDescriptor entries;

  LoadedPlugin() = default;
  LoadedPlugin(const LoadedPlugin&) = delete;
  LoadedPlugin& operator=(const LoadedPlugin&) = delete;
};

struct DiscoveredPlugin {
  std::string name;
  std::string path;
  const plugin::PluginDescriptor* descriptor = nullptr;  // null when loading failed
  std::string error;                                      // why loading failed
};

// An environment variable a plugin declares (PluginDescriptor::env_variables).
struct PluginVariable {
  std::string plugin;
  std::string name;
  std::string default_value;
  std::string description;
};

class PluginRegistry {
 public:
  static PluginRegistry& instance();

  // Loads the plugin once. Throws Error(kNotFound) listing the available
  // backends, or Error(kInvalidArgument) for an ABI mismatch naming both
  // versions (or a file that is not a comms plugin).
  const LoadedPlugin& get(std::string_view name);

  // Every plugin in the search path, loaded; failures reported, not thrown.
  // For listings (comms-info): a job's process opens only what it names.
  std::vector<DiscoveredPlugin> discover();

  // The variables every loadable plugin declares, by plugin name, each once:
  // discover()'s plugins, so every one is opened.
  std::vector<PluginVariable> env_variables();

  // The backend names the plugin files found provide, sorted, without
  // opening any: for the "available backends" of an error.
  std::vector<std::string> available_names();

  // Capabilities of every loadable plugin (each one opened). devices_present
  // is filled only when `probe_devices` (it may initialise a device runtime).
  std::vector<PluginCapabilities> capabilities(bool probe_devices);
  // The same for the plugin of one backend, loading only it (get()'s errors).
  PluginCapabilities capabilities_of(std::string_view name, bool probe_devices);

  // The directories searched, in order.
  std::vector<std::string> search_dirs() const;

  // The file that would be loaded for `name`, or "" if none exists.
  std::string find_file(std::string_view name) const;

  // Loads a plugin from an exact file (comms-conformance --plugin). Its name
  // comes from its descriptor; it wins over the search path afterwards (an
  // earlier plugin of that name stays loaded for the comms that use it).
  const LoadedPlugin& load_file(const std::string& path);

 private:
  // Opens and checks the file, adds a new entry (never replacing one) and
  // returns it; the caller decides whether it becomes the one for its name.
  LoadedPlugin* open_locked(const std::string& expected_name, const std::string& path);
  const LoadedPlugin& load_locked(const std::string& name, const std::string& path);
  // (name, path) of every plugin file found, loaded ones first, unopened.
  std::vector<std::pair<std::string, std::string>> candidates();

  std::mutex mu_;
  std::vector<std::unique_ptr<LoadedPlugin>> entries_;      // owns every entry, forever
  std::unordered_map<std::string, LoadedPlugin*> by_name_;  // which entry a name means now
};

}  // namespace comms::internal
