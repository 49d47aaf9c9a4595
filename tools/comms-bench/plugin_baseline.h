// comms-bench's overhead baseline (--raw-plugin, --overhead): the comm's own
// backend plugin, loaded from the file libcomms loaded and driven through
// the public plugin ABI (comms/plugin.h) exactly as libcomms drives it, a
// plugin::Backend of its own made with the comm's BackendInit fields and
// each op a submit() and Work::wait(). What it leaves out is what libcomms
// adds per op (validation, dispatch, sequence numbers, the flight recorder,
// the Work wrapper), so comms' time minus this one is libcomms' overhead,
// for any plugin: gloo, ucx, nccl, or a third party's.
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "baseline.h"
#include "comms/comm.h"

namespace comms::bench {

// Creates and connects (collective over the comm) a backend of the plugin
// that serves `device.type` in `comm`, with the comm's rank, size, local
// placement, timeouts, abort_process_on_error and that backend's routed
// hints as `described` (the comm's describe(), parsed) shows them, under a
// store prefix of its own. Throws comms::Error naming what failed.
std::unique_ptr<Baseline> open_plugin_baseline(Comm& comm, Device device, const nlohmann::json& described);

}  // namespace comms::bench
