#include "plugins/plugin_registry.h"

#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>

#include "util/strutil.h"
#include "comms/error.h"
#include "config/env.h"

namespace comms::internal {
namespace {

constexpr std::string_view kFilePrefix = "libcomms-";
constexpr std::string_view kFileSuffix = ".so";

bool is_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string dirname_of(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// Where this libcomms.so lives, so the installed plugin directory can be
// found relative to it (relocatable installs).
std::string libcomms_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&libcomms_dir), &info) && info.dli_fname) {
    char resolved[4096];
    if (realpath(info.dli_fname, resolved)) return dirname_of(resolved);
    return dirname_of(info.dli_fname);
  }
  return {};
}

constexpr std::string_view kLibVariablePrefix = "COMMS_BACKEND_LIB_";

std::string env_lib_variable(std::string_view name) {
  return str::cat(kLibVariablePrefix, str::upper(name));
}

// "2.0"; the unversioned ABI 1 (no minor, no struct_size) prints as "1".
std::string abi_string(uint32_t v) {
  if (plugin::abi_major(v) == 0) return std::to_string(v);
  return str::cat(plugin::abi_major(v), ".", plugin::abi_minor(v));
}

// Why a plugin declaring `v` is refused, or "" when it is accepted: the same
// major, and a minor this libcomms knows (a newer plugin may rely on what
// this libcomms does not provide).
std::string abi_refusal(uint32_t v) {
  const std::string ours = abi_string(COMMS_PLUGIN_ABI_VERSION);
  if (plugin::abi_major(v) != COMMS_PLUGIN_ABI_MAJOR) {
    return str::cat("was built for plugin ABI version ", abi_string(v),
                    ", but this libcomms implements ABI version ", ours,
                    " (a different major is incompatible); rebuild the plugin against this "
                    "version's include/comms/plugin.h");
  }
  if (plugin::abi_minor(v) > COMMS_PLUGIN_ABI_MINOR) {
    return str::cat("was built for plugin ABI version ", abi_string(v),
                    ", newer than this libcomms' ABI version ", ours,
                    " (it accepts ", COMMS_PLUGIN_ABI_MAJOR, ".0 to ", ours,
                    "); use a newer libcomms or build the plugin against this one's "
                    "include/comms/plugin.h");
  }
  return {};
}

// A plugin's system libraries and the Debian packages that provide them,
// in its sidecar file <plugin>.packages (one "libfoo.so.N package" a line;
// each backend's meson.build writes its own). When dlopen fails because one
// of them is missing, the error says what to install.
std::string missing_package_hint(const std::string& plugin_path, std::string_view why) {
  constexpr std::string_view kMissing = ": cannot open shared object file";
  const auto at = why.find(kMissing);
  if (at == std::string_view::npos) return {};
  const std::string_view library = why.substr(0, at);
  std::ifstream sidecar(plugin_path + ".packages");
  std::string line;
  while (std::getline(sidecar, line)) {
    const auto fields = str::split(line, ' ', /*skip_empty=*/true);
    if (fields.size() != 2 || fields[0].starts_with('#')) continue;
    const std::string soname(fields[0]), package(fields[1]);
    if (soname == library) {
      return str::cat("; ", soname, " comes with the Debian package ", package, " (apt-get install ",
                      package, ")");
    }
  }
  return {};
}

}  // namespace

PluginRegistry& PluginRegistry::instance() {
  static PluginRegistry* registry = new PluginRegistry();  // never destroyed: plugins stay loaded
  return *registry;
}

std::vector<std::string> PluginRegistry::search_dirs() const {
  std::vector<std::string> dirs;
  if (auto path = env::get("COMMS_PLUGIN_PATH")) {
    for (auto& d : str::split(*path, ':', true)) dirs.emplace_back(d);
  }
  const std::string here = libcomms_dir();
  if (!here.empty()) dirs.push_back(here + "/" COMMS_INSTALL_PLUGIN_SUBDIR);
#ifdef COMMS_BUILD_ROOT
  // Running from the build tree (libcomms.so, or a program that links core
  // statically): use the plugins built there.
  char build_root[4096];
  if (!here.empty() && realpath(COMMS_BUILD_ROOT, build_root) &&
      (here == build_root || here.starts_with(str::cat(build_root, "/")))) {
    for (auto& d : str::split(COMMS_BUILD_PLUGIN_DIRS, ':', true)) {
      dirs.emplace_back(d);
    }
  }
#endif
  return dirs;
}

