#include "ucx_backend.h"

#include <vector>

#include <nlohmann/json.hpp>

#include "broken_state.h"
#include "op_queue.h"
#include "op_runner.h"
#include "reductions.h"
#include "shm_collectives.h"
#include "ucx_log.h"

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

class UcxBackend : public plugin::Backend {
 public:
  UcxBackend(const plugin::BackendInit& init, UcxSettings settings)
      : init_(init), settings_(std::move(settings)), op_timeout_(init.op_timeout) {}
  ~UcxBackend() override {
    if (!finalized_) finalize();
  }

  Status init() override;
  Status submit(const plugin::OpDesc& op, std::unique_ptr<plugin::Work>* work) override;
  Status split(const plugin::SplitDesc& desc, std::unique_ptr<plugin::Backend>* child) override;
  Status set_hints(const Hints& hints) override;
  Status set_op_timeout(std::chrono::milliseconds t) override {
    op_timeout_ = t;
    return {};
  }
  void abort(const std::string& reason) override;
  Status finalize() override;
  std::string describe() const override;
  bool supports_reduction(DataType dtype, ReduceKind kind) const override {
    return cpu_algorithms::reduce_fn(dtype, kind) != nullptr;
  }

 private:
  Status execute(const plugin::OpDesc& op);
  void run(const plugin::OpDesc& op);

  plugin::BackendInit init_;
  UcxSettings settings_;
  std::atomic<std::chrono::milliseconds> op_timeout_;
  std::unique_ptr<UcxTransport> transport_;
  std::unique_ptr<cpu_algorithms::OpRunner> runner_;
  std::unique_ptr<ShmCollectives> shm_;  // small collectives when every rank is on this host
  std::string devices_, transports_;  // what the transport opened and selected, read at init
  std::string shm_state_ = "off (one rank)";  // for describe()
  std::string direct_copies_ = "none";        // for describe(): UcxTransport::direct_text

  // After the first fatal error (or abort()) every op fails fast.
  cpu_algorithms::BrokenState failure_;

  bool finalized_ = false;
  // Runs ops in submission order (op_queue.h). Last: destroyed first,
  // while everything execute() uses still exists.
  cpu_algorithms::OpQueue ops_{[this](const plugin::OpDesc& op) { return execute(op); },
                               [this] { return transport_->progress_in_flight(); }};
};

Status UcxBackend::init() {
  try {
    transport_ = std::make_unique<UcxTransport>(init_.rank, init_.size, settings_, init_.log);
    if (init_.size > 1) transport_->connect(*init_.store, init_.init_timeout);
    // Read once: describe() may run on any thread while an op progresses the worker.
    devices_ = transport_->devices();
    transports_ = transport_->transports();
    direct_copies_ = transport_->direct_text();
    runner_ = std::make_unique<cpu_algorithms::OpRunner>(*transport_, op_timeout_.load());
    if (init_.size > 1 && !settings_.shm) shm_state_ = "off (COMMS_UCX_SHM)";
    else if (init_.size > 1 && !transport_->all_peers_local()) shm_state_ = "off (ranks on other hosts)";
    else if (init_.size > 1) {
      shm_ = ShmCollectives::create(*transport_, *init_.store, init_.init_timeout, settings_, init_.log);
      shm_state_ = shm_ ? "on, up to " + std::to_string(ShmCollectives::kMaxBytes) + " bytes per rank"
                        : "off (a rank could not map the segment)";
    }
    return {};
  } catch (const Error& e) {
    return {e.code(), std::string("exchanging UCX worker addresses through the store failed: ") + e.what()};
  } catch (const std::invalid_argument& e) {
    return {ErrorCode::kInvalidArgument, e.what()};
  } catch (const std::exception& e) {
    return {ErrorCode::kInternal, std::string("starting UCX failed: ") + e.what()};
  }
}

void UcxBackend::run(const plugin::OpDesc& op) {
  // Not on the shared-memory path, which reads the clock only when it waits long.
  auto deadline = [&] { return cpu_algorithms::Clock::now() + op.timeout; };
  const size_t es = element_size(op.dtype);
  switch (op.type) {
    case OpType::kSend:
      return transport_->point_to_point({{true, op.peer, op.tag, const_cast<void*>(op.input), op.count * es}},
                                        deadline());
    case OpType::kRecv:
      return transport_->point_to_point({{false, op.peer, op.tag, op.output, op.count * es}}, deadline());
    case OpType::kBatchP2P: {
      std::vector<UcxTransport::P2P> ops;
      for (const auto& p : op.p2p) {
        ops.push_back({p.kind == P2POp::Kind::kSend, p.peer, p.tag, p.buffer.data, p.buffer.bytes()});
      }
      return ops.empty() ? void() : transport_->point_to_point(ops, deadline());
    }
    default:
      if (shm_ && shm_->takes(op)) return shm_->run(op);
      return runner_->run(op);
  }
}

