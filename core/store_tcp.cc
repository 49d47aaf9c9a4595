// The TCP store: a server on its own io_context thread, and a synchronous
// client whose every read and write is bounded by a deadline.
//
// Protocol (store_wire.h): the client sends one request frame and reads one
// response frame; there is never more than one request in flight on a
// connection. get and wait block on the server, which answers "timeout" at
// the deadline the client sent, so the connection stays in step. A client
// is one connection: while one thread blocks in get/wait on it, the client's
// other callers queue behind it (as with c10d's TCPStore), so a thread that
// must set keys while another waits should use its own client.
#include <algorithm>
#include <array>
#include <chrono>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "strutil.h"
#include "asio.hpp"
#include "comms/error.h"
#include "comms/store.h"
#include "log.h"
#include "store_semantics.h"
#include "store_tcp.h"
#include "store_wire.h"

namespace comms {
namespace {

using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using store_semantics::quoted_keys;

std::string endpoint_text(const tcp::endpoint& endpoint) {
  const auto address = endpoint.address();
  if (address.is_v6()) return str::cat("[", address.to_string(), "]:", endpoint.port());
  return str::cat(address.to_string(), ":", endpoint.port());
}

std::string host_port(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return str::cat("[", host, "]:", port);
  return str::cat(host, ":", port);
}

// How long a client waits for a blocking get/wait reply past the timeout it
// sent: the server answers at that timeout, so this only matters when the
// server is stuck.
constexpr auto kReplyMargin = std::chrono::seconds(10);

// A garbage frame header from a broken server must not size an allocation.
constexpr size_t kClientMaxFrameBytes = size_t{1} << 30;

}  // namespace

// ---------------------------------------------------------------------------
// Server

class TcpStoreServer::Impl {
 public:
  Impl(const std::string& host, uint16_t port, size_t max_frame_bytes)
      : host_(host), max_frame_bytes_(max_frame_bytes), acceptor_(io_), accept_retry_(io_) {
    bind(host, port);
    start_accept();
    thread_ = std::thread([this] { run(); });
  }

  ~Impl() {
    io_.stop();
    if (thread_.joinable()) thread_.join();
    // Pending waiters hold sessions (and their sockets): drop them before the
    // io_context goes, which closes every client connection.
    waiters_.clear();
  }

  uint16_t port() const { return port_; }
  const std::string& host() const { return host_; }
  size_t key_count() const {
    std::lock_guard<std::mutex> lock(values_mu_);
    return values_.size();
  }

 private:
  class Session;
  struct Waiter;

  void bind(const std::string& host, uint16_t port) {
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
      acceptor_.open(entry.endpoint().protocol(), bind_ec);
      if (!bind_ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), bind_ec);
      if (!bind_ec) acceptor_.bind(entry.endpoint(), bind_ec);
      if (!bind_ec) acceptor_.listen(asio::socket_base::max_listen_connections, bind_ec);
      if (!bind_ec) {
        port_ = acceptor_.local_endpoint().port();
        address_text_ = endpoint_text(acceptor_.local_endpoint());
        return;
      }
      last_error = str::cat(endpoint_text(entry.endpoint()), ": ", bind_ec.message());
    }
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("TCP store server: cannot listen on ", host_port(host, port), ": ", last_error));
  }

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
  void handle(const std::shared_ptr<Session>& session, wire::Request request);
  void notify(const std::string& key);
  void complete_waiter(const std::shared_ptr<Waiter>& waiter, wire::Response response);
  void unregister_waiter(const std::shared_ptr<Waiter>& waiter);
  bool all_present_locked(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return values_.contains(k); });
  }

  // Declared first so that it is destroyed last: sockets and timers need it.
  asio::io_context io_;
  std::string host_;
  std::string address_text_;
  uint16_t port_ = 0;
  size_t max_frame_bytes_;
  tcp::acceptor acceptor_;
  asio::steady_timer accept_retry_;
  std::thread thread_;

  // Only the io thread writes the values; the mutex is for key_count().
  mutable std::mutex values_mu_;
  std::unordered_map<std::string, std::string> values_;
  // Blocked get/wait requests, listed under each key they still miss.
  std::unordered_map<std::string, std::vector<std::shared_ptr<Waiter>>> waiters_;
};

