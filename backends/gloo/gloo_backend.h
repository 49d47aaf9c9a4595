// The Gloo backend: every comms operation on CPU buffers over Gloo's TCP
// transport. Built only against include/comms/plugin.h and Gloo.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "comms/plugin.h"

namespace comms::gloo_backend {

// Hint keys (without the "gloo." prefix).
inline constexpr const char* kHintKeys[] = {"interface", "hostname", "busy_poll", nullptr};

// Network and polling configuration, resolved from hints, then environment
// (COMMS_GLOO_IFNAME, COMMS_GLOO_HOSTNAME, COMMS_GLOO_BUSY_POLL), then
// defaults.
struct GlooConfig {
  std::string interface;  // bind this interface, or
  std::string hostname;   // bind this host name or address
  std::string busy_poll;  // "auto" (default), "1" or "0" (any boolean is accepted); see read_spin()
  bool busy_poll_enabled = false;   // resolved: sync-mesh reads spin at all
  std::chrono::microseconds spin{0};  // resolved: spin before a read blocks
};

// Validates hints and the environment and resolves the configuration: the
// interface or host name is checked as Gloo will bind it (bind_address.h).
// local_size and store_local_address come from the BackendInit (they decide
// the defaults). Errors name the variable or hint, the value and why.
Status resolve_config(const Hints& hints, int local_size, int size,
                      const std::string& store_local_address, GlooConfig* out);

// Sets cfg's busy_poll, spin and busy_poll_enabled from "auto" or a boolean;
// `source` names the variable or hint for the error.
Status resolve_busy_poll(const std::string& value, const std::string& source, int local_size, GlooConfig* cfg);

Status create_backend(const plugin::BackendInit& init, std::unique_ptr<plugin::Backend>* out);

}  // namespace comms::gloo_backend
