// A plugin built only against include/comms/plugin.h, compiled in two
// flavours for the loader and lifecycle tests:
//   TEST_PLUGIN_BAD_ABI: declares ABI version 999 (must be refused);
//   otherwise "fakegpu": a cuda backend with no devices and no data path,
//   whose hint keys overlap gloo's (hint routing), and whose finalize fails
//   when given fail_finalize=1 (failure injection for offload). With
//   late_timeout=1 every op is a stream-ordered op that ends in a timeout:
//   wait(kStream) succeeds at once, the failure shows at wait(kBlocking).
#include <string>

#include "comms/plugin.h"

namespace {

const char* const kKeys[] = {"interface", "min_ctas", "fail_finalize", "late_timeout", nullptr};

int no_devices(comms::DeviceType) { return 0; }

class LateTimeoutWork : public comms::plugin::Work {
 public:
  bool is_completed() override { return blocked_; }
  comms::Status wait(comms::WaitMode mode) override {
    if (mode == comms::WaitMode::kStream && !blocked_) return {};  // the caller's stream now waits for it
    blocked_ = true;
    return {comms::ErrorCode::kTimeout, "fakegpu: the op did not finish in time"};
  }

 private:
  bool blocked_ = false;
};

class FakeBackend : public comms::plugin::Backend {
 public:
  explicit FakeBackend(const comms::plugin::BackendInit& init) : init_(init) {}
  comms::Status init() override { return {}; }
  comms::Status submit(const comms::plugin::OpDesc&, std::unique_ptr<comms::plugin::Work>* work) override {
    auto it = init_.hints.find("late_timeout");
    if (it == init_.hints.end() || it->second != "1") {
      return {comms::ErrorCode::kUnsupported, "fakegpu moves no data"};
    }
    *work = std::make_unique<LateTimeoutWork>();
    return {};
  }
  comms::Status split(const comms::plugin::SplitDesc& d, std::unique_ptr<comms::plugin::Backend>* child) override {
    if (!d.ranks.empty()) *child = std::make_unique<FakeBackend>(d.child);
    return {};
  }
  comms::Status set_hints(const comms::Hints&) override { return {}; }
  comms::Status set_op_timeout(std::chrono::milliseconds) override { return {}; }
  void abort(const std::string&) override {}
  comms::Status finalize() override {
    auto it = init_.hints.find("fail_finalize");
    if (it != init_.hints.end() && it->second == "1") {
      return {comms::ErrorCode::kInternal, "injected failure: fakegpu could not free its device memory"};
    }
    return {};
  }
  std::string describe() const override {
    std::string j = "{\"fake\":true,\"hints\":{";
    bool first = true;
    for (const auto& [k, v] : init_.hints) {
      j += (first ? "\"" : ",\"") + k + "\":\"" + v + "\"";
      first = false;
    }
    return j + "}}";
  }
  bool supports_reduction(comms::DataType, comms::ReduceKind) const override { return true; }

 private:
  comms::plugin::BackendInit init_;
};

comms::Status create(const comms::plugin::BackendInit& init, std::unique_ptr<comms::plugin::Backend>* out) {
  *out = std::make_unique<FakeBackend>(init);
  return {};
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const comms::plugin::PluginDescriptor* comms_plugin_entry() {
  static const comms::plugin::PluginDescriptor d = {
#ifdef TEST_PLUGIN_BAD_ABI
      999u, "badabi",
#else
      COMMS_PLUGIN_ABI_VERSION, "fakegpu",
#endif
      "0.0-test", comms::plugin::device_bit(comms::DeviceType::kCuda), kKeys, no_devices, create, nullptr};
  return &d;
}
