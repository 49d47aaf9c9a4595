#include "ucx_backend.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <vector>

#include <nlohmann/json.hpp>

#include "collectives.h"
#include "cpu_backend.h"
#include "hierarchical.h"
#include "host_shared_memory.h"
#include "path_table.h"
#include "plan.h"
#include "shm_collectives.h"
#include "ucx_log.h"
#include "ucx_plan.h"
#include "ucx_windows.h"
#include "vector_collectives.h"
#include "zero_copy.h"

namespace comms::ucx_backend {
namespace {

using plugin::OpType;
using cpu_algorithms::TransportError;

ErrorCode code_of(TransportError::Kind kind) {
  switch (kind) {
    case TransportError::Kind::kTimeout: return ErrorCode::kTimeout;
    case TransportError::Kind::kPeerFailure: return ErrorCode::kPeerFailure;
    case TransportError::Kind::kAborted: return ErrorCode::kAborted;
  }
  return ErrorCode::kInternal;
}

class UcxBackend final : public cpu_algorithms::CpuBackend {
 public:
  UcxBackend(const plugin::BackendInit& init, UcxSettings settings)
      : CpuBackend(
            init, "ucx", [this](const plugin::OpDesc& op) { return execute(*this, op); },
            [this] { return transport_->progress_in_flight(); }),
        settings_(std::move(settings)) {}
  ~UcxBackend() override { close(); }

  Status init() override;
  std::string describe() const override;
  Status register_window(void* data, size_t bytes, void** window) override;
  Status deregister_window(void* window) override;
  Status submit_window(const plugin::WindowOpDesc& op, std::unique_ptr<plugin::Work>* work) override;
  // Registration takes host-shared memory only (alloc_backend_memory on
  // cpu:ucx) and refuses other memory, so that a program relying on it
  // learns when it would not happen. It records the range; the windows
  // find host-shared memory by themselves, registered or not.
  Status register_buffer(void* data, size_t bytes, void** handle) override;
  Status deregister_buffer(void* handle) override;

 private:
  friend class cpu_algorithms::CpuBackend;  // its execute() calls run() and error_of()
  void run(const plugin::OpDesc& op);
  // A TransportError keeps its kind and peer; an invalid argument leaves the comm usable.
  Status error_of(const std::exception& e, const plugin::OpDesc& op, bool* fatal) const;
  void wake() override;  // aborts the transport and the shared-memory path
  Status release() override;  // flushes what is in flight within the op timeout
  Status make_child(const plugin::SplitDesc& desc, std::unique_ptr<CpuBackend>* child) const override;
  Status set_busy_poll(const std::string& value) override;
  void point_to_point(const plugin::OpDesc& op);
  // Runs a call into windows_ and turns what it threw into a status; a
  // fatal one breaks the comm.
  template <class F>
  Status window_call(F&& call, plugin::WindowOpType type);

