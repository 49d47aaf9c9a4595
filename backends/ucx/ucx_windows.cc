#include "ucx_windows.h"

#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <thread>

namespace comms::ucx_backend {
namespace {

using cpu_algorithms::TransportError;
using Kind = TransportError::Kind;
using plugin::WindowOpType;

std::string status_text(ucs_status_t s) { return ucs_status_string(s); }

void check(ucs_status_t s, const char* call) {
  if (s != UCS_OK) throw std::runtime_error(std::string(call) + " failed: " + status_text(s));
}

void append_u64(std::string* out, uint64_t v) { out->append(reinterpret_cast<const char*>(&v), sizeof v); }

uint64_t read_u64(const std::string& in, size_t* at) {
  if (*at + sizeof(uint64_t) > in.size()) throw std::runtime_error("a peer published a malformed window key");
  uint64_t v;
  std::memcpy(&v, in.data() + *at, sizeof v);
  *at += sizeof v;
  return v;
}

// "<1><fd><inode><allocation bytes><offset>" when [data, data + bytes) is
// host-shared memory, else "<0>".
void append_shared_location(std::string* out, const void* data, size_t bytes) {
  const std::optional<host_shared::Location> shared = host_shared::find(data, bytes);
  append_u64(out, shared ? 1 : 0);
  if (!shared) return;
  append_u64(out, static_cast<uint64_t>(shared->fd));
  append_u64(out, shared->inode);
  append_u64(out, shared->alloc_bytes);
  append_u64(out, shared->offset);
}

std::optional<host_shared::Location> read_shared_location(const std::string& in, size_t* at) {
  if (read_u64(in, at) != 1) return std::nullopt;
  host_shared::Location where;
  where.fd = static_cast<int>(read_u64(in, at));
  where.inode = read_u64(in, at);
  where.alloc_bytes = read_u64(in, at);
  where.offset = read_u64(in, at);
  if (where.offset > where.alloc_bytes) throw std::runtime_error("a peer published a malformed window location");
  return where;
}

}  // namespace

struct UcxWindows::Window {
  void* data = nullptr;
  size_t bytes = 0;
  ucp_mem_h data_mem = nullptr;
  ucp_mem_h signal_mem = nullptr;
  uint64_t* signals = nullptr;    // [size]: signals from each rank, written by the peers' atomics
  std::vector<uint64_t> consumed;  // per rank: signals earlier waits took
  std::vector<uint64_t> peer_data, peer_signals;  // per rank: remote addresses
  std::vector<ucp_rkey_h> data_keys, signal_keys;  // per peer (null for this rank)
  std::vector<bool> unflushed;  // per peer: puts since the last flush to it
  // Per peer on this host whose window is host-shared memory: its
  // allocation mapped here (null otherwise), and the window's offset in it.
  std::vector<unsigned char*> mapped;
  std::vector<size_t> mapped_offset;
};

UcxWindows::UcxWindows(int rank, int size, std::vector<int> pids, cpu_algorithms::Transport* direct,
                       const UcxSettings& settings, LogFn log)
    : rank_(rank),
      size_(size),
      pids_(std::move(pids)),
      direct_(direct),
      log_(log),
      tls_(settings.tls),
      peer_status_(static_cast<size_t>(size)),
      next_liveness_check_(static_cast<size_t>(size)),
      wired_(static_cast<size_t>(size), false) {
  set_spin(settings);
}

UcxWindows::~UcxWindows() {
  std::lock_guard<std::mutex> lock(mu_);
  release_all();
  std::vector<void*> closing;
  for (size_t p = 0; p < eps_.size(); ++p) {
    if (!eps_[p]) continue;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = (peer_status_[p] || aborted_) ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    ucs_status_ptr_t r = ucp_ep_close_nbx(eps_[p], &param);
    if (r && !UCS_PTR_IS_ERR(r)) closing.push_back(r);
  }
  const auto until = Clock::now() + std::chrono::seconds(1);
  for (void* r : closing) {
    while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < until) ucp_worker_progress(worker_);
    ucp_request_free(r);
  }
  if (worker_) ucp_worker_destroy(worker_);
  if (context_) ucp_cleanup(context_);
}

void UcxWindows::set_spin(const UcxSettings& s) { wait_policy_.set(s); }

void UcxWindows::fail(Kind kind, int peer, const std::string& what) const { throw TransportError(kind, peer, what); }

void UcxWindows::on_peer_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* slot = static_cast<PeerSlot*>(arg);
  slot->self->peer_status_[static_cast<size_t>(slot->rank)] = status == UCS_OK ? UCS_ERR_CONNECTION_RESET : status;
}