std::string PluginRegistry::find_file(std::string_view name) const {
  if (auto exact = env::get(env_lib_variable(name))) return *exact;
  const std::string file = str::cat(kFilePrefix, name, kFileSuffix);
  for (const auto& dir : search_dirs()) {
    std::string candidate = dir + "/" + file;
    if (is_file(candidate)) return candidate;
  }
  return {};
}

LoadedPlugin* PluginRegistry::open_locked(const std::string& expected_name,
                                         const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    const std::string why = error ? error : "unknown error";
    throw Error(ErrorCode::kNotFound, str::cat("cannot load plugin '", path, "': ", why,
                                               missing_package_hint(path, why)));
  }
  auto entry = reinterpret_cast<comms_plugin_entry_fn>(dlsym(handle, COMMS_PLUGIN_ENTRY_SYMBOL));
  if (entry == nullptr) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("'", path, "' is not a comms plugin: it does not export ",
                         COMMS_PLUGIN_ENTRY_SYMBOL, " (with hidden visibility, declare it "
                         "COMMS_PLUGIN_EXPORT)"));
  }
  const plugin::PluginDescriptor* d = entry();
  if (d == nullptr) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("plugin '", path, "' returned no descriptor"));
  }
  // abi_version is the one word every ABI version has at offset 0; read it
  // before anything else.
  if (const std::string refused = abi_refusal(d->abi_version); !refused.empty()) {
    throw Error(ErrorCode::kInvalidArgument, str::cat("plugin '", path, "' ", refused));
  }
  if (d->struct_size < plugin::kMinDescriptorSize) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("plugin '", path, "' declares a descriptor of ", d->struct_size,
                         " bytes, smaller than the ", plugin::kMinDescriptorSize,
                         " bytes of ABI ", abi_string(d->abi_version), "'s required entries"));
  }
  auto loaded = std::make_unique<LoadedPlugin>();
  // Only the prefix the plugin declared: entries past it stay null (absent).
  std::memcpy(&loaded->entries, d, std::min<size_t>(d->struct_size, sizeof(plugin::PluginDescriptor)));
  loaded->descriptor = &loaded->entries;
  const plugin::PluginDescriptor& e = loaded->entries;
  if (e.name == nullptr || e.create == nullptr) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("plugin '", path, "' has an incomplete descriptor (no name or create)"));
  }
  loaded->name = str::lower(e.name);
  // Plugins are found by file name without being opened, so the name a file
  // is found under must be the one its descriptor declares.
  if (!expected_name.empty() && loaded->name != expected_name) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("plugin file '", path, "' provides backend '", loaded->name,
                         "', not the requested '", expected_name, "': plugins are found by file name (",
                         kFilePrefix, "<backend>", kFileSuffix, "), so name it ", kFilePrefix, loaded->name,
                         kFileSuffix, " or point ", env_lib_variable(loaded->name), " at it"));
  }
  loaded->path = path;
  entries_.push_back(std::move(loaded));
  return entries_.back().get();
}

const LoadedPlugin& PluginRegistry::load_locked(const std::string& expected_name,
                                                const std::string& path) {
  LoadedPlugin* p = open_locked(expected_name, path);
  return *by_name_.try_emplace(p->name, p).first->second;
}

const LoadedPlugin& PluginRegistry::get(std::string_view raw_name) {
  const std::string name = str::lower(raw_name);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = by_name_.find(name); it != by_name_.end()) return *it->second;
    const std::string path = find_file(name);
    if (!path.empty()) {
      const std::string variable = env_lib_variable(name);
      try {
        return load_locked(name, path);
      } catch (const Error& e) {
        if (env::get(variable) != path) throw;
        throw Error(e.code(), str::cat(variable, "='", path, "': ", e.what()));
      }
    }
  }
  const std::vector<std::string> available = available_names();
  throw Error(ErrorCode::kNotFound,
              str::cat("no plugin provides backend '", name, "' (looked for ", kFilePrefix,
                           name, kFileSuffix, " in ", env_lib_variable(name), " and ",
                           str::join(search_dirs(), ":"), "); available backends: ",
                           available.empty() ? "none" : str::join(available, ", ")));
}

