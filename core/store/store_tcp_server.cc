// The TCP store's server: one io_context thread serving every connection.
//
// It must keep serving its job whatever other clients do, so nothing a
// client sends sizes an allocation or holds a resource for long:
// - a connection first completes the handshake (store_wire.h) within
//   handshake_timeout, with frames of at most kHandshakeMaxFrameBytes; no
//   request is served before it, and a wrong or missing token is refused;
// - a frame's body grows as its bytes arrive, and a frame once started must
//   be complete within frame_timeout (a reply must be taken as soon);
// - a read stays armed on every connection, also while its get/wait is
//   parked, so a client that goes away releases its connection at once;
// - connections per client address are bounded, and those still in their
//   handshake more tightly (a new one evicts the oldest);
// - out of descriptors, the server first evicts the oldest connection still
//   in its handshake, else accepts and closes the new one with a descriptor
//   kept in reserve, so it neither spins on accept nor leaves clients hanging
//   in the backlog.
// Only this thread touches sessions and values, apart from key_count() and
// connection_count(), which read under a mutex or an atomic.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "asio.hpp"
#include "comms/error.h"
#include "comms/store.h"
#include "util/log.h"
#include "store_auth.h"
#include "store_net.h"
#include "store_semantics.h"
#include "store_wire.h"
#include "util/strutil.h"

namespace comms {
namespace {

using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using store_net::endpoint_text;
using store_net::host_port;
using store_semantics::quoted_keys;

// The first read of a frame's body; later reads at most double what arrived.
constexpr size_t kFirstBodyChunk = 64 * 1024;
// At most this many connections are accepted per wake-up before other work.
constexpr int kAcceptBurst = 64;

std::string ms_text(std::chrono::milliseconds d) { return str::cat(d.count(), " ms"); }

}  // namespace

class TcpStoreServer::Impl {
 public:
  Impl(const std::string& host, uint16_t port, TcpStoreServerOptions options)
      : host_(host),
        options_(std::move(options)),
        token_(options_.token ? *options_.token : store_auth::token_from_environment()),
        acceptor_(io_),
        accept_retry_(io_) {
    bind(host, port);
    reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    start_accept();
    thread_ = std::thread([this] { run(); });
  }

  ~Impl() {
    io_.stop();
    if (thread_.joinable()) thread_.join();
    // Waiters reference sessions only weakly; sessions die with the pending
    // handlers that hold them when io_ (declared first) goes last.
    waiters_.clear();
    if (reserve_fd_ >= 0) ::close(reserve_fd_);
  }

  uint16_t port() const { return port_; }
  const std::string& host() const { return host_; }
  size_t key_count() const {
    std::lock_guard<std::mutex> lock(values_mu_);
    return values_.size();
  }
  size_t connection_count() const { return connections_.load(); }
  bool requires_token() const { return !token_.empty(); }

 private:
  class Session;
  struct Waiter;
  struct Peer {
    size_t connections = 0;
    std::list<std::weak_ptr<Session>> handshaking;  // oldest first
  };

  void bind(const std::string& host, uint16_t port);
  void run() {
    // Handlers do not throw (they catch and log), but an escaping exception
    // must not end the server silently.
    while (!io_.stopped()) {
      try {
        io_.run();
      } catch (const std::exception& e) {
        log::error(str::cat("TCP store server ", address_text_, ": unexpected error: ", e.what()));
      }
    }
  }

  void start_accept();
  void accept_ready();
  bool out_of_descriptors(int error);
  void admit(int fd);
  bool evict_oldest_handshake(Peer* only, const std::string& why);
  void handshake_done(Session& session);
  void session_closed(Session& session);
  void log_limited(log::Level level, const std::string& message);