void UcxWindows::connect(Store& store, std::chrono::milliseconds timeout) {
  ucp_config_t* config = nullptr;
  check(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");
  if (!tls_.empty() && ucp_config_modify(config, "TLS", tls_.c_str()) != UCS_OK) {
    ucp_config_release(config);
    throw std::invalid_argument("hint ucx.tls='" + tls_ + "' is not valid for UCX");
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AMO64 | UCP_FEATURE_WAKEUP;
  params.estimated_num_eps = static_cast<size_t>(size_);
  params.mt_workers_shared = 0;
  const ucs_status_t s = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  check(s, "ucp_init (windows)");
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // under mu_; abort only signals
  check(ucp_worker_create(context_, &wp, &worker_), "ucp_worker_create (windows)");
  if (ucp_worker_get_efd(worker_, &efd_) != UCS_OK) efd_ = -1;
  ucp_address_t* address = nullptr;
  size_t length = 0;
  check(ucp_worker_get_address(worker_, &address, &length), "ucp_worker_get_address");
  store.set("ucx/win/addr/" + std::to_string(rank_), std::string(reinterpret_cast<const char*>(address), length));
  ucp_worker_release_address(worker_, address);
  eps_.assign(static_cast<size_t>(size_), nullptr);
  slots_.resize(static_cast<size_t>(size_));
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const std::string peer_address = store.get("ucx/win/addr/" + std::to_string(p), timeout);
    slots_[static_cast<size_t>(p)] = {this, p};
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(peer_address.data());
    // As the transport's endpoints: on this host the pid is watched.
    ep.err_mode = pids_[static_cast<size_t>(p)] > 0 ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &UcxWindows::on_peer_error;
    ep.err_handler.arg = &slots_[static_cast<size_t>(p)];
    check(ucp_ep_create(worker_, &ep, &eps_[static_cast<size_t>(p)]), "ucp_ep_create (windows)");
  }
}

void* UcxWindows::register_window(Store& store, void* data, size_t bytes, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) fail(Kind::kAborted, -1, "register_window aborted");
  if (!worker_) connect(store, timeout);
  auto w = std::make_unique<Window>();
  w->data = data;
  w->bytes = bytes;
  w->consumed.assign(static_cast<size_t>(size_), 0);
  w->peer_data.assign(static_cast<size_t>(size_), 0);
  w->peer_signals.assign(static_cast<size_t>(size_), 0);
  w->data_keys.assign(static_cast<size_t>(size_), nullptr);
  w->signal_keys.assign(static_cast<size_t>(size_), nullptr);
  w->unflushed.assign(static_cast<size_t>(size_), false);
  w->mapped.assign(static_cast<size_t>(size_), nullptr);
  w->mapped_offset.assign(static_cast<size_t>(size_), 0);
  // Whatever fails below releases what was made so far.
  struct Undo {
    UcxWindows* self;
    std::unique_ptr<Window>* w;
    ~Undo() {
      if (*w) {
        self->windows_.push_back(std::move(*w));
        self->deregister_window_locked(self->windows_.back().get());
      }
    }
  };
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = data;
  mp.length = bytes;
  check(ucp_mem_map(context_, &mp, &w->data_mem), "ucp_mem_map (the window)");
  Undo undo{this, &w};
  // The counters live in memory UCX allocates: on this host shared memory,
  // which the peers' atomics reach directly.
  ucp_mem_map_params_t sp{};
  sp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  sp.address = nullptr;
  sp.length = sizeof(uint64_t) * static_cast<size_t>(size_);
  sp.flags = UCP_MEM_MAP_ALLOCATE;
  check(ucp_mem_map(context_, &sp, &w->signal_mem), "ucp_mem_map (the signal counters)");
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
  check(ucp_mem_query(w->signal_mem, &attr), "ucp_mem_query");
  w->signals = static_cast<uint64_t*>(attr.address);
  for (int r = 0; r < size_; ++r) __atomic_store_n(&w->signals[r], 0, __ATOMIC_RELEASE);

  // "<data address><signals address><data key size><data key><signals key size><signals key>
  //  <1 if host-shared: <fd><inode><allocation bytes><offset>, else 0>"
  std::string mine;
  append_u64(&mine, reinterpret_cast<uintptr_t>(data));
  append_u64(&mine, reinterpret_cast<uintptr_t>(w->signals));
  for (ucp_mem_h mem : {w->data_mem, w->signal_mem}) {
    void* packed = nullptr;
    size_t size = 0;
    check(ucp_rkey_pack(context_, mem, &packed, &size), "ucp_rkey_pack");
    append_u64(&mine, size);
    mine.append(static_cast<const char*>(packed), size);
    ucp_rkey_buffer_release(packed);
  }
  append_shared_location(&mine, data, bytes);
  const std::string prefix = "ucx/win/" + std::to_string(windows_made_++) + "/";
  store.set(prefix + std::to_string(rank_), mine);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const std::string theirs = store.get(prefix + std::to_string(p), timeout);
    size_t at = 0;
    w->peer_data[static_cast<size_t>(p)] = read_u64(theirs, &at);
    w->peer_signals[static_cast<size_t>(p)] = read_u64(theirs, &at);
    for (ucp_rkey_h* key : {&w->data_keys[static_cast<size_t>(p)], &w->signal_keys[static_cast<size_t>(p)]}) {
      const size_t size = read_u64(theirs, &at);
      if (at + size > theirs.size()) throw std::runtime_error("rank " + std::to_string(p) + " published a malformed window key");
      check(ucp_ep_rkey_unpack(eps_[static_cast<size_t>(p)], theirs.data() + at, key), "ucp_ep_rkey_unpack");
      at += size;
    }
    const std::optional<host_shared::Location> where = read_shared_location(theirs, &at);
    if (where && pids_[static_cast<size_t>(p)] > 0) {
      w->mapped[static_cast<size_t>(p)] = map_peer(p, *where);
      w->mapped_offset[static_cast<size_t>(p)] = where->offset;
    }
  }
  // No rank may release its part (abort, deregistration) while a peer still
  // unpacks its keys: the peer's attach to the shared memory would fail.
  store.set(prefix + "unpacked/" + std::to_string(rank_), "1");
  std::vector<std::string> keys;
  for (int p = 0; p < size_; ++p) keys.push_back(prefix + "unpacked/" + std::to_string(p));
  store.wait(keys, timeout);
  windows_.push_back(std::move(w));
  return windows_.back().get();
}

