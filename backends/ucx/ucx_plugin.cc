// The plugin entry point of libcomms-ucx.so.
#include <ucp/api/ucp.h>

#include <nlohmann/json.hpp>

#include "comms/plugin.h"
#include "ucx_backend.h"
#include "ucx_log.h"
#include "ucx_transport.h"

namespace {

using comms::Status;
using comms::plugin::PluginDescriptor;

Status explain(const comms::Hints& hints, std::string* json) {
  comms::ucx_backend::UcxSettings cfg;
  Status s = comms::ucx_backend::resolve_settings(hints, 1, &cfg);
  if (!s.is_ok()) return s;
  // The devices a context opens with these settings (UCX_TLS applies):
  // what a comm would choose its transports from.
  std::string devices;
  try {
    const comms::ucx_backend::QuietUcxLogs quiet;
    comms::ucx_backend::UcxTransport probe(0, 1, cfg, nullptr);
    devices = probe.devices();
  } catch (const std::exception& e) {
    return {comms::ErrorCode::kInvalidArgument, std::string("UCX cannot start with these settings: ") + e.what()};
  }
  if (devices.empty()) {
    return {comms::ErrorCode::kInvalidArgument,
            "UCX opened no device with tls '" + (cfg.tls.empty() ? std::string("(UCX_TLS or default)") : cfg.tls) + "'"};
  }
  nlohmann::ordered_json j;
  j["ucx_config"] = {{"ucx_version", ucp_get_version_string()},
                     {"tls", cfg.tls.empty() ? "(UCX_TLS or UCX's default)" : cfg.tls},
                     {"rndv_thresh", comms::ucx_backend::rndv_thresh_text(cfg)},
                     {"shm_fifo", comms::ucx_backend::fifo_text()},
                     {"busy_poll", cfg.busy_poll},
                     {"devices", devices}};
  *json = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // hint and name text may not be UTF-8
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
