// The plugin's one exported symbol. Loading it touches no device: the
// version comes from the linked libnccl and device_count tolerates a machine
// without a driver.
#include <string>

#include "comms/plugin.h"
#include "nccl_api.h"
#include "nccl_backend.h"
#include "nccl_core.h"

namespace {

int cuda_device_count(comms::DeviceType type) {
  if (type != comms::DeviceType::kCuda) return 0;
  int count = 0;
  // No driver or no device is an error here, which means "none".
  if (comms::nccl::real_nccl_api()->get_device_count(&count) != cudaSuccess) return 0;
  return count;
}

comms::Status create(const comms::plugin::BackendInit& init,
                     std::unique_ptr<comms::plugin::Backend>* out) {
  try {
    return comms::nccl::create_nccl_backend(comms::nccl::real_nccl_api(), init, out);
  } catch (const std::exception& e) {
    return {comms::ErrorCode::kInternal, std::string("creating the nccl backend: ") + e.what()};
  }
}

comms::Status join_grown(const comms::plugin::GrowDesc& desc, std::unique_ptr<comms::plugin::Backend>* out) {
  try {
    return comms::nccl::join_grown_nccl_backend(comms::nccl::real_nccl_api(), desc, out);
  } catch (const std::exception& e) {
    return {comms::ErrorCode::kInternal, std::string("joining a grown nccl communicator: ") + e.what()};
  }
}

comms::Status explain(const comms::Hints& hints, std::string* json) {
  try {
    return comms::nccl::explain_nccl_hints(*comms::nccl::real_nccl_api(), hints, json);
  } catch (const std::exception& e) {
    return {comms::ErrorCode::kInternal, std::string("explaining nccl hints: ") + e.what()};
  }
}

comms::Status mem_alloc(comms::Device device, size_t bytes, void** ptr) {
  return comms::nccl::nccl_mem_alloc(*comms::nccl::real_nccl_api(), device, bytes, ptr);
}

comms::Status mem_free(comms::Device device, void* ptr) {
  return comms::nccl::nccl_mem_free(*comms::nccl::real_nccl_api(), device, ptr);
}

const std::string& linked_version() {
  static const std::string version = [] {
    int code = 0;
    if (comms::nccl::real_nccl_api()->get_version(&code) != ncclSuccess) code = NCCL_VERSION_CODE;
    return comms::nccl::nccl_version_string(code);
  }();
  return version;
}

// Every variable this plugin reads (docs/ENVIRONMENT.md lists them).
constexpr comms::plugin::EnvVariable kEnvVariables[] = {
    {"COMMS_NCCL_NET_NAMES", "", "NCCL: extra accepted values of the nccl.net_name hint (comma separated, case-insensitive), for NCCL net plugins. Built in: IB, Socket."},
    {nullptr, nullptr, nullptr},
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const comms::plugin::PluginDescriptor*
comms_plugin_entry() {
  static const comms::plugin::PluginDescriptor descriptor = {
      .name = "nccl",
      .version = linked_version().c_str(),
      .device_types = comms::plugin::device_bit(comms::DeviceType::kCuda),
      .hint_keys = comms::nccl::kHintKeys.data(),
      .create = create,
      .device_count = cuda_device_count,
      .explain_hints = explain,
      // Windows: claimed for every NCCL; a backend on an NCCL below 2.29
      // answers kUnsupported naming the loaded version.
      .features = comms::plugin::kFeatureRegisterBuffers | comms::plugin::kFeatureMemAlloc |
                  comms::plugin::kFeatureWindows,
      .mem_alloc = mem_alloc,
      .mem_free = mem_free,
      .env_variables = kEnvVariables,
      // Native on NCCL >= 2.29; below, it and Backend::grow answer
      // kUnsupported everywhere and libcomms re-creates.
      .join_grown = join_grown,
  };
  return &descriptor;
}
