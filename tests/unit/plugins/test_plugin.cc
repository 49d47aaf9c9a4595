// A plugin built only against include/comms/plugin.h, for the loader and
// lifecycle tests: TEST_PLUGIN_NAME/TEST_PLUGIN_VERSION name it (two files
// with one name show that replacing a plugin never frees the old entry).
// "fakegpu" is a cuda backend with no devices and no data path,
//   whose hint keys overlap gloo's (hint routing), and whose finalize fails
//   when given fail_finalize=1 (failure injection for offload). With
//   late_timeout=1 every op is a stream-ordered op that ends in a timeout:
//   wait(kStream) succeeds at once, the failure shows at wait(kBlocking).
//   fault=<where>:<how> makes one plugin call misbehave, for the guarded
//   plugin calls of libcomms: <how> is "throw" (a std::runtime_error) or
//   "null" (ok with no object); <where> is recreate (create() of a comm
//   name after its first, i.e. a reload), resplit (split() for a child name
//   after its first, i.e. a reload by split), set_timeout, set_hints,
//   describe or submit (every op, the flush barrier included).
//   memory_used=N: the backend holds N bytes of a pretend device (1 MiB in
//   use by others) until finalize; device_memory_used() reports the device.
//   block_wait_ms=N: ops are async and their wait() blocks N ms; is_completed
//   never blocks.
//   refuse_reduction=<kind>: supports_reduction says no to that ReduceKind
//   (its number), yes to every other.
//   suspend=1: suspend() (ABI 2.6) releases what memory_used holds and the
//   registrations, resume() takes the memory back; suspend=fail and
//   suspend=fail_resume make one of them fail. Unset or "unsupported":
//   suspend() answers kUnsupported (libcomms offloads by finalize). With the
//   hint, describe() counts the process's create() calls, suspends and resumes.
//   register_buffer hands out handles counted across fakegpu backends
//   ("registered" in describe()); finalize and the destructor drop those
//   left, as a real backend releases them with its communicator.
//   describe() says how many op calls (init, submit, supports_reduction) the
//   process's fakegpu backends saw, so a test can show the core refused an op
//   before any of them, and how many abort() and revoke() calls (ABI 2.4)
//   they got. TEST_PLUGIN_ABI_WORD sets the declared abi_version (an older
//   minor's vtable still has every slot: libcomms must not call past it).
//   Grows natively (ABI 2.7: Backend::grow, join_grown) unless grow=unsupported
//   (both answer kUnsupported) or grow=fail (both fail); describe() says
//   which function made the backend ("made_by": create, split, grow or
//   join_grown) and, when grown, the parent's size ("members").
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

#include "comms/plugin.h"

#ifdef TEST_PLUGIN_NEEDS_ABSENT
// Uses a library of its own (absent_lib.cc), which the test's copy of the
// plugin then names under a name no folder has: dlopen fails on it.
extern "C" int comms_test_absent_marker();
[[maybe_unused]] static const int absent_marker = comms_test_absent_marker();
#endif

#ifndef TEST_PLUGIN_NAME
#define TEST_PLUGIN_NAME "fakegpu"
#endif
#ifndef TEST_PLUGIN_VERSION
#define TEST_PLUGIN_VERSION "0.0-test"
#endif
#ifndef TEST_PLUGIN_ABI_WORD
#define TEST_PLUGIN_ABI_WORD COMMS_PLUGIN_ABI_VERSION
#endif

