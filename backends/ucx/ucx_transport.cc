#include "ucx_transport.h"

#include "algorithms.h"
#include "comms/env.h"

#include <poll.h>
#include <sys/uio.h>
#include <signal.h>
#include <unistd.h>
#include <sched.h>
#include <stdio.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <regex>
#include <set>
#include <stdexcept>

namespace comms::ucx_backend {
namespace {

using cpu_algorithms::Channel;
using cpu_algorithms::Region;
using cpu_algorithms::TransportError;
using Kind = TransportError::Kind;

// Tag: class (4 bits) | sender rank (28 bits) | sequence or user tag (32 bits).
constexpr uint64_t kP2PClass = 8;
constexpr uint64_t kCreditClass = 9;  // credit grants (take_credit)
constexpr uint64_t kFullMask = ~uint64_t{0};
constexpr size_t kDefaultRndvThresh = cpu_algorithms::kExchangeMaxBytes + 1;
constexpr uint32_t kHandshakeTag = 0xffffffffu;  // a p2p tag: users' tags are below it in practice
uint64_t make_tag(uint64_t cls, int sender, uint32_t low) {
  return (cls << 60) | (uint64_t(uint32_t(sender) & 0x0fffffffu) << 32) | low;
}

std::string status_text(ucs_status_t s) { return ucs_status_string(s); }

void check(ucs_status_t s, const char* call) {
  if (s != UCS_OK) throw std::runtime_error(std::string(call) + " failed: " + status_text(s));
}

// What a FILE*-printing UCX call prints.
template <class F>
std::string capture(F&& print) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  if (!f) return {};
  print(f);
  fclose(f);
  std::string out(buf, len);
  free(buf);
  return out;
}

// "tl/dev" pairs in UCX's printouts, in order, once each.
std::string transport_pairs(const std::string& text, const std::regex& re) {
  std::set<std::string> seen;
  std::string out;
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it) {
    const std::string m = (*it)[1].str();
    if (seen.insert(m).second) out += (out.empty() ? "" : ",") + m;
  }
  return out;
}

// This machine's boot, host name and PID namespace: peers that share all
// three are watched by PID (the boot id tells two machines apart even when
// their containers' host names and namespace numbers match).
std::string host_identity() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  char ns[128] = {};
  const ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  std::getline(boot, boot_id);
  return boot_id + "|" + host + "|" + (n > 0 ? std::string(ns, static_cast<size_t>(n)) : "");
}

}  // namespace

// False once the process has exited (or is a zombie nobody reaped yet).
bool process_alive(int pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return !text.empty();
  const char state = text[close + 2];
  return state != 'Z' && state != 'X';
}

std::vector<FifoSetting> fifo_settings() {
  // UCX reads UCX_SYSV_... and UCX_POSIX_... before UCX_MM_...: comms sets
  // UCX's MM_ key (both transports) only where none of the three is set.
  auto setting = [](const char* key, std::optional<std::string> sysv, std::optional<std::string> posix,
                    std::optional<std::string> mm, size_t ours) {
    for (auto& set : {sysv, posix, mm}) {
      if (set) return FifoSetting{key, *set, true};
    }
    return FifoSetting{key, std::to_string(ours), false};
  };
  return {setting("MM_FIFO_ELEM_SIZE", env::get("UCX_SYSV_FIFO_ELEM_SIZE"), env::get("UCX_POSIX_FIFO_ELEM_SIZE"),
                  env::get("UCX_MM_FIFO_ELEM_SIZE"), kFifoElemBytes),
          setting("MM_FIFO_SIZE", env::get("UCX_SYSV_FIFO_SIZE"), env::get("UCX_POSIX_FIFO_SIZE"),
                  env::get("UCX_MM_FIFO_SIZE"), kFifoElems)};
}

std::string fifo_text() {
  std::string out;
  for (const auto& f : fifo_settings()) {
    out += (out.empty() ? "" : ", ") + f.key + "=" + f.value + (f.from_user ? " (environment)" : " (comms' default)");
  }
  return out;
}