void UcxWindows::deregister_window(void* window) {
  std::lock_guard<std::mutex> lock(mu_);
  deregister_window_locked(static_cast<Window*>(window));
}

void UcxWindows::deregister_window_locked(Window* w) {
  auto it = std::find_if(windows_.begin(), windows_.end(), [&](const auto& x) { return x.get() == w; });
  if (it == windows_.end()) return;  // released by abort()
  for (ucp_rkey_h k : w->data_keys) {
    if (k) ucp_rkey_destroy(k);
  }
  for (ucp_rkey_h k : w->signal_keys) {
    if (k) ucp_rkey_destroy(k);
  }
  for (int p = 0; p < size_; ++p) {
    if (w->mapped[static_cast<size_t>(p)]) unmap_peer(p, w->mapped[static_cast<size_t>(p)]);
  }
  std::string failed;
  if (w->data_mem && ucp_mem_unmap(context_, w->data_mem) != UCS_OK) failed = "the window";
  if (w->signal_mem && ucp_mem_unmap(context_, w->signal_mem) != UCS_OK) failed = "the signal counters";
  windows_.erase(it);
  if (!failed.empty()) throw std::runtime_error("ucp_mem_unmap of " + failed + " failed");
}

unsigned char* UcxWindows::map_peer(int peer, const host_shared::Location& at) {
  for (PeerMapping& m : mappings_) {
    if (m.peer == peer && m.inode == at.inode) {
      ++m.windows;
      return m.base;
    }
  }
  std::string why_not;
  auto* base = static_cast<unsigned char*>(host_shared::map_peer(pids_[static_cast<size_t>(peer)], at, &why_not));
  if (!base) {
    if (log_) {
      log_(2, ("ucx: rank " + std::to_string(peer) + "'s window is host-shared memory, but mapping it failed (" +
               why_not + "); puts to it take cross-memory attach").c_str());
    }
    return nullptr;
  }
  mappings_.push_back({peer, at.inode, base, at.alloc_bytes, 1});
  return base;
}

void UcxWindows::unmap_peer(int peer, unsigned char* base) {
  for (auto it = mappings_.begin(); it != mappings_.end(); ++it) {
    if (it->peer != peer || it->base != base) continue;
    if (--it->windows == 0) {
      host_shared::unmap_peer(it->base, it->bytes);
      mappings_.erase(it);
    }
    return;
  }
}

