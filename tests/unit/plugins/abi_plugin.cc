// Plugins that exercise the ABI rules of include/comms/plugin.h. Each build
// declares one descriptor shape:
//   ABI_PLUGIN_WORD   the abi_version word it declares (default: this header's)
//   ABI_PLUGIN_SIZE   the struct_size it declares (default: the whole descriptor)
// The optional entries are always filled with values a reader must never see
// when struct_size stops before them: a short descriptor's "absent" entries
// are then non-null junk in memory, as whatever follows a shorter, older
// descriptor would be.
#include "comms/plugin.h"

#ifndef ABI_PLUGIN_WORD
#define ABI_PLUGIN_WORD COMMS_PLUGIN_ABI_VERSION
#endif
#ifndef ABI_PLUGIN_SIZE
#define ABI_PLUGIN_SIZE sizeof(comms::plugin::PluginDescriptor)
#endif

namespace {

const char* const kKeys[] = {nullptr};

comms::Status create(const comms::plugin::BackendInit&, std::unique_ptr<comms::plugin::Backend>*) {
  return {comms::ErrorCode::kUnsupported, "the ABI test plugin creates no backend"};
}

int no_devices(comms::DeviceType) { return 0; }

comms::Status explain(const comms::Hints&, std::string* json) {
  *json = "{\"read_past_struct_size\":true}";
  return {};
}

}  // namespace

extern "C" COMMS_PLUGIN_EXPORT const comms::plugin::PluginDescriptor* comms_plugin_entry() {
  static const comms::plugin::PluginDescriptor d = {
      .abi_version = ABI_PLUGIN_WORD,
      .struct_size = static_cast<uint32_t>(ABI_PLUGIN_SIZE),
      .name = ABI_PLUGIN_NAME,
      .version = "0.0-abi",
      .device_types = comms::plugin::device_bit(comms::DeviceType::kCuda),
      .hint_keys = kKeys,
      .create = create,
      .device_count = no_devices,
      .explain_hints = explain,
  };
  return &d;
}