std::string rndv_thresh_text(const UcxSettings& settings) {
  if (!settings.rndv_thresh.empty()) return settings.rndv_thresh + " (hint ucx.rndv_thresh)";
  if (auto set = env::get("UCX_RNDV_THRESH")) return *set + " (UCX_RNDV_THRESH)";
  return std::to_string(kDefaultRndvThresh) + " (comms' default)";
}

void UcxTransport::check_peer_alive(int peer) {
  const int pid = pids_[static_cast<size_t>(peer)];
  if (pid <= 0 || peer_status_[static_cast<size_t>(peer)]) return;
  const auto now = Clock::now();
  if (now < next_liveness_check_) return;
  next_liveness_check_ = now + kLivenessPeriod;
  if (!process_alive(pid)) {
    peer_status_[static_cast<size_t>(peer)] = UCS_ERR_CONNECTION_RESET;
    dead_pid_[static_cast<size_t>(peer)] = true;
  }
}

UcxTransport::UcxTransport(int rank, int size, const UcxSettings& settings, LogFn log)
    : rank_(rank),
      size_(size),
      log_(log),
      peer_status_(static_cast<size_t>(size)),
      send_seq_(static_cast<size_t>(size), std::vector<uint32_t>(cpu_algorithms::kNumChannels, 0)),
      recv_seq_(static_cast<size_t>(size), std::vector<uint32_t>(cpu_algorithms::kNumChannels, 0)),
      pids_(static_cast<size_t>(size), 0),
      dead_pid_(static_cast<size_t>(size), false),
      direct_(static_cast<size_t>(size), false) {
  set_spin(settings);
  ucp_config_t* config = nullptr;
  check(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");
  auto modify = [&](const char* name, const std::string& value, const char* hint) {
    if (value.empty()) return;
    const ucs_status_t s = ucp_config_modify(config, name, value.c_str());
    if (s != UCS_OK) {
      ucp_config_release(config);
      throw std::invalid_argument(std::string("hint ucx.") + hint + "='" + value + "' is not valid for UCX: " +
                                  status_text(s));
    }
  };
  modify("TLS", settings.tls, "tls");
  // Every message of the small-op paths (at most kExchangeMaxBytes) goes
  // eager by default: a rendezvous handshake with a peer that sleeps costs
  // more than the copy. So do the pieces of a large all_reduce or broadcast
  // (32-64 KiB, algorithms.h); a broadcast above 4 MiB and the pairwise
  // exchange's 128 KiB pieces go rendezvous (the receiver copies them out of
  // the sender's memory).
  const bool thresh_given = !settings.rndv_thresh.empty() || env::get("UCX_RNDV_THRESH").has_value();
  modify("RNDV_THRESH", thresh_given ? settings.rndv_thresh : std::to_string(kDefaultRndvThresh), "rndv_thresh");
  eager_limit_ = thresh_given ? 0 : kDefaultRndvThresh;  // below it UCX sends eager
  // Shared memory: a message that fits a FIFO element travels inside it
  // (UCX's "short" send); a longer one goes through a receive buffer of the
  // peer's pool, and one that arrives before its receive is posted keeps
  // that buffer, the FIFO element taking a fresh one. Every buffer the pool
  // grows by is a new shared page that both sides fault in, which made
  // 16 KiB gathers and reduces slower than Gloo. Elements that hold a 4-ranks
  // exchange message (16 KiB) and its headers keep those in the FIFO's ring;
  // 16 of them (260 KiB) are touched once and reused (docs/DESIGN.md, "UCX:
  // credit and 16 KiB FIFO elements").
  for (const auto& f : fifo_settings()) {
    if (!f.from_user && ucp_config_modify(config, f.key.c_str(), f.value.c_str()) != UCS_OK && log_) {
      log_(0, ("ucx: UCX does not take " + f.key + "; its FIFO keeps UCX's shape").c_str());
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.estimated_num_eps = static_cast<size_t>(size);
  params.mt_workers_shared = 0;
  const ucs_status_t s = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  check(s, "ucp_init");
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // one op at a time; abort only signals
  check(ucp_worker_create(context_, &wp, &worker_), "ucp_worker_create");
  if (ucp_worker_get_efd(worker_, &efd_) != UCS_OK) efd_ = -1;  // then waits back off instead
  eps_.assign(static_cast<size_t>(size), nullptr);
  slots_.resize(static_cast<size_t>(size));
  credit_.resize(static_cast<size_t>(size));
}

UcxTransport::~UcxTransport() {
  flush(Clock::now() + std::chrono::seconds(2));
  for (auto& f : in_flight_) {
    if (f.req) ucp_request_free(f.req);  // the copy is freed with f; UCX drops the request
  }
  in_flight_.clear();
  for (auto& c : credit_) {
    if (c.take_req) ucp_request_free(c.take_req);
  }
  credit_.clear();
  if (worker_) ucp_worker_destroy(worker_);
  if (context_) ucp_cleanup(context_);
}

void UcxTransport::connect(Store& store, std::chrono::milliseconds timeout) {
  ucp_address_t* address = nullptr;
  size_t length = 0;
  check(ucp_worker_get_address(worker_, &address, &length), "ucp_worker_get_address");
  // "<host identity>\n<pid>\n<worker address>"
  const std::string me = host_identity();
  store.set("ucx/addr/" + std::to_string(rank_), me + "\n" + std::to_string(::getpid()) + "\n" +
                                                     std::string(reinterpret_cast<const char*>(address), length));
  ucp_worker_release_address(worker_, address);
  std::vector<std::string> identities(static_cast<size_t>(size_));
  identities[static_cast<size_t>(rank_)] = me;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const std::string value = store.get("ucx/addr/" + std::to_string(p), timeout);
    const size_t a = value.find('\n'), b = a == std::string::npos ? a : value.find('\n', a + 1);
    if (b == std::string::npos) throw std::runtime_error("rank " + std::to_string(p) + " published a malformed UCX address");
    identities[static_cast<size_t>(p)] = value.substr(0, a);
    const bool same_host = value.compare(0, a, me) == 0;
    pids_[static_cast<size_t>(p)] = same_host ? std::stoi(value.substr(a + 1, b - a - 1)) : 0;
    slots_[static_cast<size_t>(p)] = {this, p};
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(value.data() + b + 1);
    // UCX 1.13's shared-memory transports cannot report a peer's failure,
    // and peer error mode would leave only TCP: on this host the transport
    // watches the peer's process itself (peer_alive), across hosts UCX does.
    ep.err_mode = same_host ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &UcxTransport::on_peer_error;
    ep.err_handler.arg = &slots_[static_cast<size_t>(p)];
    check(ucp_ep_create(worker_, &ep, &eps_[static_cast<size_t>(p)]), "ucp_ep_create");
  }
  hosts_.assign(static_cast<size_t>(size_), 0);
  for (size_t p = 0; p < identities.size(); ++p) {
    hosts_[p] = static_cast<int>(std::find(identities.begin(), identities.end(), identities[p]) - identities.begin());
  }
  handshake(Clock::now() + timeout);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || pids_[static_cast<size_t>(p)] <= 0) continue;
    const std::string lanes = capture([&](FILE* f) { ucp_ep_print_info(eps_[static_cast<size_t>(p)], f); });
    direct_[static_cast<size_t>(p)] = lanes.find("cma/") != std::string::npos;
  }
}