void UcxWindows::release_all() {
  while (!windows_.empty()) {
    try {
      deregister_window_locked(windows_.back().get());
    } catch (const std::exception& e) {
      if (log_) log_(3, (std::string("ucx: releasing a window: ") + e.what()).c_str());
    }
  }
}

void UcxWindows::abort() {
  aborted_ = true;
  if (worker_) ucp_worker_signal(worker_);
  // The running op wakes within a poll slice and lets go of the lock. Tried
  // in a loop, not with a timed mutex: libstdc++'s try_lock_for goes through
  // pthread_mutex_clocklock, which ThreadSanitizer does not see acquire.
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  const auto until = Clock::now() + std::chrono::milliseconds(200);
  while (!lock.owns_lock() && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    (void)lock.try_lock();
  }
  if (lock.owns_lock()) release_all();
}

void UcxWindows::run(const plugin::WindowOpDesc& op) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) fail(Kind::kAborted, -1, "aborted");
  auto* w = static_cast<Window*>(op.window);
  const auto deadline = Clock::now() + op.timeout;
  switch (op.type) {
    case WindowOpType::kPut:
      put(*w, op, deadline);
      if (op.signal) signal(*w, op.peer, deadline);
      return;
    case WindowOpType::kSignal: return signal(*w, op.peer, deadline);
    case WindowOpType::kWaitSignal: return wait_signal(*w, op, deadline);
    case WindowOpType::kFlush:
      std::atomic_thread_fence(std::memory_order_release);  // memcpy puts: done, and ordered before what follows
      for (int p = 0; p < size_; ++p) flush_peer(*w, p, deadline);
      return;
  }
}

void UcxWindows::put(Window& w, const plugin::WindowOpDesc& op, Clock::time_point deadline) {
  if (op.bytes == 0) return;
  if (op.peer == rank_) {
    std::memmove(static_cast<unsigned char*>(w.data) + op.offset, op.input, op.bytes);
    return;
  }
  check_peer(op.peer);
  if (unsigned char* to = w.mapped[static_cast<size_t>(op.peer)]) {
    std::memcpy(to + w.mapped_offset[static_cast<size_t>(op.peer)] + op.offset, op.input, op.bytes);
    return;
  }
  if (direct_ && direct_->copies_direct(op.peer)) {
    return direct_->write_direct(op.peer, op.input, w.peer_data[static_cast<size_t>(op.peer)] + op.offset, op.bytes,
                                 deadline);
  }
  ucp_request_param_t param{};
  ucs_status_ptr_t r = ucp_put_nbx(eps_[static_cast<size_t>(op.peer)], op.input, op.bytes,
                                   w.peer_data[static_cast<size_t>(op.peer)] + op.offset,
                                   w.data_keys[static_cast<size_t>(op.peer)], &param);
  w.unflushed[static_cast<size_t>(op.peer)] = true;
  wait(r, op.peer, deadline, "put");
}

void UcxWindows::signal(Window& w, int peer, Clock::time_point deadline) {
  if (peer == rank_) {
    __atomic_fetch_add(&w.signals[rank_], 1, __ATOMIC_RELEASE);
    return;
  }
  // Every memcpy put before this signal is visible to whoever reads it
  // (acquire in wait_signal). UCX's atomic on shared memory is a CPU
  // read-modify-write; the fence keeps the copies' stores ahead of it.
  std::atomic_thread_fence(std::memory_order_release);
  // The atomic may take another lane than the puts (cross-memory attach
  // for the data, shared memory for the counters): only a flush orders them.
  flush_peer(w, peer, deadline);
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
  param.datatype = ucp_dt_make_contig(sizeof(uint64_t));
  ucs_status_ptr_t r = ucp_atomic_op_nbx(eps_[static_cast<size_t>(peer)], UCP_ATOMIC_OP_ADD, &one_, 1,
                                         w.peer_signals[static_cast<size_t>(peer)] + sizeof(uint64_t) * rank_,
                                         w.signal_keys[static_cast<size_t>(peer)], &param);
  wait(r, peer, deadline, "signal");
  // On a wired-up endpoint to this host the add is a CPU atomic, done in
  // place. Otherwise flush until it reached the peer: it may wait in this
  // worker (an endpoint still wiring up, an emulated atomic), and this rank
  // may next block outside its windows, where nothing progresses the worker.
  if (wired_[static_cast<size_t>(peer)] && pids_[static_cast<size_t>(peer)] > 0) return;
  w.unflushed[static_cast<size_t>(peer)] = true;
  flush_peer(w, peer, deadline);
}