class TcpStoreServer::Impl::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Impl& server, tcp::socket socket) : server_(server), socket_(std::move(socket)) {
    asio::error_code ec;
    auto remote = socket_.remote_endpoint(ec);
    peer_ = ec ? std::string("unknown peer") : endpoint_text(remote);
    socket_.set_option(tcp::no_delay(true), ec);
  }

  void read_header() {
    asio::async_read(socket_, asio::buffer(header_),
                     [self = shared_from_this()](const asio::error_code& ec, size_t) {
                       self->on_header(ec);
                     });
  }

  void respond(const wire::Response& response) {
    reply_ = wire::encode_response(response);
    asio::async_write(socket_, asio::buffer(reply_),
                      [self = shared_from_this()](const asio::error_code& ec, size_t) {
                        if (ec) {
                          self->close_quietly(ec);
                          return;
                        }
                        self->read_header();
                      });
  }

 private:
  void on_header(const asio::error_code& ec) {
    if (ec) {
      close_quietly(ec);
      return;
    }
    std::string error;
    auto length = wire::decode_frame_length(std::string_view(header_.data(), header_.size()),
                                            server_.max_frame_bytes_, &error);
    if (!length) {
      close_with_error(error);
      return;
    }
    body_.resize(*length);  // bounded by max_frame_bytes just above
    asio::async_read(socket_, asio::buffer(body_),
                     [self = shared_from_this()](const asio::error_code& ec, size_t) {
                       self->on_body(ec);
                     });
  }

  void on_body(const asio::error_code& ec) {
    if (ec) {
      close_quietly(ec);
      return;
    }
    std::string error;
    auto request = wire::decode_request(body_, &error);
    std::string().swap(body_);  // do not keep a large frame's buffer around
    if (!request) {
      close_with_error(error);
      return;
    }
    server_.handle(shared_from_this(), std::move(*request));
  }

  void close_with_error(const std::string& why) {
    log::error(str::cat("TCP store server ", server_.address_text_, ": closing the connection from ",
                            peer_, ": ", why));
    close();
  }

  void close_quietly(const asio::error_code& ec) {
    if (ec != asio::error::eof && ec != asio::error::operation_aborted) {
      log::debug(str::cat("TCP store server ", server_.address_text_, ": connection from ", peer_,
                              " ended: ", ec.message()));
    }
    close();
  }

  void close() {
    asio::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  Impl& server_;
  tcp::socket socket_;
  std::string peer_;
  std::array<char, wire::kFrameHeaderBytes> header_{};
  std::string body_;
  std::string reply_;
};

struct TcpStoreServer::Impl::Waiter {
  Waiter(asio::io_context& io, std::shared_ptr<Session> s, wire::Request r)
      : session(std::move(s)), request(std::move(r)), timer(io) {}
  std::shared_ptr<Session> session;
  wire::Request request;
  asio::steady_timer timer;
  bool done = false;
};

void TcpStoreServer::Impl::start_accept() {
  acceptor_.async_accept([this](const asio::error_code& ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (ec) {
      // E.g. out of file descriptors: retry later instead of spinning.
      log::error(str::cat("TCP store server ", address_text_, ": accept failed: ", ec.message()));
      accept_retry_.expires_after(std::chrono::milliseconds(100));
      accept_retry_.async_wait([this](const asio::error_code& wait_ec) {
        if (!wait_ec) start_accept();
      });
      return;
    }
    std::make_shared<Session>(*this, std::move(socket))->read_header();
    start_accept();
  });
}

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
  waiter->session->respond(response);
}

void TcpStoreServer::Impl::unregister_waiter(const std::shared_ptr<Waiter>& waiter) {
  for (const auto& k : waiter->request.keys) {
    auto it = waiters_.find(k);
    if (it == waiters_.end()) continue;
    std::erase(it->second, waiter);
    if (it->second.empty()) waiters_.erase(it);
  }
}

TcpStoreServer::TcpStoreServer(const std::string& host, uint16_t port, size_t max_frame_bytes)
    : impl_(std::make_unique<Impl>(host, port, max_frame_bytes)) {}
TcpStoreServer::~TcpStoreServer() = default;
uint16_t TcpStoreServer::port() const { return impl_->port(); }
const std::string& TcpStoreServer::host() const { return impl_->host(); }
size_t TcpStoreServer::key_count() const { return impl_->key_count(); }

// ---------------------------------------------------------------------------
// Client

