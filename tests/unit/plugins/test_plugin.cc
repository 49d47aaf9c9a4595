// A plugin built only against include/comms/plugin.h, compiled in two
// flavours for the loader tests:
//   TEST_PLUGIN_BAD_ABI: declares ABI version 999 (must be refused);
//   otherwise "fakegpu": a cuda backend with no devices, whose hint keys
//   overlap gloo's, to exercise hint routing.
#include "comms/plugin.h"

namespace {

const char* const kKeys[] = {"interface", "min_ctas", nullptr};

int no_devices(comms::DeviceType) { return 0; }

comms::Status refuse(const comms::plugin::BackendInit&, std::unique_ptr<comms::plugin::Backend>*) {
  return {comms::ErrorCode::kUnsupported, "fakegpu creates no backends"};
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const comms::plugin::PluginDescriptor* comms_plugin_entry() {
  static const comms::plugin::PluginDescriptor d = {
#ifdef TEST_PLUGIN_BAD_ABI
      999u, "badabi",
#else
      COMMS_PLUGIN_ABI_VERSION, "fakegpu",
#endif
      "0.0-test", comms::plugin::device_bit(comms::DeviceType::kCuda), kKeys, no_devices, refuse, nullptr};
  return &d;
}
