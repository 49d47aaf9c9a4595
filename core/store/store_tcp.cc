// The TCP store's client (the server is in store_tcp_server.cc): synchronous,
// every read and write bounded by a deadline.
//
// Protocol (store_wire.h): the client sends one request frame and reads one
// response frame; there is never more than one request in flight on a
// connection. get and wait block on the server, which answers "timeout" at
// the deadline the client sent, so the connection stays in step. A client
// is safe from several threads, as store.h promises: a caller that finds the
// client's connection busy (say, another thread blocked in get) takes a
// spare connection to the same server for that one request, so no caller
// queues behind another's blocking get. Spares are closed after use: a pool
// would grow whenever two callers happened to collide (the flight
// recorder's watcher polls the store from its own thread), and a process's
// descriptor count must not depend on such timing. (c10d's
// TCPStore serializes them instead, which deadlocks two comms whose
// rendezvous wait on each other from two threads.)
#include <algorithm>
#include <array>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "asio.hpp"
#include "comms/error.h"
#include "comms/store.h"
#include "util/log.h"
#include "store_auth.h"
#include "store_net.h"
#include "store_semantics.h"
#include "store_tcp.h"
#include "store_wire.h"
#include "util/strutil.h"

namespace comms {
namespace {

using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using store_net::host_port;
using store_semantics::quoted_keys;

// How long a client waits for a blocking get/wait reply past the timeout it
// sent: the server answers at that timeout, so this only matters when the
// server is stuck.
constexpr auto kReplyMargin = std::chrono::seconds(10);

// A garbage frame header from a broken server must not size an allocation.
constexpr size_t kClientMaxFrameBytes = size_t{1} << 30;

// How long one connection attempt waits for the server's hello. A server
// that accepted but does not answer (stuck, or out of descriptors with the
// connection in its backlog) gets another attempt until connect_timeout.
constexpr auto kHelloWait = std::chrono::seconds(10);

// A failure that retrying cannot fix: the handshake was answered, and no.
struct Refused {
  Error error;
};

class TcpStore final : public Store {
 public:
  using Store::get;
  using Store::wait;