  void handle(const std::shared_ptr<Session>& session, wire::Request request);
  void notify(const std::string& key);
  void complete_waiter(const std::shared_ptr<Waiter>& waiter, wire::Response response);
  void drop_waiter(const std::shared_ptr<Waiter>& waiter);
  void unregister_waiter(const std::shared_ptr<Waiter>& waiter);
  bool all_present_locked(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return values_.contains(k); });
  }

  // Declared first so that it is destroyed last: sockets and timers need it.
  asio::io_context io_;
  std::string host_;
  std::string address_text_;
  uint16_t port_ = 0;
  const TcpStoreServerOptions options_;
  const std::string token_;
  tcp::acceptor acceptor_;
  asio::steady_timer accept_retry_;
  int reserve_fd_ = -1;
  std::thread thread_;

  std::unordered_map<std::string, Peer> peers_;  // by client address
  std::atomic<size_t> connections_{0};
  // Rate limit of the lines logged about refused or dropped clients, so that
  // a flood of them cannot flood the job's output.
  Clock::time_point log_window_start_{};
  int logged_in_window_ = 0;
  int suppressed_ = 0;

  // Only the io thread writes the values; the mutex is for key_count().
  mutable std::mutex values_mu_;
  std::unordered_map<std::string, std::string> values_;
  // Blocked get/wait requests, listed under each key they still miss.
  std::unordered_map<std::string, std::vector<std::shared_ptr<Waiter>>> waiters_;
};

struct TcpStoreServer::Impl::Waiter {
  Waiter(asio::io_context& io, std::weak_ptr<Session> s, wire::Request r)
      : session(std::move(s)), request(std::move(r)), timer(io) {}
  std::weak_ptr<Session> session;  // gone when the client went away
  wire::Request request;
  asio::steady_timer timer;
  bool done = false;
};

// ---------------------------------------------------------------------------
// One client connection.

