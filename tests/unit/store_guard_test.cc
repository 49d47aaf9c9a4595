// The TCP store against clients that are not its job's: the token handshake
// (who is served, who is refused and what each side is told), and the limits
// that keep a hostile or broken client from starving the store of memory,
// connections or file descriptors.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comms/error.h"
#include "comms/store.h"
#include "store/store_auth.h"
#include "store/store_wire.h"

namespace comms {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

Error expect_error(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected a comms::Error, nothing was thrown";
  return Error(ErrorCode::kOk, "");
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A client that speaks the wire format by hand over a plain socket, so that
// a test can do what the library's client never would.
class RawClient {
 public:
  explicit RawClient(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  }
  ~RawClient() { close(); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool connected() const { return connected_; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  bool send(const std::string& bytes) {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
  }

  // One whole frame's body, or nullopt when the connection ended or nothing
  // came within `limit`.
  std::optional<std::string> read_frame(std::chrono::milliseconds limit = 2s) {
    std::string header;
    if (!read_exactly(4, limit, header)) return std::nullopt;
    uint32_t length = 0;
    for (int i = 3; i >= 0; --i) length = (length << 8) | static_cast<unsigned char>(header[static_cast<size_t>(i)]);
    std::string body;
    if (!read_exactly(length, limit, body)) return std::nullopt;
    return body;
  }

  // Whether the server closed the connection within `limit` (anything it
  // sends before closing is skipped).
  bool closed_within(std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(left, 1))) <= 0) continue;
      char buffer[4096];
      ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
      if (n <= 0) return true;
    }
    return false;
  }

  // The handshake as the library's client does it; returns the server's
  // answer to it (status, text).
  std::optional<wire::Response> handshake(const std::string& token) {
    auto hello_body = read_frame();
    if (!hello_body) return std::nullopt;
    std::string error;
    auto hello = wire::decode_hello(*hello_body, &error);
    if (!hello) {
      ADD_FAILURE() << "not a hello: " << error;
      return std::nullopt;
    }
    hello_ = *hello;
    wire::Auth auth;
    auth.nonce = store_auth::random_bytes(store_auth::kNonceBytes);
    if (!token.empty()) auth.proof = store_auth::client_proof(token, hello->nonce, auth.nonce);
    if (!send(wire::encode_auth(auth))) return std::nullopt;
    auto reply = read_frame();
    if (!reply) return std::nullopt;
    return wire::decode_response(*reply, &error);
  }

  const wire::Hello& hello() const { return hello_; }

 private:
  bool read_exactly(size_t n, std::chrono::milliseconds limit, std::string& out) {
    const auto deadline = Clock::now() + limit;
    while (out.size() < n) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char buffer[4096];
      ssize_t got = ::recv(fd_, buffer, std::min(sizeof buffer, n - out.size()), 0);
      if (got <= 0) return false;
      out.append(buffer, static_cast<size_t>(got));
    }
    return true;
  }

  int fd_ = -1;
  bool connected_ = false;
  wire::Hello hello_;
};

std::string get_frame(const std::string& key, uint64_t timeout_ms) {
  wire::Request get;
  get.op = wire::Op::kGet;
  get.keys = {key};
  get.timeout_ms = timeout_ms;
  return wire::encode_request(get);
}

std::string set_frame(const std::string& key, const std::string& value) {
  wire::Request set;
  set.op = wire::Op::kSet;
  set.keys = {key};
  set.value = value;
  return wire::encode_request(set);
}

TcpStoreServerOptions with_token(const std::string& token) {
  TcpStoreServerOptions options;
  options.token = token;
  return options;
}

