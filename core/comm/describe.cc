// Comm::describe(): the effective configuration as JSON. Safe from any
// thread; a plugin whose describe() fails gives its error in place of its
// config rather than failing the call (describe is a diagnostic, and logged
// by new_comm and split).
#include <nlohmann/json.hpp>

#include "comm/comm_impl.h"
#include "util/json_text.h"
#include "util/strutil.h"

namespace comms {

std::string Comm::Impl::describe() const {
  using nlohmann::json;
  json j;
  j["name"] = config_.name;
  j["rank"] = config_.rank;
  j["size"] = config_.size;
  j["backend"] = config_.spec.to_string();
  j["device"] = config_.bound_device ? json(config_.bound_device->to_string()) : json(nullptr);
  j["init_timeout_ms"] = config_.init_timeout.count();
  {
    std::lock_guard<std::mutex> lock(config_mu_);
    j["op_timeout_ms"] = config_.op_timeout.count();
    j["hints"] = json::object();
    for (const auto& [k, v] : config_.hints) j["hints"][k] = v;
  }
  j["abort_process_on_error"] = config_.abort_process_on_error;
  j["elastic"] = config_.elastic;
  json backends = json::object();
  std::lock_guard<std::mutex> lock(state_mu_);
  for (int i = 0; i < kNumDeviceTypes; ++i) {
    const DeviceBackend& s = device_backends_[i];
    if (s.state.load() == BackendState::kAbsent && !s.plugin) continue;
    json b;
    b["backend"] = s.plugin ? s.plugin->name : "";
    b["plugin_version"] = s.plugin ? s.plugin->descriptor->version : "";
    b["device"] = s.device.to_string();
    b["state"] = std::string(to_string(s.state.load()));
    // While offloaded: how ("suspend": the backend is kept and a reload
    // resumes it; "destroy": a reload re-creates it). Absent otherwise, so
    // that describe() reads the same before and after a cycle.
    if (s.state.load() == BackendState::kOffloaded && s.offload_mode) b["offload"] = s.offload_mode;
    // A grown comm's: "native" (grown by its plugin) or "recreate".
    if (s.grown) b["grow"] = s.grown;
    b["hints"] = json::object();
    for (const auto& [k, v] : s.hints) b["hints"][k] = v;
    b["config"] = nullptr;
    if (s.backend) {
      std::string text;
      Status st = internal::call_plugin(s.plugin->name, "describe", [&] {
        text = s.backend->describe();
        return Status{};
      });
      if (st.is_ok()) {
        b["config"] = json::parse(text, nullptr, /*allow_exceptions=*/false);
        if (b["config"].is_discarded()) st = {ErrorCode::kInternal, str::cat("unparsable describe(): ", text)};
      }
      if (!st.is_ok()) b["config"] = str::cat(prefix(), " ", st.message);
    }
    backends[std::string(to_string(static_cast<DeviceType>(i)))] = b;
  }
  j["backends"] = backends;
  return json_text(j, 2);
}

}  // namespace comms