// A token to and from every peer, then a flush: the endpoints finish their
// wireup (UCX moves from the bootstrap lane to shared memory or the fastest
// transport) here rather than inside the first op, and describe() shows the
// lanes ops use.
bool UcxTransport::all_peers_local() const {
  for (int p = 0; p < size_; ++p) {
    if (p != rank_ && pids_[static_cast<size_t>(p)] <= 0) return false;
  }
  return true;
}

void UcxTransport::handshake(Clock::time_point deadline) {
  uint8_t out = 1;
  std::vector<uint8_t> in(static_cast<size_t>(size_), 0);
  std::vector<P2P> ops;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    ops.push_back({true, p, kHandshakeTag, &out, 1});
    ops.push_back({false, p, kHandshakeTag, &in[static_cast<size_t>(p)], 1});
  }
  point_to_point(ops, deadline);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    ucp_request_param_t param{};
    void* req = ucp_ep_flush_nbx(eps_[static_cast<size_t>(p)], &param);
    if (UCS_PTR_IS_ERR(req)) fail(Kind::kPeerFailure, p, "flushing the endpoint to rank " + std::to_string(p) +
                                                              ": " + status_text(UCS_PTR_STATUS(req)));
    wait(req, p, deadline, "flush");
  }
}

void UcxTransport::on_peer_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* slot = static_cast<PeerSlot*>(arg);
  slot->self->peer_status_[static_cast<size_t>(slot->rank)] = status == UCS_OK ? UCS_ERR_CONNECTION_RESET : status;
  if (slot->self->log_) {
    const std::string m = "ucx: endpoint to rank " + std::to_string(slot->rank) + " failed: " + status_text(status);
    slot->self->log_(2, m.c_str());
  }
}