// Polls `condition` for up to `limit`.
bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds limit = 3s) {
  const auto deadline = Clock::now() + limit;
  while (!condition()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

// Resident memory of this process in KiB (the server runs in it).
long rss_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return -1;
}

// ---------------------------------------------------------------------------
// The handshake on the wire

TEST(StoreHandshakeWire, HelloAndAuthSurviveARoundTrip) {
  std::string error;
  auto hello = wire::decode_hello(std::string_view(wire::encode_hello({true, "nonce"})).substr(4), &error);
  ASSERT_TRUE(hello) << error;
  EXPECT_TRUE(hello->token_required);
  EXPECT_EQ(hello->nonce, "nonce");
  auto auth = wire::decode_auth(std::string_view(wire::encode_auth({"n", std::string("p\0q", 3)})).substr(4), &error);
  ASSERT_TRUE(auth) << error;
  EXPECT_EQ(auth->nonce, "n");
  EXPECT_EQ(auth->proof, std::string("p\0q", 3));
}

TEST(StoreHandshakeWire, AHandshakeWithoutTheProtocolMagicIsRejected) {
  std::string error;
  std::string other = wire::encode_hello({false, "x"});
  other[8] = 'C';  // first byte of the magic, after the frame and string lengths
  EXPECT_FALSE(wire::decode_hello(std::string_view(other).substr(4), &error));
  EXPECT_TRUE(contains(error, "not the comms store protocol")) << error;
  std::string request = set_frame("k", "v");
  EXPECT_FALSE(wire::decode_auth(std::string_view(request).substr(4), &error));
}

// ---------------------------------------------------------------------------
// Authentication

TEST(TcpStoreAuth, AClientWithTheTokenIsServed) {
  TcpStoreServer server("127.0.0.1", 0, with_token("s3cret"));
  EXPECT_TRUE(server.requires_token());
  auto store = connect_tcp_store("127.0.0.1", server.port(), 2s, "s3cret");
  store->set("k", "v");
  EXPECT_EQ(store->get("k", 1s), "v");
}

TEST(TcpStoreAuth, AClientWithoutTheTokenIsRefusedNamingTheStoreAndTheReason) {
  TcpStoreServer server("127.0.0.1", 0, with_token("s3cret"));
  auto start = Clock::now();
  Error e = expect_error([&] { connect_tcp_store("127.0.0.1", server.port(), 5s, ""); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  EXPECT_TRUE(contains(e.what(), "the TCP store at 127.0.0.1:" + std::to_string(server.port()) +
                                     " refused this client: authentication failed (this client has no token"))
      << e.what();
  EXPECT_LT(Clock::now() - start, 2s) << "a refusal must not be retried until the connect timeout";
}

TEST(TcpStoreAuth, AClientWithAWrongTokenIsRefusedAndTheOthersKeepBeingServed) {
  TcpStoreServer server("127.0.0.1", 0, with_token("s3cret"));
  auto good = connect_tcp_store("127.0.0.1", server.port(), 2s, "s3cret");
  good->set("before", "1");
  Error e = expect_error([&] { connect_tcp_store("127.0.0.1", server.port(), 2s, "guess"); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(e.what(), "refused this client: authentication failed (COMMS_STORE_TOKEN differs)"))
      << e.what();
  good->set("after", "2");
  EXPECT_EQ(good->get("before", 1s), "1");
  EXPECT_EQ(server.key_count(), 2u);
}

TEST(TcpStoreAuth, NoRequestIsServedBeforeTheHandshake) {
  TcpStoreServer server("127.0.0.1", 0, with_token("s3cret"));
  {
    // A request where the handshake belongs.
    RawClient raw(server.port());
    ASSERT_TRUE(raw.read_frame());  // the hello
    raw.send(set_frame("intruder", "x"));
    EXPECT_TRUE(raw.closed_within(2s));
  }
  {
    // A handshake without a proof, then a request anyway.
    RawClient raw(server.port());
    auto answer = raw.handshake("");
    ASSERT_TRUE(answer);
    EXPECT_EQ(answer->status, wire::Status::kError);
    EXPECT_TRUE(contains(answer->text, "authentication failed")) << answer->text;
    raw.send(set_frame("intruder", "x"));
    EXPECT_TRUE(raw.closed_within(2s));
  }
  EXPECT_EQ(server.key_count(), 0u);
  EXPECT_TRUE(eventually([&] { return server.connection_count() == 0; }));
}

TEST(TcpStoreAuth, TheTokenNeverCrossesTheWireAndTheServerProvesItKnowsIt) {
  const std::string token = "a-token-that-must-stay-secret";
  TcpStoreServer server("127.0.0.1", 0, with_token(token));
  RawClient raw(server.port());
  auto hello_body = raw.read_frame();
  ASSERT_TRUE(hello_body);
  std::string error;
  auto hello = wire::decode_hello(*hello_body, &error);
  ASSERT_TRUE(hello) << error;
  EXPECT_TRUE(hello->token_required);
  EXPECT_EQ(hello->nonce.size(), store_auth::kNonceBytes);
  EXPECT_FALSE(contains(*hello_body, token));

  wire::Auth auth{store_auth::random_bytes(store_auth::kNonceBytes), ""};
  auth.proof = store_auth::client_proof(token, hello->nonce, auth.nonce);
  const std::string sent = wire::encode_auth(auth);
  EXPECT_FALSE(contains(sent, token));
  ASSERT_TRUE(raw.send(sent));
  auto reply = raw.read_frame();
  ASSERT_TRUE(reply);
  auto answer = wire::decode_response(*reply, &error);
  ASSERT_TRUE(answer) << error;
  EXPECT_EQ(answer->status, wire::Status::kOk);
  EXPECT_EQ(answer->text, store_auth::server_proof(token, hello->nonce, auth.nonce));
  EXPECT_FALSE(contains(*reply, token));

  // A fresh connection gets a fresh nonce: a recorded proof is worthless.
  RawClient replay(server.port());
  auto second = replay.read_frame();
  ASSERT_TRUE(second);
  EXPECT_NE(wire::decode_hello(*second, &error)->nonce, hello->nonce);
  ASSERT_TRUE(replay.send(sent));
  auto replayed = replay.read_frame();
  ASSERT_TRUE(replayed);
  EXPECT_EQ(wire::decode_response(*replayed, &error)->status, wire::Status::kError);
}

// A listener that answers the handshake as told, to test what the client
// accepts from a server.
class FakeServer {
 public:
  explicit FakeServer(std::function<void(int fd)> serve) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof address;
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&address), size), 0);
    EXPECT_EQ(::listen(fd_, 4), 0);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &size);
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this, serve] {
      int client = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) return;
      serve(client);
      ::close(client);
    });
  }
  ~FakeServer() {
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
};