  UcxSettings settings_;
  std::unique_ptr<UcxTransport> transport_;
  std::unique_ptr<cpu_algorithms::Collectives> collectives_;
  std::unique_ptr<cpu_algorithms::VectorCollectives> pairwise_;
  std::unique_ptr<ShmCollectives> shm_;  // small collectives when every rank is on this host
  std::unique_ptr<ZeroCopy> zero_copy_;  // on shm_: ops on host-shared buffers
  // For describe(), which may run on any thread, during finalize too.
  std::atomic<bool> zero_copy_on_{false};
  std::atomic<uint64_t> zero_copy_ops_{0};
  std::unique_ptr<cpu_algorithms::Hierarchical> hierarchical_;  // when the ranks span hosts
  std::unique_ptr<UcxWindows> windows_;  // connects at the first register_window
  UcxShape shape_;  // what plan() reads, fixed at init
  std::atomic<bool> planned_{false};  // shape_ is set: describe() prints the paths
  std::string devices_, transports_;  // what the transport opened and selected, read at init
  std::string shm_state_ = "off (one rank)";  // for describe()
  std::string direct_copies_ = "none";        // for describe(): UcxTransport::direct_text
  struct Registered {
    void* data;
    size_t bytes;
  };
  std::mutex registered_mu_;  // register_buffer may come from any thread
  std::vector<std::unique_ptr<Registered>> registered_;
};

Status UcxBackend::init() {
  try {
    transport_ = std::make_unique<UcxTransport>(init_.rank, init_.size, settings_, init_.log);
    if (init_.size > 1) transport_->connect(*init_.store, init_.init_timeout);
    // Read once: describe() may run on any thread while an op progresses the worker.
    devices_ = transport_->devices();
    transports_ = transport_->transports();
    direct_copies_ = transport_->direct_text();
    std::vector<int> pids(static_cast<size_t>(init_.size), 0);
    for (int p = 0; p < init_.size; ++p) pids[static_cast<size_t>(p)] = p == init_.rank ? 0 : transport_->pid_of(p);
    windows_ = std::make_unique<UcxWindows>(init_.rank, init_.size, pids, transport_.get(), settings_, init_.log);
    collectives_ = std::make_unique<cpu_algorithms::Collectives>(*transport_, op_timeout());
    pairwise_ = std::make_unique<cpu_algorithms::VectorCollectives>(*transport_);
    if (init_.size > 1 && !settings_.shm) shm_state_ = "off (COMMS_UCX_SHM)";
    else if (init_.size > 1 && !transport_->all_peers_local()) shm_state_ = "off (ranks on other hosts)";
    else if (init_.size > 1) {
      shm_ = ShmCollectives::create(*transport_, *init_.store, init_.init_timeout, settings_, init_.log);
      shm_state_ = shm_ ? "on, up to " + std::to_string(kShmMaxBytes) + " bytes per rank"
                        : "off (a rank could not map the segment)";
      if (shm_) {
        zero_copy_ = std::make_unique<ZeroCopy>(*shm_, init_.rank, std::move(pids), init_.log);
        zero_copy_on_ = true;
      }
    }
    if (init_.size > 1 && cpu_algorithms::spans_hosts_with_neighbours(transport_->host_of())) {
      hierarchical_ = std::make_unique<cpu_algorithms::Hierarchical>(*transport_, transport_->host_of());
    }
    shape_.size = init_.size;
    shape_.hierarchical = hierarchical_ != nullptr;
    shape_.hierarchical_all_gather =
        hierarchical_ != nullptr && cpu_algorithms::hosts_of_equal_size(transport_->host_of());
    shape_.shm_max_bytes = shm_ ? kShmMaxBytes : 0;
    shape_.zero_copy = zero_copy_ != nullptr;
    shape_.zero_copy_min_bytes = settings_.zero_copy_min_bytes;
    shape_.copies_direct = init_.size > 1;
    for (int p = 0; p < init_.size; ++p) {
      if (p != init_.rank && !transport_->copies_direct(p)) shape_.copies_direct = false;
    }
    planned_.store(true, std::memory_order_release);
    return {};
  } catch (const Error& e) {
    return {e.code(), std::string("exchanging UCX worker addresses through the store failed: ") + e.what()};
  } catch (const std::invalid_argument& e) {
    return {ErrorCode::kInvalidArgument, e.what()};
  } catch (const std::exception& e) {
    return {ErrorCode::kInternal, std::string("starting UCX failed: ") + e.what()};
  }
}

// Runs the op where plan() (ucx_plan.h) says; the one place that decides.
void UcxBackend::run(const plugin::OpDesc& op) {
  const Plan p = plan(op.type, cpu_algorithms::bytes_of(op), shape_);
  if (p.zero_copy_first && zero_copy_->run(op)) {
    zero_copy_ops_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  switch (p.path) {
    case Path::kShm: shm_->run(op); break;
    case Path::kCollectives:
      collectives_->set_timeout(op.timeout);
      cpu_algorithms::run_collective(*collectives_, p.algorithm, op);
      break;
    case Path::kPairwise: cpu_algorithms::run_pairwise(*pairwise_, op); break;
    case Path::kHierarchical:
      if (op.type == OpType::kAllGather) {
        hierarchical_->all_gather(op.input, op.output, op.count * element_size(op.dtype), op.timeout);
        break;
      }
      hierarchical_->all_reduce(op.input, op.output, op.count, element_size(op.dtype),
                                cpu_algorithms::reduction_of(op), op.timeout);
      cpu_algorithms::finish_reduction(op, op.output, op.count, init_.size);
      break;
    case Path::kPointToPoint: point_to_point(op); break;
    case Path::kOneRank: cpu_algorithms::run_on_one_rank(op); break;
    case Path::kGlooNative: throw std::logic_error("the UCX plan never chooses Gloo's collectives");
  }
  // A send left in flight (send_buffered) needs this rank's progress to
  // reach its receiver, whatever this rank does next.
  if (transport_->has_in_flight()) progress_later();
}

void UcxBackend::point_to_point(const plugin::OpDesc& op) {
  const auto deadline = cpu_algorithms::Clock::now() + op.timeout;
  const size_t es = element_size(op.dtype);
  switch (op.type) {
    case OpType::kSend:
      return transport_->point_to_point({{true, op.peer, op.tag, const_cast<void*>(op.input), op.count * es}},
                                        deadline);
    case OpType::kRecv:
      return transport_->point_to_point({{false, op.peer, op.tag, op.output, op.count * es}}, deadline);
    default: {
      std::vector<UcxTransport::P2P> ops;
      for (const auto& p : op.p2p) {
        ops.push_back({p.kind == P2POp::Kind::kSend, p.peer, p.tag, p.buffer.data, p.buffer.bytes()});
      }
      return ops.empty() ? void() : transport_->point_to_point(ops, deadline);
    }
  }
}

Status UcxBackend::error_of(const std::exception& e, const plugin::OpDesc&, bool* fatal) const {
  *fatal = true;
  if (const auto* t = dynamic_cast<const TransportError*>(&e)) {
    if (failure().aborted() || t->kind() == TransportError::Kind::kAborted) {
      return {ErrorCode::kAborted, "aborted: " + failure().reason() + " (" + t->what() + ")", t->peer()};
    }
    return {code_of(t->kind()), t->what(), t->peer()};
  }
  if (dynamic_cast<const std::invalid_argument*>(&e)) {
    *fatal = false;  // nothing was sent: the comm stays usable
    return {ErrorCode::kInvalidArgument, e.what()};
  }
  return {ErrorCode::kInternal, e.what()};
}

Status UcxBackend::make_child(const plugin::SplitDesc& desc, std::unique_ptr<CpuBackend>* child) const {
  UcxSettings settings;
  Status s = resolve_settings(desc.child.hints, desc.child.local_size, &settings);
  if (!s.is_ok()) return s;
  plugin::BackendInit child_init = desc.child;
  if (!child_init.log) child_init.log = init_.log;
  *child = std::make_unique<UcxBackend>(child_init, std::move(settings));
  return {};
}

Status UcxBackend::set_busy_poll(const std::string& value) {
  UcxSettings next;
  Status s = resolve_settings({{"busy_poll", value}}, init_.local_size, &next);
  if (!s.is_ok()) return s;
  settings_.busy_poll = next.busy_poll;
  settings_.spin_forever = next.spin_forever;
  settings_.spin = next.spin;
  settings_.yield = next.yield;
  settings_.yield_after = next.yield_after;
  if (transport_) transport_->set_spin(settings_);
  if (shm_) shm_->set_spin(settings_);
  if (windows_) windows_->set_spin(settings_);
  return {};
}

void UcxBackend::wake() {
  // The transport fails the running op now.
  if (transport_) transport_->abort();
  if (shm_) shm_->abort();
  if (zero_copy_) zero_copy_->abort();  // after shm_: its waits now throw, so the op lets go
  if (windows_) windows_->abort();
}

Status UcxBackend::release() {
  windows_.reset();  // unmaps what is still registered, and the peers' memory it mapped
  {
    std::lock_guard<std::mutex> lock(registered_mu_);
    registered_.clear();
  }
  hierarchical_.reset();
  collectives_.reset();
  pairwise_.reset();
  zero_copy_.reset();  // unmaps the peers' buffers it mapped
  shm_.reset();
  bool flushed = true;
  if (transport_) flushed = transport_->flush(cpu_algorithms::Clock::now() + op_timeout());
  transport_.reset();
  if (!flushed && !failure().broken()) {
    return {ErrorCode::kTimeout, "messages to peers were still in flight when the op timeout ran out at finalize"};
  }
  return {};
}

// A window op ran on the issuing thread; its Work is complete when made.
class DoneWork final : public plugin::Work {
 public:
  bool is_completed() override { return true; }
  Status wait(WaitMode) override { return {}; }
};

template <class F>
Status UcxBackend::window_call(F&& call, plugin::WindowOpType type) {
  if (failure().broken()) return failure().status();
  if (!windows_) return {ErrorCode::kInvalidArgument, "the UCX backend is not connected"};
  drain_ops();
  try {
    call();
    return {};
  } catch (const TransportError& t) {
    if (failure().aborted() || t.kind() == TransportError::Kind::kAborted) {
      return {ErrorCode::kAborted, "aborted: " + failure().reason() + " (" + t.what() + ")", t.peer()};
    }
    // A wait for signals that did not come changed nothing.
    if (!(type == plugin::WindowOpType::kWaitSignal && t.kind() == TransportError::Kind::kTimeout)) {
      mark_broken(t.what());
    }
    return {code_of(t.kind()), t.what(), t.peer()};
  } catch (const Error& e) {  // the store, at registration
    return {e.code(), e.what()};
  } catch (const std::invalid_argument& e) {
    return {ErrorCode::kInvalidArgument, e.what()};
  } catch (const std::exception& e) {
    return {ErrorCode::kInternal, e.what()};
  }
}

Status UcxBackend::register_window(void* data, size_t bytes, void** window) {
  return window_call([&] { *window = windows_->register_window(*init_.store, data, bytes, op_timeout()); },
                     plugin::WindowOpType::kFlush);
}

Status UcxBackend::deregister_window(void* window) {
  return window_call([&] { windows_->deregister_window(window); }, plugin::WindowOpType::kFlush);
}

Status UcxBackend::submit_window(const plugin::WindowOpDesc& op, std::unique_ptr<plugin::Work>* work) {
  Status st = window_call([&] { windows_->run(op); }, op.type);
  if (st.is_ok() && op.async) *work = std::make_unique<DoneWork>();
  return st;
}

Status UcxBackend::register_buffer(void* data, size_t bytes, void** handle) {
  if (!host_shared::find(data, bytes)) {
    return {ErrorCode::kInvalidArgument,
            "register_buffer: cpu:ucx registers memory from alloc_backend_memory only (memory every rank on "
            "the host can map); this buffer of " + std::to_string(bytes) + " bytes is not inside one such allocation"};
  }
  auto r = std::make_unique<Registered>(Registered{data, bytes});
  *handle = r.get();
  std::lock_guard<std::mutex> lock(registered_mu_);
  registered_.push_back(std::move(r));
  return {};
}

Status UcxBackend::deregister_buffer(void* handle) {
  std::lock_guard<std::mutex> lock(registered_mu_);
  auto it = std::find_if(registered_.begin(), registered_.end(), [&](const auto& r) { return r.get() == handle; });
  if (it == registered_.end()) return {ErrorCode::kInvalidArgument, "deregister_buffer: not a registration of this comm"};
  registered_.erase(it);
  return {};
}

std::string UcxBackend::describe() const {
  nlohmann::ordered_json j;
  j["ucx_version"] = ucp_get_version_string();
  j["devices"] = devices_;
  j["transports"] = transports_;
  j["tls"] = settings_.tls.empty() ? "(UCX_TLS or UCX's default)" : settings_.tls;
  j["rndv_thresh"] = rndv_thresh_text(settings_);
  j["shm_fifo"] = fifo_text();
  j["shm_collectives"] = shm_state_;
  j["direct_copies"] = direct_copies_;
  // "ops": the ops this rank ran zero-copy so far (tests and comms-bench read
  // it); "ops_on_held_mappings": those of them on the last one's buffers.
  j["zero_copy"] = {{"ops", zero_copy_ops_.load(std::memory_order_relaxed)},
                    {"ops_on_held_mappings", zero_copy_ ? zero_copy_->ops_on_held_mappings() : 0},
                    {"min_bytes", settings_.zero_copy_min_bytes},
                    {"state", zero_copy_on_ ? "on, for ops on alloc_backend_memory buffers on every rank"
                                         : "off (needs the shared-memory collectives)"}};
  j["busy_poll"] = settings_.busy_poll;
  j["spin_us"] = settings_.spin_forever ? -1 : settings_.spin.count();
  j["yield_while_polling"] = settings_.yield;
  j["yield_after_us"] = settings_.yield_after.count();
  j["op_timeout_ms"] = op_timeout().count();
  if (planned_.load(std::memory_order_acquire)) {  // once connected: shared memory and direct copies are known
    j["paths"] = cpu_algorithms::paths_json<nlohmann::ordered_json>(
        [&](OpType type, size_t bytes) { return path_name(type, bytes, plan(type, bytes, shape_), shape_); }, init_.size,
        {shape_.shm_max_bytes, kFlatAcrossHostsMinBytes, kFlatAcrossHostsMaxBytes, kHierarchicalAllGatherMaxBytes,
         shape_.zero_copy_min_bytes});
  }
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // hint and name text may not be UTF-8
}

}  // namespace

Status create_backend(const plugin::BackendInit& init, std::unique_ptr<plugin::Backend>* out) {
  route_ucx_logs(init.log);
  UcxSettings settings;
  Status s = resolve_settings(init.hints, init.local_size, &settings);
  if (!s.is_ok()) return s;
  *out = std::make_unique<UcxBackend>(init, std::move(settings));
  return {};
}

}  // namespace comms::ucx_backend
