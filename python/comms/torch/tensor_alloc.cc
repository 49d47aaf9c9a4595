// allocate_tensor: a CPU tensor in memory from the group's comm
// (comms::alloc_backend_memory), for FSDP's staging buffers
// (set_allocate_memory_from_process_group_for_comm) and comms.torch.empty.
//
// The storage's context holds the comm, not the group: freeing goes through
// the comm object (finalized or not; the memory is not tied to the comm's
// lifetime), so a tensor outliving destroy_process_group stays valid and is
// freed when torch frees it. torch's only memory-pool hook, getMemAllocator with MemPool, is CUDA's
// (and XPU's): it serves torch.cuda.use_mem_pool and nothing allocates CPU
// tensors through it, so this is not offered as one.
#include "process_group.h"
#include "comms/registration.h"
#include "tensors.h"

#include <limits>

namespace comms_torch {
namespace {

// A tensor's storage context: frees the memory through the comm that
// allocated it, once, when torch frees the storage.
struct CommMemory {
  std::shared_ptr<comms::Comm> comm;
  void* data = nullptr;
  ~CommMemory() {
    if (!data) return;
    try {
      comms::free_backend_memory(*comm, comms::Device::cpu(), data);
    } catch (const std::exception& e) {
      TORCH_WARN("comms.torch: freeing an allocate_tensor tensor of comm ", comm->name(), " failed: ", e.what());
    }
  }
};

void free_comm_memory(void* context) { delete static_cast<CommMemory*>(context); }

}  // namespace

bool ProcessGroupComms::supportsTensorAlloc(c10::DeviceIndex device_index) {
  return device_index < 0 && comm_ && comms::can_alloc_backend_memory(*comm_, comms::DeviceType::kCpu);
}

at::Tensor ProcessGroupComms::allocateTensor(long size, at::TensorOptions options) {
  const char* call = "allocate_tensor";
  const at::Device device = options.device_opt().value_or(at::Device(at::kCPU));
  if (!device.is_cpu()) {
    fail(call, "comms.torch allocates CPU tensors only (from the group's cpu backend), not " + device.str());
  }
  if (options.layout() != at::kStrided) fail(call, "only strided (dense) tensors can be allocated");
  if (size < 0) fail(call, "size " + std::to_string(size) + " is negative");
  comms::Comm& comm = live(call);
  options = options.device(at::kCPU);
  const auto item = static_cast<size_t>(options.dtype().itemsize());
  if (static_cast<size_t>(size) > std::numeric_limits<size_t>::max() / item) {
    fail(call, std::to_string(size) + " elements of " + std::string(options.dtype().name()) + " overflow size_t");
  }
  // No bytes, no memory to ask for (the allocator refuses 0 bytes): an
  // empty tensor is the same on every path.
  if (size == 0) return at::empty({0}, options);
  const size_t bytes = static_cast<size_t>(size) * item;
  auto owner = std::make_unique<CommMemory>(CommMemory{comm_, nullptr});
  owner->data = comms::alloc_backend_memory(comm, comms::Device::cpu(), bytes);
  c10::DataPtr data(owner->data, owner.get(), &free_comm_memory, at::Device(at::kCPU));
  owner.release();  // the DataPtr owns it now, and frees it once
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, std::move(data), /*allocator=*/nullptr,
                       /*resizable=*/false);
  return at::empty({0}, options).set_(std::move(storage), 0, {static_cast<int64_t>(size)}, {1});
}

}  // namespace comms_torch