  TcpStore(std::string host, uint16_t port, std::chrono::milliseconds connect_timeout, std::string token)
      : host_(std::move(host)), port_(port), address_(host_port(host_, port)), token_(std::move(token)),
        connect_timeout_(connect_timeout), socket_(io_) {
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
        try {
          if (connect_once(endpoints, deadline, last_error)) break;
        } catch (const Refused& refused) {
          throw refused.error;
        }
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

  // One attempt: connect to the first endpoint that answers, then the
  // handshake. False (with `error` set) when another attempt may succeed;
  // throws Refused when it cannot.
  bool connect_once(const tcp::resolver::results_type& endpoints, Clock::time_point deadline, std::string& error) {
    asio::error_code ec;
    bool connected = false;
    for (const auto& entry : endpoints) {
      socket_.close(ec);
      store_net::open_cloexec(socket_, entry.endpoint().protocol(), ec);
      if (ec) {
        error = str::cat("cannot open a socket: ", ec.message());
        continue;
      }
      bool in_time = run_before(deadline, ec, [&](auto handler) { socket_.async_connect(entry.endpoint(), handler); });
      if (in_time && !ec) {
        connected = true;
        break;
      }
      error = in_time ? ec.message() : "connect attempt timed out";
      if (!in_time) return false;
    }
    if (!connected) return false;
    auto hello_deadline = std::min(deadline, Clock::now() + kHelloWait);
    std::string body;
    if (!read_frame(hello_deadline, wire::kHandshakeMaxFrameBytes, body, error)) {
      error = str::cat("no hello from the server: ", error);
      return false;
    }
    return handshake(body, deadline, error);
  }

  Error refused(const std::string& why) const {
    return Error(ErrorCode::kInvalidArgument, str::cat("the TCP store at ", address_, " refused this client: ", why));
  }

  // The client's half of the handshake (store_wire.h), after the hello.
  bool handshake(const std::string& hello_body, Clock::time_point deadline, std::string& error) {
    std::string decode_error;
    auto hello = wire::decode_hello(hello_body, &decode_error);
    if (!hello) {
      throw Refused{Error(ErrorCode::kInvalidArgument,
                          str::cat("the server at ", address_, " is not a comms TCP store: ", decode_error))};
    }
    if (!hello->token_required && !token_.empty()) {
      throw Refused{Error(ErrorCode::kInvalidArgument,
                          str::cat("the TCP store at ", address_, " asks for no token but this client has one "
                                   "(COMMS_STORE_TOKEN or COMMS_STORE_TOKEN_FILE is set): its server was started "
                                   "without it, so it cannot prove it is the job's store"))};
    }
    wire::Auth auth;
    auth.nonce = store_auth::random_bytes(store_auth::kNonceBytes);
    if (!token_.empty()) auth.proof = store_auth::client_proof(token_, hello->nonce, auth.nonce);
    std::string frame = wire::encode_auth(auth);
    asio::error_code ec;
    bool in_time = run_before(deadline, ec, [&](auto h) { asio::async_write(socket_, asio::buffer(frame), h); });
    if (!in_time || ec) {
      error = str::cat("sending the handshake failed: ", in_time ? ec.message() : "timed out");
      return false;
    }
    std::string body;
    if (!read_frame(deadline, wire::kHandshakeMaxFrameBytes, body, error)) {
      // A server that drops us without a word may be shedding load: retry.
      error = str::cat("no answer to the handshake: ", error);
      return false;
    }
    auto response = wire::decode_response(body, &decode_error);
    if (!response) {
      throw Refused{Error(ErrorCode::kInvalidArgument,
                          str::cat("the server at ", address_, " answered the handshake wrongly: ", decode_error))};
    }
    if (response->status != wire::Status::kOk) throw Refused{refused(response->text)};
    if (!token_.empty() &&
        !store_auth::proofs_equal(response->text, store_auth::server_proof(token_, hello->nonce, auth.nonce))) {
      throw Refused{Error(ErrorCode::kInvalidArgument,
                          str::cat("the TCP store at ", address_, " could not prove that it knows this client's "
                                   "token (COMMS_STORE_TOKEN differs, or it is not the job's store)"))};
    }
    return true;
  }

  // Reads one whole frame before `deadline`. False (with `error` set) when
  // the connection broke, the deadline passed or the header is malformed.
  bool read_frame(Clock::time_point deadline, size_t max_bytes, std::string& body, std::string& error) {
    std::array<char, wire::kFrameHeaderBytes> header{};
    asio::error_code ec;
    bool in_time = run_before(deadline, ec, [&](auto h) { asio::async_read(socket_, asio::buffer(header), h); });
    if (!in_time || ec) {
      error = in_time ? ec.message() : "timed out";
      return false;
    }
    auto length = wire::decode_frame_length(std::string_view(header.data(), header.size()), max_bytes, &error);
    if (!length) return false;
    body.assign(*length, '\0');
    in_time = run_before(deadline, ec, [&](auto h) { asio::async_read(socket_, asio::buffer(body), h); });
    if (!in_time || ec) {
      error = in_time ? ec.message() : "timed out";
      return false;
    }
    return true;
  }

  // One request/response exchange. Throws kPeerFailure when the connection
  // breaks, kTimeout when the deadline passes (after which the connection is
  // out of step and unusable), kInvalidArgument when the server rejects it.
  wire::Response call(const wire::Request& request, Clock::time_point deadline, const std::string& what) {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) return call_on_spare(request, deadline, what);
    return exchange(request, deadline, what);
  }

  // The connection is busy with another thread's request: run this one on a
  // connection of its own, closed when the request is answered.
  wire::Response call_on_spare(const wire::Request& request, Clock::time_point deadline, const std::string& what) {
    TcpStore spare(host_, port_, connect_timeout_, token_);
    return spare.call(request, deadline, what);
  }

  // One exchange on this connection; the caller holds mu_.
  wire::Response exchange(const wire::Request& request, Clock::time_point deadline, const std::string& what) {
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
  std::string token_;
  std::string local_address_;
  std::chrono::milliseconds connect_timeout_;
  std::mutex mu_;  // one request/response at a time on this connection
  asio::io_context io_;
  tcp::socket socket_;
  std::string broken_;  // why the connection is unusable; empty while it is fine
};

}  // namespace

std::shared_ptr<Store> connect_tcp_store(const std::string& host, uint16_t port,
                                         std::chrono::milliseconds connect_timeout, const std::string& token) {
  if (host.empty() || port == 0) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("connect_tcp_store: invalid address '", host_port(host, port), "'"));
  }
  return std::make_shared<TcpStore>(host, port, connect_timeout, token);
}

std::shared_ptr<Store> connect_tcp_store(const std::string& host, uint16_t port,
                                         std::chrono::milliseconds connect_timeout) {
  return connect_tcp_store(host, port, connect_timeout, store_auth::token_from_environment());
}

std::string tcp_store_local_address(const Store& store) {
  if (const Store* base = prefix_store_base(store)) return tcp_store_local_address(*base);
  if (auto* tcp_store = dynamic_cast<const TcpStore*>(&store)) return tcp_store->local_address();
  return "";
}

}  // namespace comms