class TcpStoreServer::Impl::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Impl& server, tcp::socket socket, std::string address)
      : server_(server),
        socket_(std::move(socket)),
        address_(std::move(address)),
        accepted_at_(Clock::now()),
        read_deadline_(server.io_),
        write_deadline_(server.io_) {
    asio::error_code ec;
    auto remote = socket_.remote_endpoint(ec);
    peer_ = ec ? std::string("unknown peer") : endpoint_text(remote);
    socket_.set_option(tcp::no_delay(true), ec);
  }

  const std::string& address() const { return address_; }
  const std::string& peer() const { return peer_; }
  Clock::time_point accepted_at() const { return accepted_at_; }
  bool authenticated() const { return authenticated_; }
  std::list<std::weak_ptr<Session>>::iterator handshake_slot;

  void start() {
    nonce_ = store_auth::random_bytes(store_auth::kNonceBytes);
    send(wire::encode_hello({server_.requires_token(), nonce_}));
    arm(read_deadline_, read_generation_, server_.options_.handshake_timeout,
        "did not complete the handshake within ");
    read_more();
  }

  void park(const std::shared_ptr<Waiter>& waiter) { waiter_ = waiter; }

  void respond(const wire::Response& response) {
    waiter_.reset();
    send(wire::encode_response(response));
  }

  // Closes the connection; `why` is logged (rate limited) unless empty.
  void close(const std::string& why, log::Level level = log::Level::kWarning) {
    if (closed_) return;
    closed_ = true;
    if (!why.empty()) {
      server_.log_limited(level, str::cat("TCP store server ", server_.address_text_, ": closing the connection from ",
                                          peer_, ": ", why));
    }
    ++read_generation_;
    ++write_generation_;
    read_deadline_.cancel();
    write_deadline_.cancel();
    asio::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    if (auto waiter = waiter_.lock()) server_.drop_waiter(waiter);
    waiter_.reset();
    server_.session_closed(*this);
  }

 private:
  // Timers are re-armed often; a generation tells a stale expiry from a
  // live one (cancel() cannot recall a handler already queued).
  void arm(asio::steady_timer& timer, uint64_t& generation, std::chrono::milliseconds after,
           std::string what) {
    const uint64_t armed = ++generation;
    timer.expires_after(after);
    timer.async_wait([self = shared_from_this(), &generation, armed, what = std::move(what), after](
                         const asio::error_code& ec) {
      if (ec || self->closed_ || generation != armed) return;
      self->close(str::cat(what, ms_text(after)));
    });
  }

  void disarm(asio::steady_timer& timer, uint64_t& generation) {
    ++generation;
    timer.cancel();
  }

  size_t frame_limit() const {
    return authenticated_ ? server_.options_.max_frame_bytes : wire::kHandshakeMaxFrameBytes;
  }

  void read_more() {
    if (closed_ || reading_ || held_frame_ || refusing_) return;
    asio::mutable_buffer buffer;
    if (body_length_ == 0) {
      buffer = asio::buffer(header_.data() + header_have_, header_.size() - header_have_);
    } else {
      if (body_have_ == body_.size()) {
        // Grow with what actually arrived, never to the announced length at once.
        size_t grown = std::max(kFirstBodyChunk, body_have_ * 2);
        body_.resize(std::min<size_t>(body_length_, grown));
      }
      buffer = asio::buffer(body_.data() + body_have_, body_.size() - body_have_);
    }
    reading_ = true;
    socket_.async_read_some(buffer, [self = shared_from_this()](const asio::error_code& ec, size_t n) {
      self->reading_ = false;
      self->on_read(ec, n);
    });
  }

  void on_read(const asio::error_code& ec, size_t n) {
    if (closed_) return;
    if (ec) {
      // The client went away (also while its get/wait was parked).
      close(ec == asio::error::eof ? std::string() : str::cat("connection ended: ", ec.message()),
            log::Level::kDebug);
      return;
    }
    if (authenticated_ && body_length_ == 0 && header_have_ == 0 && n > 0) {
      arm(read_deadline_, read_generation_, server_.options_.frame_timeout, "a frame was not complete within ");
    }
    if (body_length_ == 0) {
      header_have_ += n;
      if (header_have_ < header_.size()) return read_more();
      std::string error;
      auto length = wire::decode_frame_length(std::string_view(header_.data(), header_.size()), frame_limit(), &error);
      if (!length) {
        return close(authenticated_ ? error : str::cat(error, " before authenticating (not a comms store client?)"));
      }
      body_length_ = *length;
      body_have_ = 0;
      return read_more();
    }
    body_have_ += n;
    if (body_have_ < body_length_) return read_more();
    std::string frame = std::move(body_);
    body_ = std::string();
    header_have_ = 0;
    body_length_ = 0;
    body_have_ = 0;
    if (!authenticated_) return on_auth(frame);
    disarm(read_deadline_, read_generation_);
    if (busy_) {
      // The next request came before this one's reply was written: keep it
      // (and read no further) until then.
      held_frame_ = std::move(frame);
      return;
    }
    dispatch(frame);
  }

  void dispatch(const std::string& frame) {
    std::string error;
    auto request = wire::decode_request(frame, &error);
    if (!request) return close(error);
    busy_ = true;
    server_.handle(shared_from_this(), std::move(*request));
    read_more();  // armed while parked too: that is how a disconnect is noticed
  }

  void on_auth(const std::string& frame) {
    try {
      check_auth(frame);
    } catch (const std::exception& e) {  // libcrypto failed: not the client's fault, but no way on
      close(str::cat("cannot check its handshake: ", e.what()), log::Level::kError);
    }
  }

  void check_auth(const std::string& frame) {
    std::string error;
    auto auth = wire::decode_auth(frame, &error);
    if (!auth) return refuse(str::cat("malformed handshake: ", error));
    const std::string& token = server_.token_;
    std::string proof;
    if (!token.empty()) {
      if (auth->proof.empty()) {
        return refuse("authentication failed (this client has no token: set COMMS_STORE_TOKEN or "
                      "COMMS_STORE_TOKEN_FILE to the job's token)");
      }
      if (auth->nonce.size() != store_auth::kNonceBytes ||
          !store_auth::proofs_equal(auth->proof, store_auth::client_proof(token, nonce_, auth->nonce))) {
        return refuse("authentication failed (COMMS_STORE_TOKEN differs)");
      }
      proof = store_auth::server_proof(token, nonce_, auth->nonce);
    }
    authenticated_ = true;
    disarm(read_deadline_, read_generation_);
    server_.handshake_done(*this);
    send(wire::encode_response({wire::Status::kOk, proof, 0}));
    read_more();
  }

  // Tells the client why, then closes; nothing it sends is read any more.
  void refuse(const std::string& reason) {
    server_.log_limited(log::Level::kWarning, str::cat("TCP store server ", server_.address_text_, ": refused ",
                                                       peer_, ": ", reason));
    refusing_ = true;
    close_after_write_ = true;
    send(wire::encode_response({wire::Status::kError, reason, 0}));
  }

  void send(std::string frame) {
    if (closed_) return;
    outbox_.push_back(std::move(frame));
    if (!writing_) write_next();
  }

  void write_next() {
    writing_ = true;
    arm(write_deadline_, write_generation_, server_.options_.frame_timeout, "the client did not take its reply within ");
    asio::async_write(socket_, asio::buffer(outbox_.front()),
                      [self = shared_from_this()](const asio::error_code& ec, size_t) { self->on_written(ec); });
  }

  void on_written(const asio::error_code& ec) {
    writing_ = false;
    if (closed_) return;
    disarm(write_deadline_, write_generation_);
    if (ec) return close(str::cat("sending failed: ", ec.message()), log::Level::kDebug);
    outbox_.pop_front();
    if (!outbox_.empty()) return write_next();
    if (close_after_write_) return close("");
    // The hello or the handshake's answer went out, perhaps while the first
    // request is parked: that one is not answered yet.
    if (!authenticated_ || !waiter_.expired()) return;
    busy_ = false;  // the reply to the last request is out
    if (held_frame_) {
      std::string frame = std::move(*held_frame_);
      held_frame_.reset();
      dispatch(frame);
    }
    read_more();
  }

  Impl& server_;
  tcp::socket socket_;
  std::string address_;
  std::string peer_;
  Clock::time_point accepted_at_;
  std::string nonce_;
  bool authenticated_ = false;
  bool refusing_ = false;
  bool closed_ = false;

  // Reading: a header, then a body that grows as it arrives.
  bool reading_ = false;
  std::array<char, wire::kFrameHeaderBytes> header_{};
  size_t header_have_ = 0;
  uint32_t body_length_ = 0;  // 0 while the header is incomplete
  std::string body_;
  size_t body_have_ = 0;
  asio::steady_timer read_deadline_;  // handshake, then each partial frame
  uint64_t read_generation_ = 0;

  // A request is being served: parked, or its reply not yet written.
  bool busy_ = false;
  std::optional<std::string> held_frame_;
  std::weak_ptr<Waiter> waiter_;

  // Writing: replies in order, at most one write in flight.
  std::deque<std::string> outbox_;
  bool writing_ = false;
  bool close_after_write_ = false;
  asio::steady_timer write_deadline_;
  uint64_t write_generation_ = 0;
};