void write_all(int fd, const std::string& bytes) { EXPECT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size())); }

std::string read_some(int fd) {
  char buffer[4096];
  ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
  return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : std::string();
}

TEST(TcpStoreAuth, AClientRejectsAServerThatCannotProveTheToken) {
  FakeServer fake([](int fd) {
    write_all(fd, wire::encode_hello({true, std::string(32, 'n')}));
    read_some(fd);                                                        // the client's proof
    write_all(fd, wire::encode_response({wire::Status::kOk, std::string(32, 'x'), 0}));  // not a proof
  });
  Error e = expect_error([&] { connect_tcp_store("127.0.0.1", fake.port(), 2s, "s3cret"); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(e.what(), "could not prove that it knows this client's token")) << e.what();
}

TEST(TcpStoreAuth, AClientWithATokenRejectsAStoreThatAsksForNone) {
  TcpStoreServer open("127.0.0.1", 0, with_token(""));
  EXPECT_FALSE(open.requires_token());
  Error e = expect_error([&] { connect_tcp_store("127.0.0.1", open.port(), 2s, "s3cret"); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(e.what(), "asks for no token but this client has one")) << e.what();
}

TEST(TcpStoreAuth, SomethingElseOnThePortIsNamedAsNotAStore) {
  FakeServer fake([](int fd) { write_all(fd, std::string("\x10\x00\x00\x00HTTP/1.1 200 OK\r\n", 20)); });
  Error e = expect_error([&] { connect_tcp_store("127.0.0.1", fake.port(), 2s, ""); });
  EXPECT_TRUE(contains(e.what(), "is not a comms TCP store")) << e.what();
}

// Sets (or unsets, with nullptr) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(TcpStoreAuth, TheTokenComesFromTheEnvironmentOrAFile) {
  auto dir = std::filesystem::temp_directory_path() / ("comms_token_test." + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "token").string();
  std::ofstream(file) << "from-a-file\n";
  ::chmod(file.c_str(), 0600);
  {
    ScopedEnv token("COMMS_STORE_TOKEN", nullptr);
    ScopedEnv token_file("COMMS_STORE_TOKEN_FILE", file.c_str());
    EXPECT_EQ(store_auth::token_from_environment(), "from-a-file");
    // Server and client both take it from there by default.
    TcpStoreServer server("127.0.0.1", 0);
    EXPECT_TRUE(server.requires_token());
    connect_tcp_store("127.0.0.1", server.port(), 2s)->set("k", "v");
    EXPECT_TRUE(contains(expect_error([&] { connect_tcp_store("127.0.0.1", server.port(), 2s, "other"); }).what(),
                         "COMMS_STORE_TOKEN differs"));
  }
  {
    ScopedEnv token("COMMS_STORE_TOKEN", "direct");
    ScopedEnv token_file("COMMS_STORE_TOKEN_FILE", nullptr);
    EXPECT_EQ(store_auth::token_from_environment(), "direct");
  }
  {
    ScopedEnv token("COMMS_STORE_TOKEN", "direct");
    ScopedEnv token_file("COMMS_STORE_TOKEN_FILE", file.c_str());
    EXPECT_TRUE(contains(expect_error([] { store_auth::token_from_environment(); }).what(),
                         "COMMS_STORE_TOKEN and COMMS_STORE_TOKEN_FILE are both set"));
  }
  {
    std::ofstream(file, std::ios::trunc) << "\n";
    ScopedEnv token("COMMS_STORE_TOKEN", nullptr);
    ScopedEnv token_file("COMMS_STORE_TOKEN_FILE", file.c_str());
    EXPECT_TRUE(contains(expect_error([] { store_auth::token_from_environment(); }).what(), "' is empty"));
  }
  {
    ScopedEnv token("COMMS_STORE_TOKEN", nullptr);
    ScopedEnv token_file("COMMS_STORE_TOKEN_FILE", (dir / "missing").c_str());
    EXPECT_TRUE(contains(expect_error([] { store_auth::token_from_environment(); }).what(),
                         "is not a readable regular file"));
  }
  std::filesystem::remove_all(dir);
}

// ---------------------------------------------------------------------------
// Limits

TEST(TcpStoreLimits, AFrameHeaderAnnouncingAHugeBodyCostsOnlyWhatArrives) {
  TcpStoreServer server("127.0.0.1", 0, with_token(""));
  const long before = rss_kib();
  // 32 authenticated clients each announce a 64 MiB frame and send 10 bytes
  // of it: 2 GiB if the server allocated what the headers say.
  std::vector<std::unique_ptr<RawClient>> clients;
  for (int i = 0; i < 32; ++i) {
    clients.push_back(std::make_unique<RawClient>(server.port()));
    auto answer = clients.back()->handshake("");
    ASSERT_TRUE(answer && answer->status == wire::Status::kOk);
    ASSERT_TRUE(clients.back()->send(std::string("\x00\x00\x00\x04", 4) + std::string(10, 'x')));
  }
  auto store = connect_tcp_store("127.0.0.1", server.port(), 2s, "");
  auto start = Clock::now();
  store->set("legit", "1");
  EXPECT_EQ(store->get("legit", 1s), "1");
  EXPECT_LT(Clock::now() - start, 1s);
  const long grown_mib = (rss_kib() - before) / 1024;
  std::printf("32 headers announcing 64 MiB each: resident memory grew by %ld MiB\n", grown_mib);
  EXPECT_LT(grown_mib, 64) << "the server allocated the announced frames";
  EXPECT_EQ(server.connection_count(), 33u);
}

TEST(TcpStoreLimits, AClientThatDisconnectsWhileItsGetIsParkedReleasesItsConnectionAtOnce) {
  TcpStoreServer server("127.0.0.1", 0, with_token(""));
  for (int i = 0; i < 20; ++i) {
    RawClient raw(server.port());
    ASSERT_TRUE(raw.handshake(""));
    raw.send(get_frame("never", 24ull * 3600 * 1000));  // a day
  }
  EXPECT_TRUE(eventually([&] { return server.connection_count() == 0; }, 2s))
      << server.connection_count() << " connections are still held for their parked gets";
  // The forgotten gets do not answer anyone later.
  auto store = connect_tcp_store("127.0.0.1", server.port(), 2s, "");
  store->set("never", "now");
  EXPECT_EQ(store->get("never", 1s), "now");
}

TEST(TcpStoreLimits, AConnectionThatNeverFinishesItsHandshakeIsClosedAfterTheHandshakeTimeout) {
  TcpStoreServerOptions options = with_token("s3cret");
  options.handshake_timeout = 300ms;
  TcpStoreServer server("127.0.0.1", 0, options);
  RawClient silent(server.port());
  RawClient partial(server.port());
  partial.send(std::string("\x40\x00", 2));  // half a frame header
  auto start = Clock::now();
  EXPECT_TRUE(silent.closed_within(3s));
  EXPECT_TRUE(partial.closed_within(3s));
  EXPECT_GE(Clock::now() - start, 250ms);
  EXPECT_TRUE(eventually([&] { return server.connection_count() == 0; }));
}

TEST(TcpStoreLimits, AHalfSentFrameIsDroppedAfterTheFrameTimeoutButAnIdleClientIsNot) {
  TcpStoreServerOptions options = with_token("");
  options.handshake_timeout = 200ms;
  options.frame_timeout = 300ms;
  TcpStoreServer server("127.0.0.1", 0, options);
  auto idle = connect_tcp_store("127.0.0.1", server.port(), 2s, "");
  RawClient header(server.port());
  ASSERT_TRUE(header.handshake(""));
  header.send(std::string("\x20\x00", 2));
  RawClient body(server.port());
  ASSERT_TRUE(body.handshake(""));
  body.send(set_frame("k", "value").substr(0, 8));
  EXPECT_TRUE(header.closed_within(3s));
  EXPECT_TRUE(body.closed_within(3s));
  // Idle between requests (and blocked in a get) is how a rank spends its
  // run: that connection stays.
  std::this_thread::sleep_for(500ms);
  idle->set("still", "here");
  EXPECT_THROW(idle->get("absent", 800ms), Error);
  EXPECT_EQ(idle->get("still", 1s), "here");
  EXPECT_EQ(server.key_count(), 1u);
}

TEST(TcpStoreLimits, ConnectionsFromOneAddressAreBounded) {
  TcpStoreServerOptions options = with_token("");
  options.max_connections_per_address = 4;
  TcpStoreServer server("127.0.0.1", 0, options);
  std::vector<std::shared_ptr<Store>> held;
  for (int i = 0; i < 4; ++i) held.push_back(connect_tcp_store("127.0.0.1", server.port(), 2s, ""));
  RawClient fifth(server.port());
  EXPECT_TRUE(fifth.closed_within(2s));
  EXPECT_EQ(server.connection_count(), 4u);
  held.pop_back();
  EXPECT_TRUE(eventually([&] { return server.connection_count() == 3; }));
  connect_tcp_store("127.0.0.1", server.port(), 2s, "")->set("room", "again");
  EXPECT_EQ(server.key_count(), 1u);
}

TEST(TcpStoreLimits, TooManyHandshakesFromOneAddressEvictTheOldestAndTheJobGetsIn) {
  TcpStoreServerOptions options = with_token("s3cret");
  options.max_handshakes_per_address = 3;
  TcpStoreServer server("127.0.0.1", 0, options);
  std::vector<std::unique_ptr<RawClient>> squatters;
  for (int i = 0; i < 3; ++i) {
    squatters.push_back(std::make_unique<RawClient>(server.port()));
    ASSERT_TRUE(squatters.back()->read_frame());  // each got its hello: it is in
  }
  auto store = connect_tcp_store("127.0.0.1", server.port(), 2s, "s3cret");
  EXPECT_TRUE(squatters[0]->closed_within(2s)) << "the oldest handshake was not evicted";
  store->set("k", "v");
  EXPECT_EQ(store->get("k", 1s), "v");
}

TEST(TcpStoreLimits, TheServerBindsOnlyTheAddressItWasGiven) {
  TcpStoreServer server("127.0.0.1", 0, with_token(""));
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in other{};
  other.sin_family = AF_INET;
  other.sin_port = htons(server.port());
  other.sin_addr.s_addr = htonl(0x7f000002);  // 127.0.0.2: loopback too, but not what was given
  EXPECT_NE(::connect(fd, reinterpret_cast<sockaddr*>(&other), sizeof other), 0);
  ::close(fd);
}

// Every socket of the server and the client is close-on-exec: a rank that
// runs a program must not hand it the store's connection or port.
TEST(TcpStoreLimits, EverySocketIsCloseOnExec) {
  TcpStoreServer server("127.0.0.1", 0, with_token(""));
  auto store = connect_tcp_store("127.0.0.1", server.port(), 2s, "");
  store->set("k", "v");
  int sockets = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    auto target = std::filesystem::read_symlink(entry.path(), ec).string();
    if (ec || target.rfind("socket:", 0) != 0) continue;
    const int fd = std::stoi(entry.path().filename().string());
    ++sockets;
    EXPECT_TRUE(::fcntl(fd, F_GETFD) & FD_CLOEXEC) << "socket fd " << fd << " is inherited across exec";
  }
  EXPECT_GE(sockets, 3) << "listener, accepted connection and client";
}