namespace {

const char* const kKeys[] = {"interface",   "min_ctas",      "fail_finalize", "late_timeout", "fault",
                             "memory_used", "block_wait_ms", "refuse_reduction", "suspend", "grow", nullptr};

constexpr int64_t kOthersBytes = 1 << 20;
std::atomic<int64_t> g_device_bytes{0};
std::atomic<int> g_op_calls{0};
std::atomic<int> g_aborts{0}, g_revokes{0};
std::atomic<int> g_creates{0}, g_suspends{0}, g_resumes{0};
std::atomic<int> g_registered{0};  // live register_buffer handles of every fakegpu backend

std::string hint(const comms::Hints& h, const std::string& key) {
  auto it = h.find(key);
  return it == h.end() ? std::string() : it->second;
}

// The misbehaviour `fault` asks of `where`: "throw", "null" or "".
std::string fault_at(const comms::Hints& h, const std::string& where) {
  const std::string f = hint(h, "fault");
  const auto colon = f.find(':');
  if (colon == std::string::npos || f.substr(0, colon) != where) return {};
  const std::string how = f.substr(colon + 1);
  if (how == "throw") throw std::runtime_error("injected: fakegpu " + where + " threw");
  return how;
}

// How many times `key` was seen before in this process.
int seen_before(const std::string& key) {
  static std::mutex mu;
  static std::map<std::string, int> counts;
  std::lock_guard<std::mutex> lock(mu);
  return counts[key]++;
}

class BlockingWork : public comms::plugin::Work {
 public:
  explicit BlockingWork(int ms) : ms_(ms) {}
  bool is_completed() override { return done_.load(); }
  comms::Status wait(comms::WaitMode) override {
    if (!done_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(ms_));
    done_ = true;
    return {};
  }

 private:
  int ms_;
  std::atomic<bool> done_{false};
};

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

// grow()'s and join_grown's answer as the `grow` hint asks; ok: build one.
comms::Status grow_answer(const comms::plugin::GrowDesc& d) {
  const std::string how = hint(d.child.hints, "grow");
  if (how == "unsupported") return {comms::ErrorCode::kUnsupported, "fakegpu: told not to grow natively"};
  if (how == "fail") return {comms::ErrorCode::kInternal, "injected failure: fakegpu could not grow"};
  return {};
}

class FakeBackend : public comms::plugin::Backend {
 public:
  explicit FakeBackend(const comms::plugin::BackendInit& init, const char* made_by = "create", int members = -1)
      : init_(init), made_by_(made_by), members_(members) {
    const std::string bytes = hint(init_.hints, "memory_used");
    held_ = bytes.empty() ? 0 : std::stoll(bytes);
    g_device_bytes += held_;
  }
  ~FakeBackend() override { release(); }
  comms::Status init() override {
    ++g_op_calls;
    return {};
  }
  comms::Status submit(const comms::plugin::OpDesc&, std::unique_ptr<comms::plugin::Work>* work) override {
    ++g_op_calls;
    if (fault_at(init_.hints, "submit") == "null") return {};
    if (const std::string ms = hint(init_.hints, "block_wait_ms"); !ms.empty()) {
      *work = std::make_unique<BlockingWork>(std::stoi(ms));
      return {};
    }
    auto it = init_.hints.find("late_timeout");
    if (it == init_.hints.end() || it->second != "1") {
      return {comms::ErrorCode::kUnsupported, "fakegpu moves no data"};
    }
    *work = std::make_unique<LateTimeoutWork>();
    return {};
  }
  comms::Status split(const comms::plugin::SplitDesc& d, std::unique_ptr<comms::plugin::Backend>* child) override {
    if (!d.ranks.empty() && seen_before("split:" + d.child.comm_name) > 0 &&
        fault_at(d.child.hints, "resplit") == "null") {
      return {};
    }
    if (!d.ranks.empty()) *child = std::make_unique<FakeBackend>(d.child, "split");
    return {};
  }
  comms::Status grow(const comms::plugin::GrowDesc& d, std::unique_ptr<comms::plugin::Backend>* child) override {
    comms::Status st = grow_answer(d);
    if (st.is_ok()) *child = std::make_unique<FakeBackend>(d.child, "grow", d.members);
    return st;
  }
  comms::Status set_hints(const comms::Hints&) override {
    fault_at(init_.hints, "set_hints");
    return {};
  }
  comms::Status set_op_timeout(std::chrono::milliseconds) override {
    fault_at(init_.hints, "set_timeout");
    return {};
  }
  void abort(const std::string&) override { ++g_aborts; }
  void revoke(const std::string&) override { ++g_revokes; }
  comms::Status finalize() override {
    auto it = init_.hints.find("fail_finalize");
    if (it != init_.hints.end() && it->second == "1") {
      return {comms::ErrorCode::kInternal, "injected failure: fakegpu could not free its device memory"};
    }
    release();
    return {};
  }
  comms::Status suspend() override {
    const std::string how = hint(init_.hints, "suspend");
    if (how.empty() || how == "unsupported") return comms::plugin::Backend::suspend();
    if (how == "fail") return {comms::ErrorCode::kInternal, "injected failure: fakegpu could not suspend"};
    ++g_suspends;
    suspended_bytes_ = held_;
    release();
    return {};
  }
  comms::Status resume() override {
    if (hint(init_.hints, "suspend") == "fail_resume") {
      return {comms::ErrorCode::kInternal, "injected failure: fakegpu could not resume"};
    }
    ++g_resumes;
    held_ = suspended_bytes_;
    g_device_bytes += held_;
    return {};
  }
  int64_t device_memory_used() const override {
    return hint(init_.hints, "memory_used").empty() ? -1 : kOthersBytes + g_device_bytes.load();
  }
  std::string describe() const override {
    fault_at(init_.hints, "describe");
    std::string j = "{\"fake\":true,\"op_calls\":" + std::to_string(g_op_calls.load()) +
                    ",\"registered\":" + std::to_string(g_registered.load()) +
                    ",\"aborts\":" + std::to_string(g_aborts.load()) +
                    ",\"revokes\":" + std::to_string(g_revokes.load()) + ",\"made_by\":\"" + made_by_ +
                    "\",\"rank\":" + std::to_string(init_.rank) + ",\"size\":" + std::to_string(init_.size) + ",";
    if (members_ >= 0) j += "\"members\":" + std::to_string(members_) + ",";
    if (!hint(init_.hints, "suspend").empty()) {
      j += "\"creates\":" + std::to_string(g_creates.load()) + ",\"suspends\":" + std::to_string(g_suspends.load()) +
           ",\"resumes\":" + std::to_string(g_resumes.load()) + ",";
    }
    j += "\"hints\":{";
    bool first = true;
    for (const auto& [k, v] : init_.hints) {
      j += (first ? "\"" : ",\"") + k + "\":\"" + v + "\"";
      first = false;
    }
    return j + "}}";
  }
  bool supports_reduction(comms::DataType, comms::ReduceKind kind) const override {
    ++g_op_calls;
    const std::string refused = hint(init_.hints, "refuse_reduction");
    return refused.empty() || std::stoi(refused) != static_cast<int>(kind);
  }
  comms::Status register_buffer(void* data, size_t, void** handle) override {
    *handle = static_cast<char*>(data) + 1;  // distinct from the buffer, as NCCL's are
    if (!handles_.insert(*handle).second) return {comms::ErrorCode::kInvalidArgument, "registered twice"};
    ++g_registered;
    return {};
  }
  comms::Status deregister_buffer(void* handle) override {
    if (handles_.erase(handle) == 0) return {comms::ErrorCode::kInvalidArgument, "fakegpu: unknown handle"};
    --g_registered;
    return {};
  }