std::string UcxTransport::peer_error(int peer) const {
  if (dead_pid_[static_cast<size_t>(peer)]) {
    return "rank " + std::to_string(peer) + " (pid " + std::to_string(pids_[static_cast<size_t>(peer)]) +
           " on this host) has exited";
  }
  const int s = peer_status_[static_cast<size_t>(peer)].load();
  return "the UCX endpoint to rank " + std::to_string(peer) + " failed (" +
         status_text(static_cast<ucs_status_t>(s)) + ")";
}

void UcxTransport::fail(Kind kind, int peer, const std::string& what) const { throw TransportError(kind, peer, what); }

void* UcxTransport::post_send(int peer, uint64_t tag, const void* data, size_t len) {
  ucp_request_param_t param{};
  ucs_status_ptr_t r = ucp_tag_send_nbx(eps_[static_cast<size_t>(peer)], data, len, tag, &param);
  if (UCS_PTR_IS_ERR(r)) fail(Kind::kPeerFailure, peer, "sending to rank " + std::to_string(peer) + ": " +
                                                            status_text(UCS_PTR_STATUS(r)));
  return r;
}

void* UcxTransport::post_recv(int peer, uint64_t tag, void* data, size_t len) {
  ucp_request_param_t param{};
  ucs_status_ptr_t r = ucp_tag_recv_nbx(worker_, data, len, tag, kFullMask, &param);
  if (UCS_PTR_IS_ERR(r)) fail(Kind::kPeerFailure, peer, "receiving from rank " + std::to_string(peer) + ": " +
                                                            status_text(UCS_PTR_STATUS(r)));
  return r;
}

void UcxTransport::reap() {
  for (auto& f : in_flight_) {
    if (!f.req) continue;
    const ucs_status_t s = ucp_request_check_status(f.req);
    if (s == UCS_INPROGRESS) continue;
    ucp_request_free(f.req);
    f.req = nullptr;
    if (s != UCS_OK && peer_status_[static_cast<size_t>(f.peer)] == 0) peer_status_[static_cast<size_t>(f.peer)] = s;
  }
}

bool UcxTransport::has_in_flight() const {
  return std::any_of(in_flight_.begin(), in_flight_.end(), [](const InFlight& f) { return f.req; });
}

bool UcxTransport::progress_in_flight() {
  if (!has_in_flight()) return false;
  ucp_worker_progress(worker_);
  reap();
  return has_in_flight();
}

