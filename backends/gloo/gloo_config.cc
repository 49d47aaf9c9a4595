// Resolving the Gloo backend's configuration from hints, the environment
// and defaults (gloo_backend.h).
#include <unistd.h>

#include <cctype>

#include "bind_address.h"
#include "text.h"
#include "comms/env.h"
#include "gloo_backend.h"
#include "op_rules.h"

namespace comms::gloo_backend {

Status resolve_busy_poll(const std::string& value, const std::string& source, int local_size, GlooConfig* cfg) {
  std::string mode = value;
  for (char& c : mode) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (mode != "auto") {
    try {
      mode = env::parse_bool(value, source) ? "1" : "0";
    } catch (const Error&) {
      return {ErrorCode::kInvalidArgument,
              cat({source, "='", value, "' is not auto or a boolean; use auto, 1/0, true/false, yes/no or on/off"})};
    }
  }
  cfg->busy_poll = mode;
  cfg->spin = read_spin(mode, local_size);
  cfg->busy_poll_enabled = mode == "1" || cfg->spin.count() > 0;
  return {};
}

Status resolve_config(const Hints& hints, int local_size, int size,
                      const std::string& store_local_address, GlooConfig* out) {
  GlooConfig cfg;
  // Each setting with where it came from, for messages.
  std::string interface_from = "COMMS_GLOO_IFNAME", hostname_from = "COMMS_GLOO_HOSTNAME";
  std::string busy_poll_from = "COMMS_GLOO_BUSY_POLL";
  cfg.interface = env::get("COMMS_GLOO_IFNAME").value_or("");
  cfg.hostname = env::get("COMMS_GLOO_HOSTNAME").value_or("");
  std::string busy_poll = env::get("COMMS_GLOO_BUSY_POLL").value_or(std::string(kDefaultBusyPoll));
  if (hints.count("interface") && hints.count("hostname")) {
    return {ErrorCode::kInvalidArgument,
            cat({"hints gloo.interface='", hints.find("interface")->second, "' and gloo.hostname='",
                 hints.find("hostname")->second, "' are both given; give one"})};
  }
  for (const auto& [k, v] : hints) {
    if (k == "interface") {
      cfg.interface = v;
      interface_from = "hint gloo.interface";
      cfg.hostname.clear();
    } else if (k == "hostname") {
      cfg.hostname = v;
      hostname_from = "hint gloo.hostname";
      cfg.interface.clear();
    } else if (k == "busy_poll") {
      busy_poll = v;
      busy_poll_from = "hint gloo.busy_poll";
    } else {
      return {ErrorCode::kInvalidArgument, cat({"unknown gloo hint '", k, "'"})};
    }
  }
  // Values are checked once every key is known to be one: an unknown key is
  // reported first, whatever the map's order puts before it.
  if (hints.count("interface") && cfg.interface.empty()) {
    return {ErrorCode::kInvalidArgument, "hint gloo.interface is empty; name a network interface"};
  }
  if (hints.count("hostname") && cfg.hostname.empty()) {
    return {ErrorCode::kInvalidArgument, "hint gloo.hostname is empty; give a host name or address"};
  }
  Status s = resolve_busy_poll(busy_poll, busy_poll_from, local_size, &cfg);
  if (!s.is_ok()) return s;
  if (!cfg.interface.empty() && !cfg.hostname.empty()) {
    return {ErrorCode::kInvalidArgument,
            cat({"COMMS_GLOO_IFNAME='", cfg.interface, "' and COMMS_GLOO_HOSTNAME='", cfg.hostname,
                 "' are both set; set either a Gloo interface or a host name, not both"})};
  }
  if (cfg.interface.empty() && cfg.hostname.empty()) {
    // The address that reaches the store reaches the other hosts too. With
    // no TCP store, a job on one host stays on loopback.
    if (!store_local_address.empty()) {
      cfg.hostname = store_local_address;
      hostname_from = "the address this process reaches the store from";
    } else if (local_size >= size) {
      cfg.hostname = "127.0.0.1";
      hostname_from = "the default bind address";
    } else {
      char host[256] = {};
      gethostname(host, sizeof host - 1);
      cfg.hostname = host;
      hostname_from = "this host's name (gethostname(2); set COMMS_GLOO_IFNAME or COMMS_GLOO_HOSTNAME)";
    }
  }
  // Gloo crashes or throws on what it cannot bind: check it here first.
  s = cfg.interface.empty() ? check_hostname(cfg.hostname, hostname_from)
                            : check_interface(cfg.interface, interface_from);
  if (!s.is_ok()) return s;
  *out = std::move(cfg);
  return {};
}

}  // namespace comms::gloo_backend