 private:
  void release() {
    g_device_bytes -= held_;
    held_ = 0;
    g_registered -= static_cast<int>(handles_.size());
    handles_.clear();
  }

  comms::plugin::BackendInit init_;
  const char* made_by_;
  int members_;
  int64_t held_ = 0;
  int64_t suspended_bytes_ = 0;
  std::set<void*> handles_;
};

comms::Status create(const comms::plugin::BackendInit& init, std::unique_ptr<comms::plugin::Backend>* out) {
  if (seen_before("create:" + init.comm_name) > 0 && fault_at(init.hints, "recreate") == "null") return {};
  ++g_creates;
  *out = std::make_unique<FakeBackend>(init);
  return {};
}

comms::Status join_grown(const comms::plugin::GrowDesc& d, std::unique_ptr<comms::plugin::Backend>* out) {
  comms::Status st = grow_answer(d);
  if (st.is_ok()) *out = std::make_unique<FakeBackend>(d.child, "join_grown", d.members);
  return st;
}

}  // namespace

extern "C" COMMS_PLUGIN_EXPORT const comms::plugin::PluginDescriptor* comms_plugin_entry() {
  static const comms::plugin::PluginDescriptor d = {
      .abi_version = TEST_PLUGIN_ABI_WORD,
      .name = TEST_PLUGIN_NAME,
      .version = TEST_PLUGIN_VERSION,
      .device_types = comms::plugin::device_bit(comms::DeviceType::kCuda),
      .hint_keys = kKeys,
      .create = create,
      .device_count = no_devices,
      .features = comms::plugin::kFeatureRegisterBuffers,
      .join_grown = join_grown,
  };
  return &d;
}