// CPU time (user + system) of a process, in seconds.
double cpu_seconds(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::string skip;
  for (int i = 0; i < 11; ++i) fields >> skip;  // state .. cmajflt
  double utime = 0, stime = 0;
  fields >> utime >> stime;
  return (utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

TEST(TcpStoreLimits, OutOfDescriptorsTheServerNeitherSpinsNorStrandsTheJob) {
  // The server runs in a child limited to 64 descriptors; this process
  // floods it with connections that hold descriptors and never handshake.
  int to_parent[2], to_child[2];
  ASSERT_EQ(::pipe2(to_parent, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(to_child, O_CLOEXEC), 0);
  pid_t child = ::fork();
  if (child == 0) {
    rlimit limit{64, 64};
    ::setrlimit(RLIMIT_NOFILE, &limit);
    TcpStoreServerOptions options = with_token("s3cret");
    options.max_handshakes_per_address = 1000;  // let the flood reach the descriptor limit
    options.handshake_timeout = 60s;
    TcpStoreServer server("127.0.0.1", 0, options);
    uint16_t port = server.port();
    (void)!::write(to_parent[1], &port, sizeof port);
    char done;
    (void)!::read(to_child[0], &done, 1);
    ::_exit(0);
  }
  uint16_t port = 0;
  ASSERT_EQ(::read(to_parent[0], &port, sizeof port), static_cast<ssize_t>(sizeof port));
  std::vector<std::unique_ptr<RawClient>> flood;
  for (int i = 0; i < 150; ++i) flood.push_back(std::make_unique<RawClient>(port));
  std::this_thread::sleep_for(300ms);
  const double cpu_before = cpu_seconds(child);
  auto start = Clock::now();
  std::optional<Error> failed;
  try {
    auto store = connect_tcp_store("127.0.0.1", port, 5s, "s3cret");
    store->set("k", "v");
    EXPECT_EQ(store->get("k", 1s), "v");
  } catch (const Error& e) {
    failed = e;
  }
  EXPECT_FALSE(failed) << failed->what();
  EXPECT_LT(Clock::now() - start, 3s) << "the job's client waited for the flood to time out";
  std::this_thread::sleep_for(1s);
  const double busy = cpu_seconds(child) - cpu_before;
  EXPECT_LT(busy, 0.5) << "the server burned " << busy << " s of CPU while out of descriptors";
  flood.clear();
  (void)!::write(to_child[1], "x", 1);
  int status = 0;
  ::waitpid(child, &status, 0);
  for (int fd : {to_parent[0], to_parent[1], to_child[0], to_child[1]}) ::close(fd);
}

}  // namespace
}  // namespace comms
