// The CPU backends a multi-process test runs its cases on: gloo always,
// ucx when its plugin was built (the test's meson target defines
// UCX_PLUGIN_BUILT to 0 or 1).
#pragma once

#include <string>
#include <vector>

#ifndef UCX_PLUGIN_BUILT
#error "define UCX_PLUGIN_BUILT (0 or 1) in the test's meson target"
#endif

namespace comms::testing {

inline std::vector<std::string> cpu_backends_built() {
  std::vector<std::string> out = {"cpu:gloo"};
#if UCX_PLUGIN_BUILT
  out.push_back("cpu:ucx");
#endif
  return out;
}

}  // namespace comms::testing