void UcxWindows::flush_peer(Window& w, int peer, Clock::time_point deadline) {
  if (!w.unflushed[static_cast<size_t>(peer)]) return;
  check_peer(peer);
  ucp_request_param_t param{};
  wait(ucp_ep_flush_nbx(eps_[static_cast<size_t>(peer)], &param), peer, deadline, "flush");
  w.unflushed[static_cast<size_t>(peer)] = false;
  wired_[static_cast<size_t>(peer)] = true;  // a flush completes only once the endpoint is wired up
}

void UcxWindows::wait_signal(Window& w, const plugin::WindowOpDesc& op, Clock::time_point deadline) {
  const WaitPolicy::Phases phases = wait_policy_.start();
  for (;;) {
    int short_of = -1;  // a rank whose signals are still missing
    for (int r = 0; r < size_ && short_of < 0; ++r) {
      const uint64_t arrived = __atomic_load_n(&w.signals[r], __ATOMIC_ACQUIRE);
      if (arrived - w.consumed[static_cast<size_t>(r)] < op.signal_counts[static_cast<size_t>(r)]) short_of = r;
    }
    if (short_of < 0) {
      for (int r = 0; r < size_; ++r) w.consumed[static_cast<size_t>(r)] += op.signal_counts[static_cast<size_t>(r)];
      return;
    }
    if (aborted_) fail(Kind::kAborted, short_of, "wait_signal aborted");
    if (short_of != rank_) check_peer(short_of);
    if (Clock::now() >= deadline) {
      const uint64_t arrived = __atomic_load_n(&w.signals[short_of], __ATOMIC_ACQUIRE) -
                               w.consumed[static_cast<size_t>(short_of)];
      fail(Kind::kTimeout, short_of,
           "wait_signal: " + std::to_string(arrived) + " of " +
               std::to_string(op.signal_counts[static_cast<size_t>(short_of)]) + " signals from rank " +
               std::to_string(short_of) + " arrived within the timeout (none was consumed)");
    }
    progress_or_sleep(deadline, phases);
  }
}

void UcxWindows::check_peer(int peer) {
  const size_t p = static_cast<size_t>(peer);
  if (!peer_status_[p] && pids_[p] > 0) {
    const auto now = Clock::now();
    if (now >= next_liveness_check_[p]) {
      next_liveness_check_[p] = now + kLivenessPeriod;
      if (!process_alive(pids_[p])) {
        fail(Kind::kPeerFailure, peer,
             "rank " + std::to_string(peer) + " (pid " + std::to_string(pids_[p]) + " on this host) has exited");
      }
    }
  }
  if (const int s = peer_status_[p].load()) {
    fail(Kind::kPeerFailure, peer, "the UCX endpoint to rank " + std::to_string(peer) + " failed (" +
                                       status_text(static_cast<ucs_status_t>(s)) + ")");
  }
}

void UcxWindows::wait(ucs_status_ptr_t req, int peer, Clock::time_point deadline, const char* what) {
  if (req == nullptr) return;  // done at once
  if (UCS_PTR_IS_ERR(req)) {
    fail(Kind::kPeerFailure, peer, std::string(what) + " to rank " + std::to_string(peer) + ": " +
                                       status_text(UCS_PTR_STATUS(req)));
  }
  const WaitPolicy::Phases phases = wait_policy_.start();
  for (;;) {
    const ucs_status_t s = ucp_request_check_status(req);
    if (s != UCS_INPROGRESS) {
      ucp_request_free(req);
      if (s == UCS_OK) return;
      fail(Kind::kPeerFailure, peer, std::string(what) + " to rank " + std::to_string(peer) + ": " + status_text(s));
    }
    const char* why = aborted_ ? "aborted" : nullptr;
    try {
      if (!why) check_peer(peer);
    } catch (...) {
      ucp_request_cancel(worker_, req);
      ucp_request_free(req);
      throw;
    }
    if (!why && Clock::now() >= deadline) why = "timed out";
    if (why) {
      // UCX drops the request once it ends; the comm is failing.
      ucp_request_cancel(worker_, req);
      ucp_request_free(req);
      fail(aborted_ ? Kind::kAborted : Kind::kTimeout, peer,
           std::string(what) + " to rank " + std::to_string(peer) + " " + why);
    }
    progress_or_sleep(deadline, phases);
  }
}

void UcxWindows::progress_or_sleep(Clock::time_point deadline, const WaitPolicy::Phases& phases) {
  // 1 ms at most: a signal written by a CPU atomic wakes no one.
  wait_policy_.progress_or_sleep(worker_, efd_, deadline, phases, 0, 1);
}

}  // namespace comms::ucx_backend
