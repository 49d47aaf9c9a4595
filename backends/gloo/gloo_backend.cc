#include "gloo_backend.h"
#include "text.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>

#include <nlohmann/json.hpp>

#include "collectives.h"
#include "cpu_backend.h"
#include "errors.h"
#include "full_mesh.h"
#include "gloo_ops.h"
#include "gloo_transport.h"
#include "op_rules.h"
#include "path_table.h"
#include "plan.h"
#include "send_buffers.h"
#include "sockets.h"
#include "store_adapter.h"

namespace comms::gloo_backend {
namespace {

using plugin::OpType;
using Clock = std::chrono::steady_clock;

// One transport device (and its event-loop thread) per bind address, shared
// by every comm of the process.
std::shared_ptr<MeshDevice> shared_device(const GlooConfig& cfg) {
  static std::mutex mu;
  static auto* devices = new std::map<std::string, std::shared_ptr<MeshDevice>>();
  const std::string key = cfg.interface.empty() ? "host:" + cfg.hostname : "iface:" + cfg.interface;
  std::lock_guard<std::mutex> lock(mu);
  auto& d = (*devices)[key];
  if (!d) {
    ::gloo::transport::tcp::attr attr;
    if (!cfg.interface.empty()) attr.iface = cfg.interface;
    else attr.hostname = cfg.hostname;
    d = std::make_shared<MeshDevice>(attr);
  }
  return d;
}

class GlooBackend final : public cpu_algorithms::CpuBackend {
 public:
  GlooBackend(const plugin::BackendInit& init, GlooConfig config)
      : CpuBackend(init, "gloo", [this](const plugin::OpDesc& op) { return execute(*this, op); }),
        config_(std::move(config)) {}
  ~GlooBackend() override { close(); }

  Status init() override;
  std::string describe() const override;

 private:
  friend class cpu_algorithms::CpuBackend;  // its execute() calls run() and error_of()
  // The op's path (op_rules.h): the one place that decides how it runs.
  Plan plan(const plugin::OpDesc& op) const {
    const bool sync_mesh = sync_mesh_up_.load(std::memory_order_relaxed) && op.timeout == sync_timeout_;
    return gloo_backend::plan(op.type, cpu_algorithms::bytes_of(op), {init_.size, sync_mesh});
  }
  void run(const plugin::OpDesc& op);
  // Every error breaks the comm: classify_error (errors.h) names its code and peer.
  Status error_of(const std::exception& e, const plugin::OpDesc& op, bool* fatal) const;
  Status translate(const std::exception& e, const plugin::OpDesc* op, Clock::time_point started) const;
  void wake() override;  // shuts our pairs' sockets down
  Status release() override;  // closes both meshes
  Status make_child(const plugin::SplitDesc& desc, std::unique_ptr<CpuBackend>* child) const override;
  Status set_busy_poll(const std::string& value) override;
  void connect_meshes();
  void remember_endpoints(const std::set<int>& opened);