const LoadedPlugin& PluginRegistry::load_file(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& p : entries_) {
    if (p->path == path) {
      by_name_[p->name] = p.get();
      return *p;
    }
  }
  // Under its own name, for later lookups; an earlier entry of that name is
  // only unmapped, never freed (live comms point to it).
  LoadedPlugin* p = open_locked("", path);
  by_name_[p->name] = p;
  return *p;
}

std::vector<std::pair<std::string, std::string>> PluginRegistry::candidates() {
  std::vector<std::pair<std::string, std::string>> out;  // name, path
  std::set<std::string> seen;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [name, p] : by_name_) {
      if (seen.insert(name).second) out.emplace_back(name, p->path);
    }
  }
  for (auto& [variable, path] : env::with_prefix(kLibVariablePrefix)) {
    std::string name = str::lower(std::string_view(variable).substr(kLibVariablePrefix.size()));
    if (seen.insert(name).second) out.emplace_back(name, path);
  }
  for (const auto& dir : search_dirs()) {
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) continue;
    std::vector<std::string> files;
    while (dirent* ent = readdir(d)) {
      std::string_view f(ent->d_name);
      if (f.starts_with(kFilePrefix) && f.ends_with(kFileSuffix)) files.emplace_back(f);
    }
    closedir(d);
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::string name = f.substr(kFilePrefix.size(), f.size() - kFilePrefix.size() - kFileSuffix.size());
      if (seen.insert(name).second) out.emplace_back(name, dir + "/" + f);
    }
  }
  return out;
}

std::vector<std::string> PluginRegistry::available_names() {
  std::vector<std::string> names;
  for (auto& [name, path] : candidates()) names.push_back(std::move(name));
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<DiscoveredPlugin> PluginRegistry::discover() {
  const auto candidates = this->candidates();
  std::vector<DiscoveredPlugin> out;
  for (auto& [name, path] : candidates) {
    DiscoveredPlugin p{name, path, nullptr, {}};
    try {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = by_name_.find(name);
      p.descriptor = it != by_name_.end() ? it->second->descriptor : load_locked(name, path).descriptor;
    } catch (const Error& e) {
      p.error = e.what();
    }
    out.push_back(std::move(p));
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.name < b.name; });
  return out;
}

std::vector<PluginVariable> PluginRegistry::env_variables() {
  std::vector<PluginVariable> out;
  for (const auto& p : discover()) {
    if (!p.descriptor || !p.descriptor->env_variables) continue;
    for (const plugin::EnvVariable* v = p.descriptor->env_variables; v->name; ++v) {
      const bool seen = std::any_of(out.begin(), out.end(), [&](const auto& o) { return o.name == v->name; });
      if (!seen) out.push_back({p.name, v->name, v->default_value ? v->default_value : "", v->description ? v->description : ""});
    }
  }
  return out;
}

namespace {

PluginCapabilities capabilities_from(const std::string& name, const plugin::PluginDescriptor& d,
                                     bool probe_devices) {
  PluginCapabilities c{name, d.device_types, 0};
  if (!probe_devices) return c;
  for (int t = 0; t < kNumDeviceTypes; ++t) {
    const auto type = static_cast<DeviceType>(t);
    if (!(c.device_types & plugin::device_bit(type))) continue;
    int n = 1;
    if (d.device_count) {
      try {
        n = d.device_count(type);
      } catch (...) {
        n = 0;
      }
    }
    if (n > 0) c.devices_present |= plugin::device_bit(type);
  }
  return c;
}

}  // namespace

std::vector<PluginCapabilities> PluginRegistry::capabilities(bool probe_devices) {
  std::vector<PluginCapabilities> caps;
  for (const auto& p : discover()) {
    if (p.descriptor) caps.push_back(capabilities_from(p.name, *p.descriptor, probe_devices));
  }
  return caps;
}

PluginCapabilities PluginRegistry::capabilities_of(std::string_view name, bool probe_devices) {
  const LoadedPlugin& p = get(name);
  return capabilities_from(p.name, *p.descriptor, probe_devices);
}

}  // namespace comms::internal
