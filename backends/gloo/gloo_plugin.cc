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

}  // namespace

extern "C" COMMS_PLUGIN_EXPORT const PluginDescriptor* comms_plugin_entry() {
  static const PluginDescriptor descriptor = {
      .name = "gloo",
      .version = COMMS_GLOO_VERSION,
      .device_types = comms::plugin::device_bit(comms::DeviceType::kCpu),
      .hint_keys = comms::gloo_backend::kHintKeys,
      .create = comms::gloo_backend::create_backend,
      .explain_hints = explain,
  };
  return &descriptor;
}
