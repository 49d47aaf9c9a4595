// A plugin built only against include/comms/plugin.h, for the loader and
// lifecycle tests: TEST_PLUGIN_NAME/TEST_PLUGIN_VERSION name it (two files
// with one name show that replacing a plugin never frees the old entry).
// "fakegpu" is a cuda backend with no devices and no data path,
//   whose hint keys overlap gloo's (hint routing), and whose finalize fails
//   when given fail_finalize=1 (failure injection for offload). With
//   late_timeout=1 every op is a stream-ordered op that ends in a timeout:
//   wait(kStream) succeeds at once, the failure shows at wait(kBlocking).
#include <string>

#include "comms/plugin.h"

#ifndef TEST_PLUGIN_NAME
#define TEST_PLUGIN_NAME "fakegpu"
#endif
#ifndef TEST_PLUGIN_VERSION
#define TEST_PLUGIN_VERSION "0.0-test"
#endif

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

extern "C" COMMS_PLUGIN_EXPORT const comms::plugin::PluginDescriptor* comms_plugin_entry() {
  static const comms::plugin::PluginDescriptor d = {
      .name = TEST_PLUGIN_NAME,
      .version = TEST_PLUGIN_VERSION,
      .device_types = comms::plugin::device_bit(comms::DeviceType::kCuda),
      .hint_keys = kKeys,
      .create = create,
      .device_count = no_devices,
  };
  return &d;
}