// ---------------------------------------------------------------------------
// Listening and accepting

void TcpStoreServer::Impl::bind(const std::string& host, uint16_t port) {
  asio::error_code ec;
  tcp::resolver resolver(io_);
  auto results = resolver.resolve(host, std::to_string(port),
                                  tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("TCP store server: cannot resolve '", host, "': ", ec.message()));
  }
  std::string last_error = "no address";
  for (const auto& entry : results) {
    asio::error_code bind_ec;
    acceptor_.close(bind_ec);
    store_net::open_cloexec(acceptor_, entry.endpoint().protocol(), bind_ec);
    if (!bind_ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), bind_ec);
    if (!bind_ec) acceptor_.bind(entry.endpoint(), bind_ec);
    if (!bind_ec) acceptor_.listen(asio::socket_base::max_listen_connections, bind_ec);
    if (!bind_ec) {
      port_ = acceptor_.local_endpoint().port();
      address_text_ = endpoint_text(acceptor_.local_endpoint());
      if (token_.empty() && !acceptor_.local_endpoint().address().is_loopback()) {
        log::warning(str::cat("TCP store server ", address_text_,
                              ": no token is set, so anyone who can reach this address can read and write the "
                              "job's keys; set COMMS_STORE_TOKEN (the same on every node)"));
      }
      return;
    }
    last_error = str::cat(endpoint_text(entry.endpoint()), ": ", bind_ec.message());
  }
  throw Error(ErrorCode::kInvalidArgument,
              str::cat("TCP store server: cannot listen on ", host_port(host, port), ": ", last_error));
}

