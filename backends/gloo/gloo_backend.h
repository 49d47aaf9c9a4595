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
  std::string busy_poll;  // "auto" (default), "1" or "0"; see read_spin() in algorithms.h
  bool busy_poll_enabled = false;   // resolved: sync-mesh reads spin at all
  std::chrono::microseconds spin{0};  // resolved: spin before a read blocks
};

// Validates hints and resolves the configuration. local_size and
// store_local_address come from the BackendInit (they decide the defaults).
Status resolve_config(const Hints& hints, int local_size, int size,
                      const std::string& store_local_address, GlooConfig* out);

Status create_backend(const plugin::BackendInit& init, std::unique_ptr<plugin::Backend>* out);

}  // namespace comms::gloo_backend