  GlooConfig config_;
  std::shared_ptr<MeshDevice> device_;
  // The two meshes: the async mesh (Gloo's own pairs, every op) and the sync
  // mesh (pairs in sync mode, read by the calling thread: the CPU algorithms).
  std::shared_ptr<Mesh> async_mesh_;
  std::shared_ptr<Mesh> sync_mesh_;
  std::chrono::milliseconds sync_timeout_{0};  // fixed in the sync mesh's pairs at connect
  std::atomic<bool> sync_mesh_up_{false};      // connected (init): plan() may choose it
  std::unique_ptr<GlooTransport> transport_;   // the sync mesh, for the CPU algorithms
  std::unique_ptr<cpu_algorithms::Collectives> sync_ops_;  // the CPU algorithms on it
  std::unique_ptr<AsyncOps> async_ops_;                    // Gloo's collectives on the async mesh
  std::vector<FoundSocket> sockets_;  // of our pairs, for abort()
  std::vector<std::pair<sockaddr_storage, int>> peer_endpoints_;  // remote end or listen address -> rank
  Clock::time_point started_;  // the running op's start, for its error's elapsed time
};

void GlooBackend::connect_meshes() {
  StoreAdapter async_store(*init_.store, "async/", init_.init_timeout);
  StoreAdapter sync_store(*init_.store, "sync/", init_.init_timeout);
  async_mesh_ = std::make_shared<Mesh>(init_.rank, init_.size);
  sync_mesh_ = std::make_shared<Mesh>(init_.rank, init_.size);
  // Pairs copy the context timeout when they are created and use it as their
  // socket read/write timeout, so it must be the op timeout already; the
  // sync mesh keeps it, and ops with another timeout use the async mesh.
  sync_timeout_ = op_timeout();
  async_mesh_->setTimeout(sync_timeout_);
  sync_mesh_->setTimeout(sync_timeout_);
  Mesh::connect({{async_mesh_.get(), &async_store}, {sync_mesh_.get(), &sync_store}}, *device_);
  sync_mesh_->set_sync(config_.busy_poll == "1", *device_);
  // Gloo's text names a peer by its connection's remote end (remember_endpoints)
  // or, on the side that accepted, by the address the peer listened on.
  for (StoreAdapter* store : {&async_store, &sync_store}) {
    for (int r = 0; r < init_.size; ++r) {
      if (r != init_.rank) peer_endpoints_.emplace_back(store->pair_listen_address(r, init_.rank, init_.size), r);
    }
  }
}

Status GlooBackend::init() {
  if (init_.size == 1) return {};  // nothing to connect to: its plan copies
  const SocketFds sockets_before = socket_fds();
  try {
    device_ = shared_device(config_);
    connect_meshes();
    size_send_buffers(*sync_mesh_, *async_mesh_, init_.init_timeout);
    const std::set<int> opened = sockets_opened_since(sockets_before);
    transport_ = std::make_unique<GlooTransport>(sync_mesh_, config_.spin, opened);
    sync_ops_ = std::make_unique<cpu_algorithms::Collectives>(*transport_, sync_timeout_);
    async_ops_ = std::make_unique<AsyncOps>(async_mesh_, init_.rank, init_.size);
    set_cloexec_on_sockets_since(sockets_before);
    remember_endpoints(opened);
    sync_mesh_up_.store(true, std::memory_order_release);
    return {};
  } catch (const comms::Error& e) {
    return {e.code(), cat({"rendezvous through the store failed: ", e.what()})};
  } catch (const std::exception& e) {
    Status s = translate(e, nullptr, Clock::now());
    s.message = cat({"connecting the Gloo mesh (", config_.interface.empty() ? "host " : "interface ",
                     config_.interface.empty() ? config_.hostname : config_.interface, ") failed: ",
                     s.message});
    return s;
  }
}

void GlooBackend::remember_endpoints(const std::set<int>& opened) {
  // Both ends of every connection found: abort() shuts these sockets down,
  // the remote ends turn Gloo's "peer [addr]" messages into ranks.
  std::vector<sockaddr_storage> locals;
  std::vector<int> ranks_of_locals;
  for (auto* ctx : {async_mesh_.get(), sync_mesh_.get()}) {
    for (int r = 0; r < init_.size; ++r) {
      if (r == init_.rank) continue;
      auto& pair = ctx->getPair(r);
      if (!pair) continue;
      const auto& addr = static_cast<const ::gloo::transport::tcp::Address&>(pair->address());
      locals.push_back(addr.getSockaddr());
      ranks_of_locals.push_back(r);
    }
  }
  for (const auto& [socket, i] : sockets_bound_to(opened, locals)) {
    sockets_.push_back(socket);
    peer_endpoints_.emplace_back(socket.remote, ranks_of_locals[i]);
  }
}

// Runs the op where plan() says: the one-rank copy, the CPU algorithms on
// the sync mesh, or Gloo's collectives on the async mesh (gloo_ops.cc).
void GlooBackend::run(const plugin::OpDesc& op) {
  started_ = Clock::now();
  const Plan p = plan(op);
  switch (p.path) {
    case Path::kOneRank: return cpu_algorithms::run_on_one_rank(op);
    case Path::kCollectives: return cpu_algorithms::run_collective(*sync_ops_, p.algorithm, op);
    default: return async_ops_->run(op);
  }
}

Status GlooBackend::translate(const std::exception& e, const plugin::OpDesc* op, Clock::time_point started) const {
  ErrorContext ctx;
  ctx.aborted = failure().aborted();
  if (ctx.aborted) ctx.abort_reason = failure().reason();
  if (op) {
    ctx.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
    ctx.timeout = op->timeout;
    if (op->type == OpType::kSend || op->type == OpType::kRecv) ctx.peer = op->peer;
  }
  ctx.peers = &peer_endpoints_;
  return classify_error(e, ctx);
}

Status GlooBackend::error_of(const std::exception& e, const plugin::OpDesc& op, bool* fatal) const {
  *fatal = true;
  return translate(e, &op, started_);
}

Status GlooBackend::make_child(const plugin::SplitDesc& desc, std::unique_ptr<CpuBackend>* child) const {
  GlooConfig cfg;
  Status s = resolve_config(desc.child.hints, desc.child.local_size, desc.child.size,
                            init_.store_local_address, &cfg);
  if (!s.is_ok()) return s;
  plugin::BackendInit child_init = desc.child;
  child_init.store_local_address = init_.store_local_address;
  *child = std::make_unique<GlooBackend>(child_init, std::move(cfg));
  return {};
}

Status GlooBackend::set_busy_poll(const std::string& value) {
  GlooConfig cfg = config_;
  Status s = resolve_busy_poll(value, "hint gloo.busy_poll", init_.local_size, &cfg);
  if (!s.is_ok()) return s;
  config_.busy_poll = cfg.busy_poll;
  config_.busy_poll_enabled = cfg.busy_poll_enabled;
  config_.spin = cfg.spin;
  if (sync_mesh_) {
    sync_mesh_->set_sync(cfg.busy_poll == "1", *device_);
    transport_->set_spin(cfg.spin);
  }
  return {};
}

void GlooBackend::wake() {
  // Wake every thread blocked on these sockets (ours and Gloo's loop):
  // shutdown() makes their reads fail now, and the peers see EOF.
  for (const auto& socket : sockets_) {
    if (still_the_same(socket)) ::shutdown(socket.fd, SHUT_RDWR);
  }
}

Status GlooBackend::release() {
  sync_ops_.reset();
  transport_.reset();  // its buffers unregister from the pairs
  if (async_ops_) async_ops_->reset();
  try {
    if (async_mesh_) async_mesh_->close(*device_);
    if (sync_mesh_) sync_mesh_->close(*device_);
  } catch (const std::exception& e) {
    async_mesh_.reset();
    sync_mesh_.reset();
    return {ErrorCode::kInternal, cat({"closing Gloo connections: ", e.what()})};
  }
  async_mesh_.reset();
  sync_mesh_.reset();
  return {};
}

std::string GlooBackend::describe() const {
  nlohmann::ordered_json j;
  j["transport"] = "tcp";
  j["interface"] = config_.interface;
  j["hostname"] = config_.hostname;
  j["busy_poll"] = config_.busy_poll;
  j["busy_poll_enabled"] = config_.busy_poll_enabled;
  j["spin_us"] = config_.spin.count();
  j["sync_path_max_bytes"] = kSyncPathMaxBytes;
  j["op_timeout_ms"] = op_timeout().count();
  // Once connected, for ops with the comm's op timeout (one with another
  // timeout runs Gloo's collectives).
  const bool up = sync_mesh_up_.load(std::memory_order_acquire);
  if (init_.size == 1 || up) {
    const GlooShape comm{init_.size, up && op_timeout() == sync_timeout_};
    j["paths"] = cpu_algorithms::paths_json<nlohmann::ordered_json>(
        [&](OpType type, size_t bytes) { return path_name(type, gloo_backend::plan(type, bytes, comm)); },
        init_.size, {});
  }
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // hint and name text may not be UTF-8
}

}  // namespace

// Gloo writes with writev(2), which cannot pass MSG_NOSIGNAL, so a write to
// a peer that has closed raises SIGPIPE, whose default kills the process
// instead of letting the op fail with peer_failure. Ignore it when it is at
// its default, as Python does; a handler the program installed stays.
void ignore_default_sigpipe() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      struct sigaction ignore {};
      ignore.sa_handler = SIG_IGN;
      sigemptyset(&ignore.sa_mask);
      sigaction(SIGPIPE, &ignore, nullptr);
    }
  });
}

Status create_backend(const plugin::BackendInit& init, std::unique_ptr<plugin::Backend>* out) {
  ignore_default_sigpipe();
  GlooConfig cfg;
  Status s = resolve_config(init.hints, init.local_size, init.size, init.store_local_address, &cfg);
  if (!s.is_ok()) return s;
  *out = std::make_unique<GlooBackend>(init, std::move(cfg));
  return {};
}

}  // namespace comms::gloo_backend