void TcpStoreServer::Impl::start_accept() {
  acceptor_.async_wait(tcp::acceptor::wait_read, [this](const asio::error_code& ec) {
    if (ec == asio::error::operation_aborted) return;
    if (ec) {
      log_limited(log::Level::kError, str::cat("TCP store server ", address_text_, ": waiting for clients failed: ",
                                               ec.message()));
      accept_retry_.expires_after(std::chrono::milliseconds(100));
      accept_retry_.async_wait([this](const asio::error_code& wait_ec) {
        if (!wait_ec) start_accept();
      });
      return;
    }
    accept_ready();
  });
}

void TcpStoreServer::Impl::accept_ready() {
  if (reserve_fd_ < 0) reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  for (int i = 0; i < kAcceptBurst; ++i) {
    // accept4 rather than Asio's accept: the descriptor must be close-on-exec
    // from the start (commsrun forks ranks while this thread accepts).
    int fd = ::accept4(acceptor_.native_handle(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      admit(fd);
      continue;
    }
    const int error = errno;
    if (error == EAGAIN || error == EWOULDBLOCK) break;
    if (error == EINTR || error == ECONNABORTED || error == EPROTO) continue;
    if (error == EMFILE || error == ENFILE || error == ENOBUFS || error == ENOMEM) {
      if (out_of_descriptors(error)) continue;
    } else {
      log_limited(log::Level::kError, str::cat("TCP store server ", address_text_, ": accept failed: ",
                                               std::strerror(error)));
    }
    // Nothing freed: try again shortly instead of spinning.
    accept_retry_.expires_after(std::chrono::milliseconds(100));
    accept_retry_.async_wait([this](const asio::error_code& wait_ec) {
      if (!wait_ec) start_accept();
    });
    return;
  }
  start_accept();
}

// Returns whether accepting can go on at once.
bool TcpStoreServer::Impl::out_of_descriptors(int error) {
  const std::string why = str::cat("out of file descriptors (", std::strerror(error), ", ",
                                   connections_.load(), " connections open)");
  if (evict_oldest_handshake(nullptr, why)) return true;
  if (reserve_fd_ < 0) return false;
  // Every connection is a working client: refuse the newcomer rather than
  // leave it waiting in the backlog, using the descriptor kept for this.
  ::close(reserve_fd_);
  int fd = ::accept4(acceptor_.native_handle(), nullptr, nullptr, SOCK_CLOEXEC);
  if (fd >= 0) ::close(fd);
  reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  log_limited(log::Level::kWarning, str::cat("TCP store server ", address_text_, ": refused a connection: ", why));
  return fd >= 0;
}

void TcpStoreServer::Impl::admit(int fd) {
  tcp::socket socket(io_);
  asio::error_code ec;
  socket.assign(acceptor_.local_endpoint(ec).protocol(), fd, ec);
  if (ec) {
    ::close(fd);
    return;
  }
  auto remote = socket.remote_endpoint(ec);
  if (ec) return;  // already gone; the socket closes itself
  const std::string address = remote.address().to_string();
  Peer& peer = peers_[address];
  if (peer.connections >= options_.max_connections_per_address) {
    log_limited(log::Level::kWarning,
                str::cat("TCP store server ", address_text_, ": refused a connection from ", endpoint_text(remote),
                         ": ", peer.connections, " connections from ", address,
                         " are open (the limit per address)"));
    if (peer.connections == 0) peers_.erase(address);
    return;
  }
  if (peer.handshaking.size() >= options_.max_handshakes_per_address) {
    // May close that address's last connection, and with it its entry.
    evict_oldest_handshake(&peer, str::cat(peer.handshaking.size(), " connections from ", address,
                                           " are in their handshake (the limit per address)"));
  }
  Peer& counted = peers_[address];
  auto session = std::make_shared<Session>(*this, std::move(socket), address);
  ++counted.connections;
  ++connections_;
  session->handshake_slot = counted.handshaking.insert(counted.handshaking.end(), session);
  try {
    session->start();
  } catch (const std::exception& e) {
    session->close(str::cat("cannot start its handshake: ", e.what()), log::Level::kError);
  }
}

// Closes the connection that has waited longest in its handshake (from one
// peer, or from any); false when there is none.
bool TcpStoreServer::Impl::evict_oldest_handshake(Peer* only, const std::string& why) {
  std::shared_ptr<Session> oldest;
  auto consider = [&](Peer& peer) {
    if (peer.handshaking.empty()) return;
    auto candidate = peer.handshaking.front().lock();
    if (candidate && (!oldest || candidate->accepted_at() < oldest->accepted_at())) oldest = candidate;
  };
  if (only) {
    consider(*only);
  } else {
    for (auto& [address, peer] : peers_) consider(peer);
  }
  if (!oldest) return false;
  oldest->close(str::cat("evicted before completing its handshake: ", why));
  return true;
}

void TcpStoreServer::Impl::handshake_done(Session& session) {
  peers_[session.address()].handshaking.erase(session.handshake_slot);
}

void TcpStoreServer::Impl::session_closed(Session& session) {
  auto it = peers_.find(session.address());
  if (it == peers_.end()) return;
  if (!session.authenticated()) it->second.handshaking.erase(session.handshake_slot);
  --connections_;
  if (--it->second.connections == 0) peers_.erase(it);
}

void TcpStoreServer::Impl::log_limited(log::Level level, const std::string& message) {
  constexpr auto kWindow = std::chrono::seconds(10);
  constexpr int kPerWindow = 10;
  const auto now = Clock::now();
  if (now - log_window_start_ >= kWindow) {
    if (suppressed_ > 0) {
      log::warning(str::cat("TCP store server ", address_text_, ": ", suppressed_,
                            " more messages about clients were suppressed in the last ", kWindow.count(), " s"));
    }
    log_window_start_ = now;
    logged_in_window_ = 0;
    suppressed_ = 0;
  }
  if (level != log::Level::kDebug && ++logged_in_window_ > kPerWindow) {
    ++suppressed_;
    return;
  }
  if (log::enabled(level)) log::write(level, message);
}

// ---------------------------------------------------------------------------
// Requests

void TcpStoreServer::Impl::handle(const std::shared_ptr<Session>& session, wire::Request request) {
  using wire::Op;
  wire::Response response;
  const std::string& key = request.keys.empty() ? std::string() : request.keys.front();
  std::unique_lock<std::mutex> lock(values_mu_);
  switch (request.op) {
    case Op::kSet:
      values_[key] = std::move(request.value);
      lock.unlock();
      notify(key);
      break;
    case Op::kGet:
    case Op::kWait: {
      if (all_present_locked(request.keys)) {
        if (request.op == Op::kGet) response.text = values_.at(key);
        break;
      }
      lock.unlock();
      auto waiter = std::make_shared<Waiter>(io_, session, std::move(request));
      for (const auto& k : waiter->request.keys) {
        if (!values_.contains(k)) waiters_[k].push_back(waiter);
      }
      session->park(waiter);
      // Clamped so that a huge timeout cannot overflow the timer's clock.
      auto timeout = std::chrono::milliseconds(
          std::min<uint64_t>(waiter->request.timeout_ms, uint64_t{10} * 365 * 24 * 3600 * 1000));
      waiter->timer.expires_after(timeout);
      waiter->timer.async_wait([this, waiter](const asio::error_code& ec) {
        if (ec || waiter->done) return;
        // Name the keys still missing: that is what a hung rendezvous needs.
        std::vector<std::string> missing;
        {
          std::lock_guard<std::mutex> lock(values_mu_);
          for (const auto& k : waiter->request.keys) {
            if (!values_.contains(k)) missing.push_back(k);
          }
        }
        complete_waiter(waiter, wire::Response{wire::Status::kTimeout, quoted_keys(missing), 0});
      });
      return;  // answered later
    }
    case Op::kAdd: {
      auto it = values_.find(key);
      std::optional<std::string> current;
      if (it != values_.end()) current = it->second;
      try {
        response.number = store_semantics::added_value(key, current, request.delta);
      } catch (const Error& e) {
        response = {wire::Status::kError, e.what(), 0};
        break;
      }
      values_[key] = std::to_string(response.number);
      lock.unlock();
      notify(key);
      break;
    }
    case Op::kCheck:
      response.number = all_present_locked(request.keys) ? 1 : 0;
      break;
    case Op::kDelete:
      response.number = values_.erase(key) > 0 ? 1 : 0;
      break;
    case Op::kCompareSet: {
      auto it = values_.find(key);
      std::optional<std::string> current;
      if (it != values_.end()) current = it->second;
      auto outcome = store_semantics::compare_set_outcome(current, request.value, request.desired);
      response.text = outcome.returned;
      if (outcome.swapped) {
        values_[key] = *outcome.stored;
        lock.unlock();
        notify(key);
      }
      break;
    }
  }
  session->respond(response);
}

void TcpStoreServer::Impl::notify(const std::string& key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  auto waiting = std::move(it->second);
  waiters_.erase(it);
  for (const auto& waiter : waiting) {
    if (waiter->done) continue;
    std::unique_lock<std::mutex> lock(values_mu_);
    auto missing = std::find_if(waiter->request.keys.begin(), waiter->request.keys.end(),
                                [&](const auto& k) { return !values_.contains(k); });
    if (missing != waiter->request.keys.end()) {
      // Still short of a key (perhaps one deleted since it was set): wait on it.
      waiters_[*missing].push_back(waiter);
      continue;
    }
    wire::Response response;
    if (waiter->request.op == wire::Op::kGet) response.text = values_.at(waiter->request.keys.front());
    lock.unlock();
    complete_waiter(waiter, std::move(response));
  }
}

void TcpStoreServer::Impl::complete_waiter(const std::shared_ptr<Waiter>& waiter, wire::Response response) {
  waiter->done = true;
  waiter->timer.cancel();
  unregister_waiter(waiter);
  if (auto session = waiter->session.lock()) session->respond(response);
}

// The client went away: forget its request.
void TcpStoreServer::Impl::drop_waiter(const std::shared_ptr<Waiter>& waiter) {
  if (waiter->done) return;
  waiter->done = true;
  waiter->timer.cancel();
  unregister_waiter(waiter);
}

void TcpStoreServer::Impl::unregister_waiter(const std::shared_ptr<Waiter>& waiter) {
  for (const auto& k : waiter->request.keys) {
    auto it = waiters_.find(k);
    if (it == waiters_.end()) continue;
    std::erase(it->second, waiter);
    if (it->second.empty()) waiters_.erase(it);
  }
}

namespace {
TcpStoreServerOptions with_max_frame_bytes(size_t max_frame_bytes) {
  TcpStoreServerOptions options;
  options.max_frame_bytes = max_frame_bytes;
  return options;
}
}  // namespace

TcpStoreServer::TcpStoreServer(const std::string& host, uint16_t port, size_t max_frame_bytes)
    : TcpStoreServer(host, port, with_max_frame_bytes(max_frame_bytes)) {}
TcpStoreServer::TcpStoreServer(const std::string& host, uint16_t port, const TcpStoreServerOptions& options)
    : impl_(std::make_unique<Impl>(host, port, options)) {}
TcpStoreServer::~TcpStoreServer() = default;
uint16_t TcpStoreServer::port() const { return impl_->port(); }
const std::string& TcpStoreServer::host() const { return impl_->host(); }
size_t TcpStoreServer::key_count() const { return impl_->key_count(); }
size_t TcpStoreServer::connection_count() const { return impl_->connection_count(); }
bool TcpStoreServer::requires_token() const { return impl_->requires_token(); }

}  // namespace comms