namespace {

class TcpStore final : public Store {
 public:
  using Store::get;
  using Store::wait;

  TcpStore(std::string host, uint16_t port, std::chrono::milliseconds connect_timeout)
      : host_(std::move(host)), port_(port), address_(host_port(host_, port)), socket_(io_) {
    connect(connect_timeout);
  }

  ~TcpStore() override {
    asio::error_code ignored;
    socket_.close(ignored);
  }

  const std::string& local_address() const { return local_address_; }

  void set(const std::string& key, const std::string& value) override {
    auto request = make_request(wire::Op::kSet, {key});
    request.value = value;
    call(request, Clock::now() + default_timeout_, str::cat("set('", key, "')"));
  }

  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    auto request = make_request(wire::Op::kGet, {key});
    request.timeout_ms = timeout_ms(timeout);
    std::string what = str::cat("get('", key, "')");
    auto response = call(request, reply_deadline(timeout), what);
    if (response.status == wire::Status::kTimeout) throw timeout_error(what, timeout, response.text);
    return std::move(response.text);
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    auto request = make_request(wire::Op::kWait, keys);
    request.timeout_ms = timeout_ms(timeout);
    std::string what = str::cat("wait(", quoted_keys(keys), ")");
    auto response = call(request, reply_deadline(timeout), what);
    if (response.status == wire::Status::kTimeout) throw timeout_error(what, timeout, response.text);
  }

  int64_t add(const std::string& key, int64_t delta) override {
    auto request = make_request(wire::Op::kAdd, {key});
    request.delta = delta;
    return call(request, Clock::now() + default_timeout_, str::cat("add('", key, "', ", delta, ")")).number;
  }

  bool check(const std::vector<std::string>& keys) override {
    auto request = make_request(wire::Op::kCheck, keys);
    return call(request, Clock::now() + default_timeout_, str::cat("check(", quoted_keys(keys), ")"))
               .number != 0;
  }

  bool delete_key(const std::string& key) override {
    auto request = make_request(wire::Op::kDelete, {key});
    return call(request, Clock::now() + default_timeout_, str::cat("delete_key('", key, "')")).number != 0;
  }

  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override {
    auto request = make_request(wire::Op::kCompareSet, {key});
    request.value = expected;
    request.desired = desired;
    return call(request, Clock::now() + default_timeout_, str::cat("compare_set('", key, "')")).text;
  }

 private:
  static wire::Request make_request(wire::Op op, std::vector<std::string> keys) {
    wire::Request request;
    request.op = op;
    request.keys = std::move(keys);
    return request;
  }

  static uint64_t timeout_ms(std::chrono::milliseconds timeout) {
    return static_cast<uint64_t>(std::max<int64_t>(timeout.count(), 0));
  }

  static Clock::time_point reply_deadline(std::chrono::milliseconds timeout) {
    return store_semantics::deadline_after(timeout) + kReplyMargin;
  }

  Error timeout_error(const std::string& what, std::chrono::milliseconds timeout,
                      const std::string& missing) const {
    return Error(ErrorCode::kTimeout, str::cat(what, " on the TCP store at ", address_, " timed out after ",
                                                   timeout.count(), " ms; missing: ", missing));
  }

  // Runs one asynchronous operation until it completes or `deadline` passes.
  // On the deadline the socket is closed (which aborts the operation) and
  // false is returned. `start` receives the completion handler.
  template <typename Start>
  bool run_before(Clock::time_point deadline, asio::error_code& result, Start start) {
    bool finished = false;
    start([&](const asio::error_code& ec, auto&&...) {
      result = ec;
      finished = true;
    });
    io_.restart();
    while (!finished) {
      auto now = Clock::now();
      if (now >= deadline) break;
      io_.run_one_for(deadline - now);
    }
    if (finished) return true;
    asio::error_code ignored;
    socket_.close(ignored);
    io_.restart();
    while (!finished) io_.run_one();  // the aborted handler runs at once
    return false;
  }

