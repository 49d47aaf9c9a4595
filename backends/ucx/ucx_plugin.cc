// The plugin entry point of libcomms-ucx.so.
#include <ucp/api/ucp.h>

#include <nlohmann/json.hpp>

#include "comms/plugin.h"
#include "host_shared_memory.h"
#include "ucx_backend.h"
#include "ucx_log.h"
#include "ucx_transport.h"

namespace {

using comms::Status;
using comms::plugin::PluginDescriptor;

Status explain(const comms::Hints& hints, std::string* json) {
  comms::ucx_backend::UcxSettings cfg;
  Status s = comms::ucx_backend::resolve_settings(hints, 1, &cfg);
  if (!s.is_ok()) return s;
  // The devices a context opens with these settings (UCX_TLS applies):
  // what a comm would choose its transports from.
  std::string devices;
  try {
    const comms::ucx_backend::QuietUcxLogs quiet;
    comms::ucx_backend::UcxTransport probe(0, 1, cfg, nullptr);
    devices = probe.devices();
  } catch (const std::exception& e) {
    return {comms::ErrorCode::kInvalidArgument, std::string("UCX cannot start with these settings: ") + e.what()};
  }
  if (devices.empty()) {
    return {comms::ErrorCode::kInvalidArgument,
            "UCX opened no device with tls '" + (cfg.tls.empty() ? std::string("(UCX_TLS or default)") : cfg.tls) + "'"};
  }
  nlohmann::ordered_json j;
  j["ucx_config"] = {{"ucx_version", ucp_get_version_string()},
                     {"tls", cfg.tls.empty() ? "(UCX_TLS or UCX's default)" : cfg.tls},
                     {"rndv_thresh", comms::ucx_backend::rndv_thresh_text(cfg)},
                     {"shm_fifo", comms::ucx_backend::fifo_text()},
                     {"busy_poll", cfg.busy_poll},
                     {"devices", devices}};
  *json = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // hint and name text may not be UTF-8
  return {};
}

// comms' allocator on cpu: host-shared memory (host_shared_memory.h), which
// the windows and registered buffers of peers on this host map.
Status mem_alloc(comms::Device device, size_t bytes, void** ptr) {
  if (device.type != comms::DeviceType::kCpu) {
    return {comms::ErrorCode::kInvalidArgument, "the UCX plugin allocates cpu memory only"};
  }
  return comms::ucx_backend::host_shared::allocate(bytes, ptr);
}

Status mem_free(comms::Device device, void* ptr) {
  if (device.type != comms::DeviceType::kCpu) {
    return {comms::ErrorCode::kInvalidArgument, "the UCX plugin allocates cpu memory only"};
  }
  return comms::ucx_backend::host_shared::release(ptr);
}

// Every variable this plugin reads (docs/ENVIRONMENT.md lists them).
constexpr comms::plugin::EnvVariable kEnvVariables[] = {
    {"COMMS_UCX_BUSY_POLL", "auto", "UCX: how waits on the UCP worker poll. auto: poll for up to 100 us (the first 3 us without yielding, then yielding the core after each empty poll; 50 us, all yielding, when the ranks on this host outnumber its cores), then sleep on the worker's event fd; 1: spin until the data arrives; 0: sleep at once. Hint ucx.busy_poll wins over it."},
    {"COMMS_UCX_SHM", "1", "UCX: small collectives (barrier; all_reduce, all_gather, reduce_scatter, broadcast up to 16 KiB per rank) through a shared-memory segment the comm's ranks map, when all of them are on this host; the same bits as the UCX path. 0: everything through UCX."},
    {"COMMS_UCX_ZERO_COPY_MIN_BYTES", "256K", "UCX: the smallest op (bytes per rank; digits with an optional K, M or G) that runs zero-copy when every rank's buffers come from alloc_backend_memory: all_reduce, reduce, reduce_scatter, all_gather and broadcast, each rank reading and writing its peers' buffers directly. 0: every size. Hint ucx.zero_copy_min_bytes wins over it."},
    {"UCX_RNDV_THRESH", "", "UCX's eager/rendezvous threshold, read by UCX itself; the UCX plugin only checks whether it is set: unset (and no hint ucx.rndv_thresh), it sets 65537 so every message of the small-op paths goes eager."},
    {"UCX_SYSV_FIFO_ELEM_SIZE", "", "UCX's size of a shared-memory FIFO element (sysv transport), read by UCX itself. Unset, together with UCX_POSIX_FIFO_ELEM_SIZE and UCX_MM_FIFO_ELEM_SIZE, the UCX plugin sets 16640 so that messages of up to 16 KiB (a 4-rank exchange message) travel inside the FIFO (UCX's own default, 128, sends them through receive buffers, and every buffer the receiver's pool grows by is a new shared page both sides fault in)."},
    {"UCX_POSIX_FIFO_ELEM_SIZE", "", "As UCX_SYSV_FIFO_ELEM_SIZE, for UCX's posix shared-memory transport."},
    {"UCX_MM_FIFO_ELEM_SIZE", "", "As UCX_SYSV_FIFO_ELEM_SIZE, for both of UCX's shared-memory transports (the per-transport variables win)."},
    {"UCX_SYSV_FIFO_SIZE", "", "UCX's number of shared-memory FIFO elements (sysv transport), read by UCX itself. Unset, together with UCX_POSIX_FIFO_SIZE and UCX_MM_FIFO_SIZE, the UCX plugin sets 16 (UCX's own default is 64), which keeps the FIFO of 16640-byte elements at 260 KiB per comm and rank."},
    {"UCX_POSIX_FIFO_SIZE", "", "As UCX_SYSV_FIFO_SIZE, for UCX's posix shared-memory transport."},
    {"UCX_MM_FIFO_SIZE", "", "As UCX_SYSV_FIFO_SIZE, for both of UCX's shared-memory transports (the per-transport variables win)."},
    {nullptr, nullptr, nullptr},
};

}  // namespace

extern "C" COMMS_PLUGIN_EXPORT const PluginDescriptor* comms_plugin_entry() {
  static const PluginDescriptor descriptor = {
      .name = "ucx",
      .version = COMMS_UCX_VERSION,
      .device_types = comms::plugin::device_bit(comms::DeviceType::kCpu),
      .hint_keys = comms::ucx_backend::kHintKeys,
      .create = comms::ucx_backend::create_backend,
      .explain_hints = explain,
      .features = comms::plugin::kFeatureWindows | comms::plugin::kFeatureMemAlloc |
                  comms::plugin::kFeatureRegisterBuffers,
      .mem_alloc = mem_alloc,
      .mem_free = mem_free,
      .env_variables = kEnvVariables,
  };
  return &descriptor;
}
