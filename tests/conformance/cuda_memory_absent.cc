// cuda_memory() of a comms-conformance built without CUDA (Meson found no
// CUDA runtime): --device cuda lists every case as skipped.
#include "device_memory.h"

namespace comms::conformance {

std::unique_ptr<DeviceMemory> cuda_memory(int, int, std::chrono::milliseconds, std::string* why_not) {
  *why_not = "no CUDA device buffers: comms-conformance was built without CUDA";
  return nullptr;
}

int cuda_device_count() { return 0; }

}  // namespace comms::conformance
