// Backend strings (BackendSpec::parse), a split's parent/child filter
// (BackendSpec::select) and device strings (Device::parse). The input is
// "<backend string>\n<filter>" (the filter part optional).
//   - Rejections are comms::Error kInvalidArgument (or kNotFound for a backend
//     no plugin provides) and quote the string given.
//   - An accepted spec maps each device type to a plugin that supports it,
//     and its to_string() parses back to the same spec.
//   - A filter selects only the parent's entries, and the child's to_string()
//     selects the same child again, from the parent and from the child.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "comms/backend_spec.h"
#include "comms/types.h"
#include "fuzz_check.h"

namespace {

using comms::BackendSpec;
using comms::DeviceType;
using comms::ErrorCode;
using comms::PluginCapabilities;

constexpr uint32_t kCpu = 1u << 0, kCuda = 1u << 1;
// A CPU plugin, a CUDA plugin and one that serves both; with and without a GPU.
const std::vector<PluginCapabilities> kWithGpu = {
    {"gloo", kCpu, kCpu}, {"nccl", kCuda, kCuda}, {"mpi", kCpu | kCuda, kCpu | kCuda}};
const std::vector<PluginCapabilities> kNoGpu = {{"gloo", kCpu, kCpu}, {"nccl", kCuda, 0}, {"mpi", kCpu | kCuda, kCpu}};

const PluginCapabilities* plugin(const std::vector<PluginCapabilities>& plugins, const std::string& name) {
  for (const auto& p : plugins)
    if (p.name == name) return &p;
  return nullptr;
}

void check_spec(const BackendSpec& spec, const std::vector<PluginCapabilities>& plugins, std::string_view text) {
  FUZZ_CHECK(!spec.empty(), "'" + std::string(text) + "' parsed to an empty spec");
  for (int i = 0; i < comms::kNumDeviceTypes; ++i) {
    const auto t = static_cast<DeviceType>(i);
    if (!spec.has(t)) continue;
    const auto* p = plugin(plugins, spec.backend_for(t));
    FUZZ_CHECK(p != nullptr, "'" + std::string(text) + "' maps to unknown backend '" + spec.backend_for(t) + "'");
    FUZZ_CHECK(p->device_types & (1u << i), "'" + std::string(text) + "' maps a device to a plugin without it");
  }
  const std::string canonical = spec.to_string();
  BackendSpec again;
  const bool ok = fuzz::accepts([&] { again = BackendSpec::parse(canonical, plugins); }, {}, "", FUZZ_HERE);
  FUZZ_CHECK(ok && again == spec, "'" + canonical + "' (from '" + std::string(text) + "') does not parse back");
}

void check_select(const BackendSpec& parent, std::string_view filter) {
  BackendSpec child;
  if (!fuzz::accepts([&] { child = parent.select(filter); }, {ErrorCode::kInvalidArgument}, "", FUZZ_HERE)) return;
  for (int i = 0; i < comms::kNumDeviceTypes; ++i) {
    const auto t = static_cast<DeviceType>(i);
    if (child.has(t)) FUZZ_CHECK(child.backend_for(t) == parent.backend_for(t), "the child has an entry the parent lacks");
  }
  const std::string canonical = child.to_string();
  BackendSpec from_parent, from_child;
  FUZZ_CHECK(fuzz::accepts([&] { from_parent = parent.select(canonical); }, {}, "", FUZZ_HERE) && from_parent == child,
             "the child's '" + canonical + "' selects something else from the parent '" + parent.to_string() + "'");
  FUZZ_CHECK(fuzz::accepts([&] { from_child = child.select(canonical); }, {}, "", FUZZ_HERE) && from_child == child,
             "the child's '" + canonical + "' does not select itself");
}

void check_device(std::string_view text) {
  comms::Device d;
  if (!fuzz::accepts([&] { d = comms::Device::parse(text); }, {ErrorCode::kInvalidArgument}, "", FUZZ_HERE)) return;
  FUZZ_CHECK(d.index >= -1, "negative device index from '" + std::string(text) + "'");
  FUZZ_CHECK(d.type != DeviceType::kCpu || d.index <= 0, "a cpu index other than 0 from '" + std::string(text) + "'");
  comms::Device again;
  FUZZ_CHECK(fuzz::accepts([&] { again = comms::Device::parse(d.to_string()); }, {}, "", FUZZ_HERE) && again == d,
             "'" + d.to_string() + "' does not parse back");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nl = input.find('\n');
  const std::string_view text = input.substr(0, nl);
  const std::string_view filter = nl == input.npos ? std::string_view() : input.substr(nl + 1);

  std::vector<BackendSpec> parsed;
  for (const auto* plugins : {&kWithGpu, &kNoGpu}) {
    BackendSpec spec;
    // Every rejection quotes the string as given.
    if (fuzz::accepts([&] { spec = BackendSpec::parse(text, *plugins); },
                      {ErrorCode::kInvalidArgument, ErrorCode::kNotFound}, text, FUZZ_HERE)) {
      check_spec(spec, *plugins, text);
      parsed.push_back(spec);
    }
  }
  // Only the default ("", "undefined") depends on a GPU being present.
  const bool is_default = parsed.size() == 2 && parsed[0] != parsed[1];
  FUZZ_CHECK(parsed.size() != 1, "'" + std::string(text) + "' parses with a GPU present and not without, or back");
  if (is_default) FUZZ_CHECK(parsed[1].to_string() == "cpu:gloo", "the default without a GPU is " + parsed[1].to_string());

  const BackendSpec world = BackendSpec::parse("cpu:gloo,cuda:nccl", kWithGpu);
  check_select(world, filter);
  for (const auto& spec : parsed) check_select(spec, filter);
  check_device(text);
  return 0;
}
