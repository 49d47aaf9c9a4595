// The plugin entry point of libcomms-gloo.so.
#include <nlohmann/json.hpp>

#include "comms/plugin.h"
#include "gloo_backend.h"

namespace {

using comms::Status;
using comms::plugin::PluginDescriptor;

Status explain(const comms::Hints& hints, std::string* json) {
  comms::gloo_backend::GlooConfig cfg;
  // A dry run has no store connection: report what a single-host job binds.
  Status s = comms::gloo_backend::resolve_config(hints, 1, 1, "", &cfg);
  if (!s.is_ok()) return s;
  nlohmann::ordered_json j;
  j["gloo_config"] = {{"interface", cfg.interface}, {"hostname", cfg.hostname}, {"busy_poll", cfg.busy_poll}};
  *json = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // hint and name text may not be UTF-8
  return {};
}

// Every variable this plugin reads (docs/ENVIRONMENT.md lists them).
constexpr comms::plugin::EnvVariable kEnvVariables[] = {
    {"COMMS_GLOO_IFNAME", "", "Gloo: network interface to bind (e.g. eth0); it must exist and have an IPv4 or IPv6 address. Hint gloo.interface wins over it."},
    {"COMMS_GLOO_HOSTNAME", "", "Gloo: host name or address to bind; it must resolve to an address of one of this host's interfaces. Hint gloo.hostname wins over it. Unset (and no interface): the address this process uses to reach the TCP store, else 127.0.0.1."},
    {"COMMS_GLOO_BUSY_POLL", "auto", "Gloo: how reads on the sync mesh (all_reduce, small broadcast, barrier) wait. auto: spin up to 100 us, yielding, then block, when the ranks on this host are at most its cores, else block; 1 (or another true boolean): spin until the data arrives; 0: block at once. Hint gloo.busy_poll wins over it."},
    {nullptr, nullptr, nullptr},
};

}  // namespace

extern "C" COMMS_PLUGIN_EXPORT const PluginDescriptor* comms_plugin_entry() {
  static const PluginDescriptor descriptor = {
      .name = "gloo",
      .version = COMMS_GLOO_VERSION,
      .device_types = comms::plugin::device_bit(comms::DeviceType::kCpu),
      .hint_keys = comms::gloo_backend::kHintKeys,
      .create = comms::gloo_backend::create_backend,
      .explain_hints = explain,
      .env_variables = kEnvVariables,
  };
  return &descriptor;
}