  void connect(std::chrono::milliseconds connect_timeout) {
    auto deadline = store_semantics::deadline_after(connect_timeout);
    auto pause = std::chrono::milliseconds(50);
    std::string last_error = "no attempt made";
    while (true) {
      asio::error_code ec;
      tcp::resolver resolver(io_);
      auto endpoints = resolver.resolve(host_, std::to_string(port_), tcp::resolver::numeric_service, ec);
      if (ec) {
        last_error = str::cat("cannot resolve '", host_, "': ", ec.message());
      } else {
        socket_ = tcp::socket(io_);
        bool in_time = run_before(deadline, ec, [&](auto handler) {
          asio::async_connect(socket_, endpoints, handler);
        });
        if (in_time && !ec) break;
        last_error = in_time ? ec.message() : "connect attempt timed out";
      }
      auto now = Clock::now();
      if (now >= deadline) {
        throw Error(ErrorCode::kTimeout,
                    str::cat("could not connect to the TCP store at ", address_, " within ",
                                 connect_timeout.count(), " ms: ", last_error));
      }
      std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
      pause = std::min(pause * 2, std::chrono::milliseconds(1000));
    }
    asio::error_code ec;
    socket_.set_option(tcp::no_delay(true), ec);
    auto local = socket_.local_endpoint(ec);
    if (!ec) local_address_ = local.address().to_string();
  }

  // One request/response exchange. Throws kPeerFailure when the connection
  // breaks, kTimeout when the deadline passes (after which the connection is
  // out of step and unusable), kInvalidArgument when the server rejects it.
  wire::Response call(const wire::Request& request, Clock::time_point deadline, const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.empty()) {
      throw Error(ErrorCode::kPeerFailure, str::cat(what, ": the connection to the TCP store at ", address_,
                                                        " is unusable: ", broken_));
    }
    std::string frame = wire::encode_request(request);
    asio::error_code ec;
    auto check = [&](bool in_time, const char* step) {
      if (!in_time) {
        broken_ = str::cat("an earlier request timed out while ", step);
        throw Error(ErrorCode::kTimeout, str::cat(what, " on the TCP store at ", address_,
                                                      ": no reply in time (timed out while ", step, ")"));
      }
      if (ec) {
        broken_ = str::cat("lost while ", step, ": ", ec.message());
        throw Error(ErrorCode::kPeerFailure, str::cat(what, ": lost the connection to the TCP store at ",
                                                          address_, " while ", step, ": ", ec.message()));
      }
    };
    check(run_before(deadline, ec, [&](auto h) { asio::async_write(socket_, asio::buffer(frame), h); }),
          "sending the request");
    std::array<char, wire::kFrameHeaderBytes> header{};
    check(run_before(deadline, ec, [&](auto h) { asio::async_read(socket_, asio::buffer(header), h); }),
          "reading the reply");
    std::string error;
    auto length = wire::decode_frame_length(std::string_view(header.data(), header.size()),
                                            kClientMaxFrameBytes, &error);
    if (!length) throw protocol_error(what, error);
    std::string body(*length, '\0');
    check(run_before(deadline, ec, [&](auto h) { asio::async_read(socket_, asio::buffer(body), h); }),
          "reading the reply");
    auto response = wire::decode_response(body, &error);
    if (!response) throw protocol_error(what, error);
    if (response->status == wire::Status::kError) {
      throw Error(ErrorCode::kInvalidArgument,
                  str::cat(what, " rejected by the TCP store at ", address_, ": ", response->text));
    }
    return std::move(*response);
  }

  Error protocol_error(const std::string& what, const std::string& error) {
    broken_ = str::cat("malformed reply: ", error);
    asio::error_code ignored;
    socket_.close(ignored);
    return Error(ErrorCode::kPeerFailure,
                 str::cat(what, ": malformed reply from the TCP store at ", address_, ": ", error));
  }

  std::string host_;
  uint16_t port_;
  std::string address_;
  std::string local_address_;
  std::mutex mu_;  // one request/response at a time
  asio::io_context io_;
  tcp::socket socket_;
  std::string broken_;  // why the connection is unusable; empty while it is fine
};

}  // namespace

std::shared_ptr<Store> connect_tcp_store(const std::string& host, uint16_t port,
                                         std::chrono::milliseconds connect_timeout) {
  if (host.empty() || port == 0) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("connect_tcp_store: invalid address '", host_port(host, port), "'"));
  }
  return std::make_shared<TcpStore>(host, port, connect_timeout);
}

std::string tcp_store_local_address(const Store& store) {
  if (const Store* base = prefix_store_base(store)) return tcp_store_local_address(*base);
  if (auto* tcp_store = dynamic_cast<const TcpStore*>(&store)) return tcp_store->local_address();
  return "";
}

}  // namespace comms