void UcxTransport::send_buffered(int peer, uint64_t tag, const void* data, size_t len, Clock::time_point deadline,
                                 bool peer_may_be_gone) {
  if (peer_status_[static_cast<size_t>(peer)]) fail(Kind::kPeerFailure, peer, peer_error(peer));
  // Done at once (eager, resources free): no copy.
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL;
  ucs_status_ptr_t r = ucp_tag_send_nbx(eps_[static_cast<size_t>(peer)], data, len, tag, &param);
  if (r == nullptr) return;
  if (UCS_PTR_IS_ERR(r) && UCS_PTR_STATUS(r) != UCS_ERR_NO_RESOURCE) {
    fail(Kind::kPeerFailure, peer, "sending to rank " + std::to_string(peer) + ": " + status_text(UCS_PTR_STATUS(r)));
  }
  if (!UCS_PTR_IS_ERR(r)) {  // a request despite the flag: wait is not allowed to block on the peer
    ucp_request_free(r);
    fail(Kind::kPeerFailure, peer, "UCX returned a pending request for an immediate send");
  }
  if (len < eager_limit_ && !peer_may_be_gone) {
    // Eager: finishing needs only the peer's progress, which every wait
    // makes, never its receive; so waiting here cannot deadlock while the
    // peer still waits for this op's messages, and the copy is not needed.
    void* req = post_send(peer, tag, data, len);
    return wait(req, peer, deadline, "send");
  }
  reap();
  limit_in_flight(peer, deadline);
  auto it = std::find_if(in_flight_.begin(), in_flight_.end(), [](const InFlight& f) { return !f.req; });
  if (it == in_flight_.end()) it = in_flight_.insert(in_flight_.end(), InFlight{});
  it->copy.assign(static_cast<const unsigned char*>(data), static_cast<const unsigned char*>(data) + len);
  it->peer = peer;
  it->order = ++posted_;
  it->req = post_send(peer, tag, it->copy.data(), len);
}

// Eager messages a peer has not asked for yet wait in its memory (UCX keeps
// each in a shared-memory receive buffer and takes a fresh one): a rank that
// only sends to a peer, like a gather's non-root, ran thousands of ops ahead
// of a root that was waiting for another rank, and a long run grew the root
// by gigabytes, each message on a new page. So a receiver grants its sender
// a credit (a one-byte message) for every kCreditMessages collective
// messages it has received, and a sender waits for credit before it has
// more than 2 x kCreditMessages unreceived. A grant is one short eager
// message per kCreditMessages; its sender does not wait for it to be taken.
void UcxTransport::post_credit_receive(int peer) {
  Credit& c = credit_[static_cast<size_t>(peer)];
  for (;;) {
    c.take_req = post_recv(peer, make_tag(kCreditClass, peer, c.take_seq++), &c.take_buf, 1);
    if (c.take_req) return;
    c.granted += kCreditMessages;  // the grant had arrived
  }
}

void UcxTransport::take_credit(int peer, Clock::time_point deadline) {
  Credit& c = credit_[static_cast<size_t>(peer)];
  ++c.sent;
  if (!c.take_req) post_credit_receive(peer);
  // Every grant that has arrived, then, while over the window, the next.
  while (ucp_request_check_status(c.take_req) != UCS_INPROGRESS || c.sent > c.granted + 2 * kCreditMessages) {
    wait(c.take_req, peer, deadline, "send");
    c.granted += kCreditMessages;
    post_credit_receive(peer);
  }
}

void UcxTransport::grant_credit(int peer, Clock::time_point deadline) {
  Credit& c = credit_[static_cast<size_t>(peer)];
  if (++c.received % kCreditMessages != 0) return;
  static const uint8_t kGrant = 1;
  // The peer may have finished the op and be waiting outside UCX (a commit
  // vote on the store) for this rank: waiting for its progress (its
  // shared-memory FIFO full: 15 senders, 16 elements) held 16-rank UCX jobs
  // for the whole op timeout. Left in flight, later waits send it.
  send_buffered(peer, make_tag(kCreditClass, rank_, c.grant_seq++), &kGrant, 1, deadline, true);
}

