#include "plugin_baseline.h"

#include <dlfcn.h>

#include <cstdio>
#include <string>

#include "backend_paths.h"
#include "comms/info.h"
#include "comms/store.h"
#include "util/strutil.h"

namespace comms::bench {
namespace {

using plugin::OpType;

// The plugin's warnings and errors, as libcomms would show them.
void log_to_stderr(int level, const char* message) {
  if (level >= 2) std::fprintf(stderr, "comms-bench baseline plugin: %s\n", message);
}

// The descriptor of the file libcomms loaded for `backend`: dlopen of the
// same path hands back the module already in the process.
const plugin::PluginDescriptor& descriptor_of(const std::string& backend) {
  const PluginInfo info = plugin_info(backend);
  void* module = dlopen(info.path.c_str(), RTLD_NOW | RTLD_LOCAL);  // never closed: plugins stay loaded
  if (!module) {
    throw Error(ErrorCode::kNotFound, str::cat("comms-bench: loading ", info.path, ": ", dlerror()));
  }
  auto entry = reinterpret_cast<comms_plugin_entry_fn>(dlsym(module, COMMS_PLUGIN_ENTRY_SYMBOL));
  const plugin::PluginDescriptor* d = entry ? entry() : nullptr;
  if (!d || plugin::abi_major(d->abi_version) != COMMS_PLUGIN_ABI_MAJOR || d->struct_size < plugin::kMinDescriptorSize) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("comms-bench: ", info.path, " has no descriptor of plugin ABI major ", COMMS_PLUGIN_ABI_MAJOR));
  }
  return *d;
}

// The backend's hints as the comm routed them (describe()'s
// backends.<device>.hints, prefix removed).
Hints routed_hints(const nlohmann::json& described, const std::string& type) {
  Hints hints;
  const nlohmann::json::json_pointer at("/backends/" + type + "/hints");
  if (!described.contains(at)) return hints;
  for (const auto& [key, value] : described.at(at).items()) hints[key] = value.get<std::string>();
  return hints;
}

class PluginBaseline final : public Baseline {
 public:
  PluginBaseline(std::string backend, std::unique_ptr<plugin::Backend> b, BackendPaths paths,
                 std::chrono::milliseconds op_timeout)
      : backend_name_(std::move(backend)), backend_(std::move(b)), paths_(std::move(paths)), op_timeout_(op_timeout) {}
  ~PluginBaseline() override {
    // finalize() reports failures; here nothing can, and exit must not wait.
    if (backend_) backend_->abort("comms-bench: the baseline was not finalized");
  }

  void run(const BenchOp& op) override {
    plugin::OpDesc d;
    d.type = op.type;
    d.seq = ++seq_;
    d.input = op.input;
    d.output = op.output;
    d.count = op.count;
    d.dtype = op.dtype;
    d.device = op.device;
    d.reduce = op.redop;
    d.root = op.root;
    d.in_place = op.in_place;
    d.timeout = op_timeout_;
    d.stream = op.stream;
    P2POp pair[2];
    if (op.type == OpType::kSend) {  // as Comm::batch_p2p passes send_recv
      pair[0] = P2POp::send({const_cast<void*>(op.input), op.count, op.dtype, op.device}, op.peer);
      pair[1] = P2POp::recv({op.output, op.count, op.dtype, op.device}, op.peer);
      d.type = OpType::kBatchP2P;
      d.input = nullptr;
      d.output = nullptr;
      d.count = 0;
      d.root = -1;
      d.p2p = pair;
    } else if (op.type != OpType::kReduce && op.type != OpType::kBroadcast && op.type != OpType::kGather &&
               op.type != OpType::kScatter) {
      d.root = -1;
    }
    std::unique_ptr<plugin::Work> work;
    Status st = backend_->submit(d, &work);
    // A synchronous op's Work is waited as libcomms waits it.
    if (st.is_ok() && work) st = work->wait(WaitMode::kStream);
    if (!st.is_ok()) {
      throw Error(st.code, str::cat("comms-bench: the ", backend_name_, " plugin's ", plugin::op_name(d.type), " #",
                                    d.seq, " (baseline): ", st.message));
    }
  }

  std::string algorithm(const BenchOp& op) const override {
    return paths_.path(plugin::op_name(op.type), op.count * element_size(op.dtype));
  }
  std::string name() const override { return "plugin:" + backend_name_; }

  void finalize() override {
    if (!backend_) return;
    const Status st = backend_->finalize();
    backend_.reset();
    if (!st.is_ok()) {
      throw Error(st.code, str::cat("comms-bench: finalizing the ", backend_name_, " baseline: ", st.message));
    }
  }

 private:
  std::string backend_name_;
  std::unique_ptr<plugin::Backend> backend_;
  BackendPaths paths_;
  std::chrono::milliseconds op_timeout_;
  uint64_t seq_ = 0;
};

}  // namespace

std::unique_ptr<Baseline> open_plugin_baseline(Comm& comm, Device device, const nlohmann::json& described) {
  const std::string type(to_string(device.type));
  const std::string backend = comm.backends().backend_for(device.type);
  const plugin::PluginDescriptor& d = descriptor_of(backend);
  plugin::BackendInit init;
  init.comm_name = comm.name();  // NCCL names its communicator after it, as the comm's
  init.rank = comm.rank();
  init.size = comm.size();
  init.local_rank = comm.local_rank();
  init.local_size = comm.local_size();
  init.device = device;
  init.eager = true;
  init.store = make_prefix_store(str::cat("comms-bench/plugin-baseline/", type), comm.store());
  init.init_timeout = comm.init_timeout();
  init.op_timeout = comm.op_timeout();
  init.hints = routed_hints(described, type);
  init.abort_process_on_error = described.value("abort_process_on_error", false);
  // libcomms passes the address it reaches the store from, which its API does
  // not show: left empty, a CPU plugin binds as it does without a TCP store
  // (loopback when every rank is on this host).
  init.log = &log_to_stderr;
  std::unique_ptr<plugin::Backend> b;
  Status st = d.create(init, &b);
  if (st.is_ok() && !b) st = {ErrorCode::kInternal, "create() returned no backend"};
  if (st.is_ok()) st = b->init();
  if (!st.is_ok()) {
    throw Error(st.code, str::cat("comms-bench: the ", backend, " plugin's baseline backend for ", type, ": ", st.message));
  }
  return std::make_unique<PluginBaseline>(backend, std::move(b), BackendPaths::from_describe(described, device.type),
                                          comm.op_timeout());
}

}  // namespace comms::bench