Status UcxBackend::execute(const plugin::OpDesc& op) {
  if (failure_.broken()) return failure_.status();
  Status s;
  try {
    run(op);
    // A send left in flight (send_buffered) needs this rank's progress to
    // reach its receiver, whatever this rank does next.
    if (transport_->has_in_flight()) ops_.progress_later();
    return {};
  } catch (const TransportError& e) {
    s = {code_of(e.kind()), e.what(), e.peer()};
    if (failure_.aborted() || e.kind() == TransportError::Kind::kAborted) {
      s = {ErrorCode::kAborted, "aborted: " + failure_.reason() + " (" + e.what() + ")", e.peer()};
    }
  } catch (const std::invalid_argument& e) {
    return {ErrorCode::kInvalidArgument, e.what()};  // nothing was sent: the comm stays usable
  } catch (const std::exception& e) {
    s = {ErrorCode::kInternal, e.what()};
  }
  failure_.mark_broken(s.message);
  return s;
}

Status UcxBackend::submit(const plugin::OpDesc& op, std::unique_ptr<plugin::Work>* work) {
  if (op.hints && !op.hints->empty()) {
    return {ErrorCode::kInvalidArgument,
            "the ucx backend takes no per-op hints (got '" + op.hints->begin()->first + "')"};
  }
  if (failure_.broken()) return failure_.status();
  return ops_.submit(op, work);
}

Status UcxBackend::split(const plugin::SplitDesc& desc, std::unique_ptr<plugin::Backend>* child) {
  if (desc.ranks.empty()) return {};  // a UCX child is its own set of endpoints
  UcxSettings settings;
  Status s = resolve_settings(desc.child.hints, desc.child.local_size, &settings);
  if (!s.is_ok()) return s;
  plugin::BackendInit child_init = desc.child;
  if (!child_init.log) child_init.log = init_.log;
  auto backend = std::make_unique<UcxBackend>(child_init, std::move(settings));
  s = backend->init();
  if (!s.is_ok()) return s;
  *child = std::move(backend);
  return {};
}

Status UcxBackend::set_hints(const Hints& hints) {
  for (const auto& [k, v] : hints) {
    if (k != "busy_poll") {
      return {ErrorCode::kUnsupported,
              "ucx hint '" + k + "' cannot change after the comm connected; pass it when creating the comm"};
    }
    UcxSettings next;
    Status s = resolve_settings({{"busy_poll", v}}, init_.local_size, &next);
    if (!s.is_ok()) return s;
    settings_.busy_poll = next.busy_poll;
    settings_.spin_forever = next.spin_forever;
    settings_.spin = next.spin;
    settings_.yield = next.yield;
    settings_.yield_after = next.yield_after;
    if (transport_) transport_->set_spin(settings_);
    if (shm_) shm_->set_spin(settings_);
  }
  return {};
}

void UcxBackend::abort(const std::string& reason) {
  failure_.abort(reason);
  // The transport fails the running op now; queued async ops still run, in
  // order, and fail fast in execute().
  if (transport_) transport_->abort();
  if (shm_) shm_->abort();
}

Status UcxBackend::finalize() {
  if (finalized_) return {};
  finalized_ = true;
  ops_.stop_and_join();  // queued ops run first (after abort() they fail fast)
  runner_.reset();
  shm_.reset();
  bool flushed = true;
  if (transport_) flushed = transport_->flush(cpu_algorithms::Clock::now() + op_timeout_.load());
  transport_.reset();
  if (!flushed && !failure_.broken()) {
    return {ErrorCode::kTimeout, "messages to peers were still in flight when the op timeout ran out at finalize"};
  }
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
  j["busy_poll"] = settings_.busy_poll;
  j["spin_us"] = settings_.spin_forever ? -1 : settings_.spin.count();
  j["yield_while_polling"] = settings_.yield;
  j["yield_after_us"] = settings_.yield_after.count();
  j["op_timeout_ms"] = op_timeout_.load().count();
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