// A send UCX could not finish at once (rendezvous, a full shared-memory
// FIFO) needs this rank's progress to go on; with many queued, a sleeping
// rank stalls them all. The algorithms never need more than two unread
// messages per link, so waiting for the oldest beyond kMaxInFlightPerPeer
// cannot deadlock.
void UcxTransport::limit_in_flight(int peer, Clock::time_point deadline) {
  for (;;) {
    InFlight* oldest = nullptr;
    int count = 0;
    for (auto& f : in_flight_) {
      if (!f.req || f.peer != peer) continue;
      ++count;
      if (!oldest || f.order < oldest->order) oldest = &f;
    }
    if (count < kMaxInFlightPerPeer) return;
    wait(oldest->req, peer, deadline, "send");
  }
}

void UcxTransport::send(int peer, Channel ch, Region src, size_t offset, size_t len, size_t, Clock::time_point deadline) {
  take_credit(peer, deadline);
  const uint32_t seq = send_seq_[static_cast<size_t>(peer)][static_cast<size_t>(ch)]++;
  send_buffered(peer, make_tag(static_cast<uint64_t>(ch), rank_, seq),
                static_cast<const unsigned char*>(src.base) + offset, len, deadline);
}

void UcxTransport::send_stable(int peer, Channel ch, Region src, size_t offset, size_t len, size_t,
                               Clock::time_point deadline) {
  if (peer_status_[static_cast<size_t>(peer)]) fail(Kind::kPeerFailure, peer, peer_error(peer));
  // As limit_in_flight: at most kMaxInFlightPerPeer unfinished, oldest
  // (first posted) waited for first. Finished entries are dropped so the
  // list stays short however many pieces the op sends.
  std::erase_if(in_place_, [](const auto& e) { return e.first == nullptr; });
  for (;;) {
    int count = 0;
    void** oldest = nullptr;
    for (auto& [req, p] : in_place_) {
      if (!req || p != peer) continue;
      if (!oldest) oldest = &req;
      ++count;
    }
    if (count < kMaxInFlightPerPeer) break;
    wait(*oldest, peer, deadline, "send");
  }
  take_credit(peer, deadline);
  const uint32_t seq = send_seq_[static_cast<size_t>(peer)][static_cast<size_t>(ch)]++;
  void* req = post_send(peer, make_tag(static_cast<uint64_t>(ch), rank_, seq),
                        static_cast<const unsigned char*>(src.base) + offset, len);
  if (req) in_place_.emplace_back(req, peer);
}

void UcxTransport::wait_sends(Clock::time_point deadline) {
  for (auto& [req, peer] : in_place_) wait(req, peer, deadline, "send");
  in_place_.clear();
}

std::string UcxTransport::direct_text() const {
  std::string some;
  int n = 0;
  for (int p = 0; p < size_; ++p) {
    if (!direct_[static_cast<size_t>(p)]) continue;
    some += (n++ ? "," : "") + std::to_string(p);
  }
  if (size_ > 1 && n == size_ - 1) return "every peer (cross-memory attach)";
  return n ? "ranks " + some + " (cross-memory attach)" : "none";
}

void UcxTransport::write_direct(int peer, const void* local, uint64_t remote, size_t len, Clock::time_point deadline) {
  copy_direct(true, peer, const_cast<void*>(local), remote, len, deadline);
}

void UcxTransport::read_direct(int peer, void* local, uint64_t remote, size_t len, Clock::time_point deadline) {
  copy_direct(false, peer, local, remote, len, deadline);
}

