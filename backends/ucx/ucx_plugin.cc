// The plugin entry point of libcomms-ucx.so.
#include <ucp/api/ucp.h>

#include <nlohmann/json.hpp>

#include "comms/plugin.h"
#include "ucx_backend.h"

namespace {

using comms::Status;
using comms::plugin::PluginDescriptor;

Status explain(const comms::Hints& hints, std::string* json) {
  comms::ucx_backend::UcxSettings cfg;
  Status s = comms::ucx_backend::resolve_settings(hints, 1, &cfg);
  if (!s.is_ok()) return s;
  nlohmann::ordered_json j;
  j["ucx_config"] = {{"ucx_version", ucp_get_version_string()},
                     {"tls", cfg.tls},
                     {"rndv_thresh", cfg.rndv_thresh},
                     {"busy_poll", cfg.busy_poll}};
  *json = j.dump();
  return {};
}

}  // namespace

extern "C" COMMS_PLUGIN_EXPORT const PluginDescriptor* comms_plugin_entry() {
  static const PluginDescriptor descriptor = {
      .name = "ucx",
      .version = COMMS_UCX_VERSION,
      .device_types = comms::plugin::device_bit(comms::DeviceType::kCpu),
      .hint_keys = comms::ucx_backend::kHintKeys,
      .create = comms::ucx_backend::create_backend,
      .explain_hints = explain,
  };
  return &descriptor;
}