void UcxTransport::copy_direct(bool write, int peer, void* local, uint64_t remote, size_t len,
                               Clock::time_point deadline) {
  const size_t p = static_cast<size_t>(peer);
  if (!direct_[p]) fail(Kind::kPeerFailure, peer, "no direct copies with rank " + std::to_string(peer));
  for (size_t done = 0; done < len;) {
    if (peer_status_[p]) fail(Kind::kPeerFailure, peer, peer_error(peer));
    if (aborted_) fail(Kind::kAborted, peer, write ? "send aborted" : "receive aborted");
    if (Clock::now() >= deadline) {
      fail(Kind::kTimeout, peer, std::string(write ? "send" : "receive") + " with rank " + std::to_string(peer) +
                                     " timed out");
    }
    const size_t n = std::min(kDirectChunkBytes, len - done);
    iovec here{static_cast<unsigned char*>(local) + done, n};
    iovec there{reinterpret_cast<void*>(static_cast<uintptr_t>(remote + done)), n};
    const ssize_t moved = write ? process_vm_writev(pids_[p], &here, 1, &there, 1, 0)
                                : process_vm_readv(pids_[p], &here, 1, &there, 1, 0);
    if (moved > 0) {
      done += static_cast<size_t>(moved);
      continue;
    }
    const int e = moved == 0 ? EFAULT : errno;
    if (e == EINTR) continue;
    if (e == ESRCH || !process_alive(pids_[p])) {
      dead_pid_[p] = true;
      peer_status_[p] = UCS_ERR_CONNECTION_RESET;
      fail(Kind::kPeerFailure, peer, peer_error(peer));
    }
    fail(Kind::kPeerFailure, peer, std::string(write ? "writing to" : "reading from") + " rank " +
                                       std::to_string(peer) + "'s memory (cross-memory attach): " + std::strerror(e));
  }
}

void UcxTransport::op_done() {
  for (auto& [req, peer] : in_place_) cancel(req);
  in_place_.clear();
}

void UcxTransport::recv(int peer, Channel ch, Region dst, size_t dst_offset, size_t len, Clock::time_point deadline) {
  const uint32_t seq = recv_seq_[static_cast<size_t>(peer)][static_cast<size_t>(ch)]++;
  void* req = post_recv(peer, make_tag(static_cast<uint64_t>(ch), peer, seq),
                        static_cast<unsigned char*>(dst.base) + dst_offset, len);
  wait(req, peer, deadline, "receive");
  grant_credit(peer, deadline);
}

void UcxTransport::point_to_point(const std::vector<P2P>& ops, Clock::time_point deadline) {
  if (ops.size() == 1 && ops[0].send) {
    return send_buffered(ops[0].peer, make_tag(kP2PClass, rank_, ops[0].tag), ops[0].data, ops[0].bytes, deadline);
  }
  std::vector<void*> reqs(ops.size(), nullptr);
  try {
    for (size_t i = 0; i < ops.size(); ++i) {
      const auto& o = ops[i];
      reqs[i] = o.send ? post_send(o.peer, make_tag(kP2PClass, rank_, o.tag), o.data, o.bytes)
                       : post_recv(o.peer, make_tag(kP2PClass, o.peer, o.tag), o.data, o.bytes);
    }
    for (size_t i = 0; i < ops.size(); ++i) wait(reqs[i], ops[i].peer, deadline, ops[i].send ? "send" : "receive");
  } catch (...) {
    for (auto& r : reqs) cancel(r);
    throw;
  }
}

void UcxTransport::cancel(void*& req) {
  if (!req) return;
  ucp_request_cancel(worker_, req);
  // Receives cancel at once; a send UCX cannot cancel is let go after a
  // short wait (the comm is failing: its peers get no more of it).
  const auto until = Clock::now() + std::chrono::milliseconds(100);
  while (ucp_request_check_status(req) == UCS_INPROGRESS && Clock::now() < until) ucp_worker_progress(worker_);
  ucp_request_free(req);
  req = nullptr;
}

void WaitPolicy::progress_or_sleep(ucp_worker_h worker, int efd, Clock::time_point deadline, const Phases& phases,
                                   int min_sleep_ms, int max_sleep_ms) const {
  if (ucp_worker_progress(worker)) return;
  const auto now = Clock::now();
  if (spin_forever_.load(std::memory_order_relaxed) || now < phases.spin_until) {
    // Past the first microseconds, hand the core to whichever task can run
    // (likely the peer this wait needs) instead of burning the time slice.
    if (yield_.load(std::memory_order_relaxed) && now >= phases.yield_from) sched_yield();
    return;
  }
  if (efd < 0) {
    sched_yield();
    return;
  }
  if (ucp_worker_arm(worker) == UCS_ERR_BUSY) return;  // events are waiting: progress again
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
  pollfd p{efd, POLLIN, 0};
  ::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(left, min_sleep_ms, max_sleep_ms)));
}

void UcxTransport::wait(void*& req, int peer, Clock::time_point deadline, const char* what) {
  if (!req) return;  // done at once
  const WaitPolicy::Phases phases = wait_policy_.start();
  for (;;) {
    const ucs_status_t s = ucp_request_check_status(req);
    if (s != UCS_INPROGRESS) {
      ucp_request_free(req);
      req = nullptr;
      if (s == UCS_OK) return;
      if (s == UCS_ERR_MESSAGE_TRUNCATED) {
        fail(Kind::kPeerFailure, peer, std::string(what) + " from rank " + std::to_string(peer) +
                                           ": the message is longer than the buffer (the ranks disagree on the op)");
      }
      fail(Kind::kPeerFailure, peer, std::string(what) + " with rank " + std::to_string(peer) + ": " + status_text(s));
    }
    if (aborted_) {
      cancel(req);
      fail(Kind::kAborted, peer, std::string(what) + " aborted");
    }
    if (peer >= 0) check_peer_alive(peer);
    if (peer >= 0 && peer_status_[static_cast<size_t>(peer)]) {
      // What it sent before it exited may still be in this worker's queue.
      ucp_worker_progress(worker_);
      if (ucp_request_check_status(req) == UCS_OK) {
        ucp_request_free(req);
        req = nullptr;
        return;
      }
      cancel(req);
      fail(Kind::kPeerFailure, peer, peer_error(peer));
    }
    if (Clock::now() >= deadline) {
      cancel(req);
      fail(Kind::kTimeout, peer, std::string(what) + " with rank " + std::to_string(peer) + " timed out");
    }
    // A missed wake-up costs at most the 10 ms bound.
    wait_policy_.progress_or_sleep(worker_, efd_, deadline, phases, 1, 10);
  }
}

void UcxTransport::abort() {
  aborted_ = true;
  if (worker_) ucp_worker_signal(worker_);
}

bool UcxTransport::flush(Clock::time_point deadline) {
  if (!worker_) return true;
  bool done = false;
  while (!(done = std::none_of(in_flight_.begin(), in_flight_.end(), [](const InFlight& f) { return f.req; })) &&
         Clock::now() < deadline && !aborted_) {
    ucp_worker_progress(worker_);
    reap();
  }
  for (auto& c : credit_) cancel(c.take_req);
  // Close every endpoint: gracefully when the peer is fine, else forced.
  std::vector<void*> closing;
  for (size_t p = 0; p < eps_.size(); ++p) {
    if (!eps_[p]) continue;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = (peer_status_[p] || !done || aborted_) ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    ucs_status_ptr_t r = ucp_ep_close_nbx(eps_[p], &param);
    if (r && !UCS_PTR_IS_ERR(r)) closing.push_back(r);
    eps_[p] = nullptr;
  }
  const auto until = std::min(deadline, Clock::now() + std::chrono::seconds(1));
  for (void* r : closing) {
    while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < until) ucp_worker_progress(worker_);
    ucp_request_free(r);
  }
  return done;
}

std::string UcxTransport::devices() const {
  // "# resource 0 : md 0 dev 0 flags -- posix/memory"
  static const std::regex re(R"(--\s+([\w.-]+/[\w:.-]+))");
  return transport_pairs(capture([&](FILE* f) { ucp_context_print_info(context_, f); }), re);
}

std::string UcxTransport::transports() const {
  // ucp_ep_print_info's lanes: "lane[0]:  1:posix/memory.0 md[1] ..."
  for (size_t p = 0; p < eps_.size(); ++p) {
    if (!eps_[p]) continue;
    static const std::regex re(R"(\d+:([\w.-]+/[\w:.-]+?)(?:\.\d+)?\s)");
    return transport_pairs(capture([&](FILE* f) { ucp_ep_print_info(eps_[p], f); }), re);
  }
  return "self";
}

}  // namespace comms::ucx_backend
