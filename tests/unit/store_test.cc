// Unit tests of the rendezvous stores: the wire codec of the TCP store, the
// behaviour every store shares (run against each kind), and what is specific
// to the TCP store (connection retries, lost server, hostile clients) and to
// the file store (several processes, odd keys).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "asio.hpp"
#include "comms/error.h"
#include "comms/store.h"
#include "store/store_tcp.h"
#include "store/store_wire.h"
#include "subprocess.h"

namespace comms {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

int64_t elapsed_ms(Clock::time_point since) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count();
}

// Runs `call`, which must throw comms::Error, and returns the error.
Error expect_error(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected a comms::Error, nothing was thrown";
  return Error(ErrorCode::kOk, "");
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "comms_store_test.XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// ---------------------------------------------------------------------------
// Wire codec

std::string body_of(const std::string& frame) { return frame.substr(wire::kFrameHeaderBytes); }

TEST(StoreWire, EveryRequestSurvivesARoundTrip) {
  std::vector<wire::Request> requests;
  auto make = [](wire::Op op, std::vector<std::string> keys) {
    wire::Request r;
    r.op = op;
    r.keys = std::move(keys);
    return r;
  };
  auto set = make(wire::Op::kSet, {"key"});
  set.value = std::string("va\0lue", 6);
  requests.push_back(set);
  auto get = make(wire::Op::kGet, {"k"});
  get.timeout_ms = 1234;
  requests.push_back(get);
  auto wait = make(wire::Op::kWait, {"a", "", "c"});
  wait.timeout_ms = 99;
  requests.push_back(wait);
  auto add = make(wire::Op::kAdd, {"counter"});
  add.delta = -42;
  requests.push_back(add);
  requests.push_back(make(wire::Op::kCheck, {"x", "y"}));
  requests.push_back(make(wire::Op::kDelete, {"gone"}));
  auto cas = make(wire::Op::kCompareSet, {"c"});
  cas.value = "old";
  cas.desired = "new";
  requests.push_back(cas);

  for (const auto& request : requests) {
    std::string frame = wire::encode_request(request);
    std::string error;
    auto length = wire::decode_frame_length(frame.substr(0, 4), 1 << 20, &error);
    ASSERT_TRUE(length) << error;
    EXPECT_EQ(*length, frame.size() - 4);
    auto decoded = wire::decode_request(body_of(frame), &error);
    ASSERT_TRUE(decoded) << wire::op_name(request.op) << ": " << error;
    EXPECT_EQ(decoded->op, request.op);
    EXPECT_EQ(decoded->keys, request.keys);
    EXPECT_EQ(decoded->value, request.value);
    EXPECT_EQ(decoded->desired, request.desired);
    EXPECT_EQ(decoded->delta, request.delta);
    EXPECT_EQ(decoded->timeout_ms, request.timeout_ms);
  }
}

TEST(StoreWire, ResponseSurvivesARoundTrip) {
  wire::Response response{wire::Status::kError, "why it failed", -7};
  std::string error;
  auto decoded = wire::decode_response(body_of(wire::encode_response(response)), &error);
  ASSERT_TRUE(decoded) << error;
  EXPECT_EQ(decoded->status, wire::Status::kError);
  EXPECT_EQ(decoded->text, "why it failed");
  EXPECT_EQ(decoded->number, -7);
}

TEST(StoreWire, EveryTruncationOfARequestIsRejected) {
  wire::Request cas;
  cas.op = wire::Op::kCompareSet;
  cas.keys = {"key"};
  cas.value = "expected";
  cas.desired = "desired";
  std::string body = body_of(wire::encode_request(cas));
  for (size_t cut = 0; cut < body.size(); ++cut) {
    std::string error;
    EXPECT_FALSE(wire::decode_request(body.substr(0, cut), &error)) << "cut at " << cut;
    EXPECT_FALSE(error.empty()) << "cut at " << cut;
  }
}

TEST(StoreWire, UnknownOpcodeIsRejected) {
  std::string error;
  EXPECT_FALSE(wire::decode_request(std::string("\x63", 1), &error));
  EXPECT_NE(error.find("unknown opcode 99"), std::string::npos) << error;
}

TEST(StoreWire, TrailingBytesAreRejected) {
  wire::Request del;
  del.op = wire::Op::kDelete;
  del.keys = {"k"};
  std::string error;
  EXPECT_FALSE(wire::decode_request(body_of(wire::encode_request(del)) + "x", &error));
  EXPECT_NE(error.find("trailing"), std::string::npos) << error;
}

TEST(StoreWire, AKeyCountLargerThanTheBodyIsRejectedBeforeAllocating) {
  // check with a claimed 0xFFFFFFFF keys and no key bytes.
  std::string body("\x05\xff\xff\xff\xff", 5);
  std::string error;
  EXPECT_FALSE(wire::decode_request(body, &error));
  EXPECT_NE(error.find("key count 4294967295"), std::string::npos) << error;
}

TEST(StoreWire, AStringLongerThanTheBodyIsRejected) {
  std::string body("\x06\xff\xff\xff\x7f" "abc", 8);  // delete, key of 2 GiB claimed
  std::string error;
  EXPECT_FALSE(wire::decode_request(body, &error));
  EXPECT_NE(error.find("truncated field 'key'"), std::string::npos) << error;
}

TEST(StoreWire, FrameLengthsAboveTheLimitOrZeroAreRejected) {
  std::string error;
  EXPECT_FALSE(wire::decode_frame_length(std::string("\xff\xff\xff\xff", 4), 1024, &error));
  EXPECT_NE(error.find("4294967295 bytes exceeds the limit of 1024"), std::string::npos) << error;
  EXPECT_FALSE(wire::decode_frame_length(std::string(4, '\0'), 1024, &error));
  EXPECT_NE(error.find("length 0"), std::string::npos) << error;
  auto at_limit = wire::decode_frame_length(std::string("\x00\x04\x00\x00", 4), 1024, &error);
  ASSERT_TRUE(at_limit);
  EXPECT_EQ(*at_limit, 1024u);
}

TEST(StoreWire, UnknownResponseStatusIsRejected) {
  std::string body = body_of(wire::encode_response({}));
  body[0] = 9;
  std::string error;
  EXPECT_FALSE(wire::decode_response(body, &error));
  EXPECT_NE(error.find("unknown response status 9"), std::string::npos) << error;
}

// ---------------------------------------------------------------------------
// Behaviour shared by every store

enum class Kind { kMemory, kFile, kTcp, kPrefixedMemory, kPrefixedTcp };

std::string kind_name(Kind kind) {
  switch (kind) {
    case Kind::kMemory: return "Memory";
    case Kind::kFile: return "File";
    case Kind::kTcp: return "Tcp";
    case Kind::kPrefixedMemory: return "PrefixedMemory";
    case Kind::kPrefixedTcp: return "PrefixedTcp";
  }
  return "?";
}

class EveryStore : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    if (GetParam() == Kind::kTcp || GetParam() == Kind::kPrefixedTcp) {
      server_ = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
    }
    store_ = make_client();
  }

  // Another handle on the same data (for TCP, another connection).
  std::shared_ptr<Store> make_client() {
    switch (GetParam()) {
      case Kind::kMemory:
        if (!memory_) memory_ = make_memory_store();
        return memory_;
      case Kind::kFile: return make_file_store(dir_.path());
      case Kind::kTcp: return connect_tcp_store("127.0.0.1", server_->port(), 2s);
      case Kind::kPrefixedMemory:
        if (!memory_) memory_ = make_memory_store();
        return make_prefix_store("job", memory_);
      case Kind::kPrefixedTcp:
        return make_prefix_store("job", connect_tcp_store("127.0.0.1", server_->port(), 2s));
    }
    return nullptr;
  }

  TempDir dir_;
  std::unique_ptr<TcpStoreServer> server_;
  std::shared_ptr<Store> memory_;
  std::shared_ptr<Store> store_;
};

TEST_P(EveryStore, GetReturnsWhatSetStored) {
  store_->set("plain", "value");
  store_->set("binary", std::string("a\0b\xff", 4));
  store_->set("empty", "");
  EXPECT_EQ(store_->get("plain", 1s), "value");
  EXPECT_EQ(store_->get("binary", 1s), std::string("a\0b\xff", 4));
  EXPECT_EQ(store_->get("empty", 1s), "");
  store_->set("plain", "overwritten");
  EXPECT_EQ(store_->get("plain", 1s), "overwritten");
}

TEST_P(EveryStore, GetWaitsForAKeySetLaterByAnotherClient) {
  auto other = make_client();
  auto setter = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(100ms);
    other->set("late", "arrived");
  });
  auto start = Clock::now();
  EXPECT_EQ(store_->get("late", 5s), "arrived");
  EXPECT_GE(elapsed_ms(start), 90);
  setter.get();
}

// store.h: every store is safe from several threads. One client, two
// threads: a set must not queue behind the other thread's blocking get on
// the same client (it would only run once the get timed out).
TEST_P(EveryStore, ASetFromAnotherThreadOfTheSameClientEndsABlockingGet) {
  auto setter = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(100ms);
    store_->set("same_client", "arrived");
    return store_->add("counter", 1);  // and more calls while the get may still run
  });
  auto start = Clock::now();
  EXPECT_EQ(store_->get("same_client", 5s), "arrived");
  EXPECT_LT(elapsed_ms(start), 2000);
  EXPECT_EQ(setter.get(), 1);
  EXPECT_EQ(store_->add("counter", 1), 2);  // the client stays usable
}

TEST_P(EveryStore, GetTimesOutWithinASmallMarginNamingTheKey) {
  auto start = Clock::now();
  Error e = expect_error([&] { store_->get("never-set", 200ms); });
  int64_t waited = elapsed_ms(start);
  EXPECT_EQ(e.code(), ErrorCode::kTimeout) << e.what();
  EXPECT_GE(waited, 195);
  EXPECT_LT(waited, 700);
  EXPECT_NE(std::string(e.what()).find("never-set"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("200 ms"), std::string::npos) << e.what();
}

TEST_P(EveryStore, TheStoreStaysUsableAfterATimeout) {
  EXPECT_THROW(store_->get("missing", 100ms), Error);
  store_->set("after", "ok");
  EXPECT_EQ(store_->get("after", 1s), "ok");
  EXPECT_EQ(store_->add("after-counter", 2), 2);
}

TEST_P(EveryStore, WaitReturnsOnceEveryKeyExists) {
  auto other = make_client();
  store_->set("a", "1");
  auto setter = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(50ms);
    other->set("b", "2");
    std::this_thread::sleep_for(50ms);
    other->set("c", "3");
  });
  auto start = Clock::now();
  store_->wait({"a", "b", "c"}, 5s);
  EXPECT_GE(elapsed_ms(start), 90);
  EXPECT_TRUE(store_->check({"a", "b", "c"}));
  setter.get();
}

TEST_P(EveryStore, WaitTimesOutNamingTheKeys) {
  store_->set("present", "1");
  auto start = Clock::now();
  Error e = expect_error([&] { store_->wait({"present", "absent"}, 150ms); });
  int64_t waited = elapsed_ms(start);
  EXPECT_EQ(e.code(), ErrorCode::kTimeout) << e.what();
  EXPECT_GE(waited, 145);
  EXPECT_LT(waited, 650);
  // Only the absent key is named as missing (prefix stores name it in full).
  std::string message = e.what();
  auto missing = message.find("missing: '");
  ASSERT_NE(missing, std::string::npos) << message;
  EXPECT_NE(message.find("absent'", missing), std::string::npos) << message;
  EXPECT_EQ(message.find("present'", missing), std::string::npos) << message;
}

TEST_P(EveryStore, WaitOnNoKeysReturnsAtOnce) {
  store_->wait({}, 100ms);
  EXPECT_TRUE(store_->check({}));
}

TEST_P(EveryStore, AddCountsFromZeroAndReturnsTheNewValue) {
  EXPECT_EQ(store_->add("n", 5), 5);
  EXPECT_EQ(store_->add("n", -7), -2);
  EXPECT_EQ(store_->add("n", 0), -2);
  EXPECT_EQ(store_->get("n", 1s), "-2");
  store_->set("preset", "40");
  EXPECT_EQ(store_->add("preset", 2), 42);
}

TEST_P(EveryStore, AddOnANonIntegerIsAnInvalidArgument) {
  store_->set("text", "hello");
  Error e = expect_error([&] { store_->add("text", 1); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  EXPECT_NE(std::string(e.what()).find("text"), std::string::npos) << e.what();
  EXPECT_EQ(store_->get("text", 1s), "hello");
  store_->set("after", "ok");  // the connection is still in step
  EXPECT_EQ(store_->get("after", 1s), "ok");
}

TEST_P(EveryStore, CheckSaysWhetherEveryKeyExists) {
  EXPECT_FALSE(store_->check({"x"}));
  store_->set("x", "1");
  EXPECT_TRUE(store_->check({"x"}));
  EXPECT_FALSE(store_->check({"x", "y"}));
}

TEST_P(EveryStore, DeleteKeySaysWhetherTheKeyExisted) {
  store_->set("doomed", "1");
  EXPECT_TRUE(store_->delete_key("doomed"));
  EXPECT_FALSE(store_->check({"doomed"}));
  EXPECT_FALSE(store_->delete_key("doomed"));
  EXPECT_THROW(store_->get("doomed", 50ms), Error);
}

TEST_P(EveryStore, CompareSetFollowsC10dSemantics) {
  // Missing key, non-empty expected: nothing changes, `expected` comes back.
  EXPECT_EQ(store_->compare_set("k", "old", "new"), "old");
  EXPECT_FALSE(store_->check({"k"}));
  // Missing key, empty expected: the key is created.
  EXPECT_EQ(store_->compare_set("k", "", "first"), "first");
  EXPECT_EQ(store_->get("k", 1s), "first");
  // Mismatch: the current value comes back and stays.
  EXPECT_EQ(store_->compare_set("k", "wrong", "second"), "first");
  EXPECT_EQ(store_->get("k", 1s), "first");
  // Match: swapped.
  EXPECT_EQ(store_->compare_set("k", "first", "second"), "second");
  EXPECT_EQ(store_->get("k", 1s), "second");
}

TEST_P(EveryStore, CompareSetWakesAWaiter) {
  auto other = make_client();
  auto waiter = std::async(std::launch::async, [&] { return other->get("cas-key", 5s); });
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(store_->compare_set("cas-key", "", "made"), "made");
  EXPECT_EQ(waiter.get(), "made");
}

TEST_P(EveryStore, ConcurrentAddsFromManyThreadsAndClientsAreAllCounted) {
  constexpr int kThreads = 4;
  constexpr int kAddsPerThread = 50;
  std::vector<std::shared_ptr<Store>> clients;
  for (int t = 0; t < kThreads; ++t) clients.push_back(t % 2 == 0 ? store_ : make_client());
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAddsPerThread; ++i) clients[t]->add("shared-counter", 1);
      clients[t]->set("done/" + std::to_string(t), "1");
    });
  }
  for (auto& thread : threads) thread.join();
  store_->wait({"done/0", "done/1", "done/2", "done/3"}, 2s);
  EXPECT_EQ(store_->add("shared-counter", 0), kThreads * kAddsPerThread);
}

TEST_P(EveryStore, KeysWithSeparatorsAndOddBytesAreDistinct) {
  std::vector<std::string> keys = {"a/b", "a%2Fb", "../escape", ".", "", "sp ace", "\xc3\xa9t\xc3\xa9"};
  for (size_t i = 0; i < keys.size(); ++i) store_->set(keys[i], std::to_string(i));
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(store_->get(keys[i], 1s), std::to_string(i)) << keys[i];
}

INSTANTIATE_TEST_SUITE_P(Stores, EveryStore,
                         ::testing::Values(Kind::kMemory, Kind::kFile, Kind::kTcp, Kind::kPrefixedMemory,
                                         Kind::kPrefixedTcp),
                         [](const ::testing::TestParamInfo<Kind>& info) { return kind_name(info.param); });

// ---------------------------------------------------------------------------
// Prefix store

TEST(PrefixStore, PutsEveryKeyUnderThePrefixOfItsBase) {
  auto base = make_memory_store();
  auto job_a = make_prefix_store("a", base);
  auto job_b = make_prefix_store("b", base);
  job_a->set("k", "from a");
  job_b->set("k", "from b");
  EXPECT_EQ(base->get("a/k", 1s), "from a");
  EXPECT_EQ(base->get("b/k", 1s), "from b");
  EXPECT_EQ(job_a->add("n", 3), 3);
  EXPECT_EQ(base->get("a/n", 1s), "3");
  EXPECT_FALSE(base->check({"k"}));
  auto nested = make_prefix_store("child", job_a);
  nested->set("x", "1");
  EXPECT_TRUE(base->check({"a/child/x"}));
  Error e = expect_error([&] { job_a->get("absent", 50ms); });
  EXPECT_NE(std::string(e.what()).find("a/absent"), std::string::npos) << e.what();
}

TEST(PrefixStore, RejectsANullBase) {
  EXPECT_EQ(expect_error([] { make_prefix_store("p", nullptr); }).code(), ErrorCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// TCP store

TEST(TcpStore, AClientThatStartsBeforeTheServerConnectsOnceItIsUp) {
  const auto port = static_cast<uint16_t>(comms::testing::free_loopback_port());
  auto client = std::async(std::launch::async, [port] { return connect_tcp_store("127.0.0.1", port, 5s); });
  std::this_thread::sleep_for(300ms);
  TcpStoreServer server("127.0.0.1", port);
  auto store = client.get();
  store->set("k", "v");
  EXPECT_EQ(store->get("k", 1s), "v");
  EXPECT_EQ(server.key_count(), 1u);
}

TEST(TcpStore, ConnectingToNothingTimesOutNamingTheAddress) {
  const auto port = static_cast<uint16_t>(comms::testing::free_loopback_port());
  auto start = Clock::now();
  Error e = expect_error([&] { connect_tcp_store("127.0.0.1", port, 300ms); });
  int64_t waited = elapsed_ms(start);
  EXPECT_EQ(e.code(), ErrorCode::kTimeout) << e.what();
  EXPECT_GE(waited, 295);
  EXPECT_LT(waited, 1000);
  EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos) << e.what();
}

TEST(TcpStore, InvalidAddressesAreRejected) {
  EXPECT_EQ(expect_error([] { connect_tcp_store("", 1234, 100ms); }).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(expect_error([] { connect_tcp_store("127.0.0.1", 0, 100ms); }).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(expect_error([] { TcpStoreServer("no-such-host.invalid", 0); }).code(), ErrorCode::kInvalidArgument);
}

TEST(TcpStore, ServerReportsItsPortHostAndKeyCount) {
  TcpStoreServer server("127.0.0.1", 0);
  EXPECT_GT(server.port(), 0);
  EXPECT_EQ(server.host(), "127.0.0.1");
  auto store = connect_tcp_store("127.0.0.1", server.port(), 2s);
  store->set("a", "1");
  store->add("b", 1);
  EXPECT_EQ(server.key_count(), 2u);
  store->delete_key("a");
  EXPECT_EQ(server.key_count(), 1u);
}

TEST(TcpStore, ABusyPortIsAnError) {
  TcpStoreServer first("127.0.0.1", 0);
  Error e = expect_error([&] { TcpStoreServer second("127.0.0.1", first.port()); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find(std::to_string(first.port())), std::string::npos) << e.what();
}

TEST(TcpStore, ALostServerGivesPeerFailure) {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
  auto store = connect_tcp_store("127.0.0.1", server->port(), 2s);
  store->set("k", "v");
  server.reset();
  Error e = expect_error([&] { store->get("k", 1s); });
  EXPECT_EQ(e.code(), ErrorCode::kPeerFailure) << e.what();
  EXPECT_NE(std::string(e.what()).find("127.0.0.1"), std::string::npos) << e.what();
  // And it stays failed rather than hanging or pretending.
  EXPECT_EQ(expect_error([&] { store->set("k", "v"); }).code(), ErrorCode::kPeerFailure);
}

TEST(TcpStore, ABlockedGetFailsPromptlyWhenTheServerGoes) {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
  auto store = connect_tcp_store("127.0.0.1", server->port(), 2s);
  auto start = Clock::now();
  auto blocked = std::async(std::launch::async, [&] {
    return expect_error([&] { store->get("never", 10s); });
  });
  std::this_thread::sleep_for(150ms);
  server.reset();
  Error e = blocked.get();
  EXPECT_EQ(e.code(), ErrorCode::kPeerFailure) << e.what();
  EXPECT_LT(elapsed_ms(start), 3000);
}

TEST(TcpStore, ManyBlockedClientsAreReleasedByOneSet) {
  TcpStoreServer server("127.0.0.1", 0);
  constexpr int kClients = 6;
  std::vector<std::future<std::string>> getters;
  for (int i = 0; i < kClients; ++i) {
    getters.push_back(std::async(std::launch::async, [&server] {
      auto client = connect_tcp_store("127.0.0.1", server.port(), 2s);
      return client->get("go", 5s);
    }));
  }
  std::this_thread::sleep_for(100ms);
  connect_tcp_store("127.0.0.1", server.port(), 2s)->set("go", "now");
  for (auto& getter : getters) EXPECT_EQ(getter.get(), "now");
}

TEST(TcpStore, ATimedOutWaiterDoesNotReceiveALaterValue) {
  TcpStoreServer server("127.0.0.1", 0);
  auto store = connect_tcp_store("127.0.0.1", server.port(), 2s);
  EXPECT_THROW(store->get("late", 100ms), Error);
  store->set("late", "value");
  // Had the server answered the expired get too, this reply would be out of step.
  EXPECT_EQ(store->get("late", 1s), "value");
  EXPECT_EQ(store->add("n", 1), 1);
}

TEST(TcpStore, KnowsTheLocalAddressOfItsConnection) {
  TcpStoreServer server("127.0.0.1", 0);
  auto store = connect_tcp_store("127.0.0.1", server.port(), 2s);
  EXPECT_EQ(tcp_store_local_address(*store), "127.0.0.1");
  EXPECT_EQ(tcp_store_local_address(*make_prefix_store("p", store)), "127.0.0.1");
  EXPECT_EQ(tcp_store_local_address(*make_memory_store()), "");
}

// Completes the handshake (server without a token) on a raw socket, as the
// library's client would, so that what follows is read as requests.
void handshake(asio::ip::tcp::socket& socket) {
  auto read_frame = [&] {
    std::array<char, 4> header{};
    asio::read(socket, asio::buffer(header));
    std::string error;
    auto length = wire::decode_frame_length(std::string_view(header.data(), 4), 1 << 20, &error);
    std::string body(length.value_or(0), '\0');
    asio::read(socket, asio::buffer(body));
    return body;
  };
  std::string error;
  ASSERT_TRUE(wire::decode_hello(read_frame(), &error)) << error;
  asio::write(socket, asio::buffer(wire::encode_auth({std::string(32, 'n'), ""})));
  auto answer = wire::decode_response(read_frame(), &error);
  ASSERT_TRUE(answer) << error;
  ASSERT_EQ(answer->status, wire::Status::kOk) << answer->text;
}

// Sends raw bytes to the server after the handshake and says whether it then
// closed the connection (as opposed to leaving it open or answering).
bool server_closes_after(uint16_t port, const std::string& bytes) {
  asio::io_context io;
  asio::ip::tcp::socket socket(io);
  socket.connect({asio::ip::make_address("127.0.0.1"), port});
  handshake(socket);
  asio::write(socket, asio::buffer(bytes));
  char byte;
  asio::error_code ec;
  bool closed = false;
  socket.async_read_some(asio::buffer(&byte, 1), [&](const asio::error_code& e, size_t n) {
    closed = (e == asio::error::eof || e == asio::error::connection_reset) && n == 0;
  });
  io.run_for(2s);  // the read is cancelled if nothing happens by then
  return closed;
}

TEST(TcpStore, MalformedFramesCloseOnlyThatConnection) {
  TcpStoreServer server("127.0.0.1", 0, /*max_frame_bytes=*/4096);
  auto good = connect_tcp_store("127.0.0.1", server.port(), 2s);
  good->set("before", "1");

  EXPECT_TRUE(server_closes_after(server.port(), std::string("\xff\xff\xff\xff", 4))) << "oversized length";
  EXPECT_TRUE(server_closes_after(server.port(), std::string("\x01\x10\x00\x00", 4))) << "just over the limit";
  EXPECT_TRUE(server_closes_after(server.port(), std::string("\x00\x00\x00\x00", 4))) << "empty frame";
  EXPECT_TRUE(server_closes_after(server.port(), std::string("\x03\x00\x00\x00\x63zz", 7))) << "unknown opcode";
  EXPECT_TRUE(server_closes_after(server.port(), std::string("\x05\x00\x00\x00\x06\x09\x00\x00\x00", 9)))
      << "truncated key";
  EXPECT_TRUE(server_closes_after(server.port(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n")) << "HTTP";

  // Everyone else is still served, and nothing was stored by the garbage.
  good->set("after", "2");
  EXPECT_EQ(good->get("before", 1s), "1");
  EXPECT_EQ(connect_tcp_store("127.0.0.1", server.port(), 2s)->get("after", 1s), "2");
  EXPECT_EQ(server.key_count(), 2u);
}

TEST(TcpStore, AValueOverTheFrameLimitLosesOnlyThatClient) {
  TcpStoreServer server("127.0.0.1", 0, /*max_frame_bytes=*/1024);
  auto big = connect_tcp_store("127.0.0.1", server.port(), 2s);
  auto small = connect_tcp_store("127.0.0.1", server.port(), 2s);
  Error e = expect_error([&] { big->set("big", std::string(4096, 'x')); });
  EXPECT_EQ(e.code(), ErrorCode::kPeerFailure) << e.what();
  small->set("small", "fits");
  EXPECT_EQ(small->get("small", 1s), "fits");
  EXPECT_FALSE(small->check({"big"}));
}

TEST(TcpStore, AClientThatVanishesWhileBlockedDoesNotDisturbTheServer) {
  TcpStoreServer server("127.0.0.1", 0);
  {
    asio::io_context io;
    asio::ip::tcp::socket socket(io);
    socket.connect({asio::ip::make_address("127.0.0.1"), server.port()});
    handshake(socket);
    wire::Request get;
    get.op = wire::Op::kGet;
    get.keys = {"k"};
    get.timeout_ms = 100;
    asio::write(socket, asio::buffer(wire::encode_request(get)));
  }  // closed before the reply
  std::this_thread::sleep_for(200ms);  // the server's reply now hits a closed socket
  auto store = connect_tcp_store("127.0.0.1", server.port(), 2s);
  store->set("k", "v");
  EXPECT_EQ(store->get("k", 1s), "v");
}

// ---------------------------------------------------------------------------
// File store

TEST(FileStore, CreatesAMissingDirectory) {
  TempDir dir;
  std::string nested = dir.path() + "/a/b/c";
  auto store = make_file_store(nested);
  store->set("k", "v");
  EXPECT_TRUE(std::filesystem::is_directory(nested));
  EXPECT_EQ(make_file_store(nested)->get("k", 1s), "v");
}

TEST(FileStore, KeepsEveryKeyInsideItsDirectory) {
  TempDir dir;
  auto store = make_file_store(dir.path() + "/store");
  store->set("../../escape", "1");
  store->set("/abs", "2");
  store->add("x/y", 1);
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_EQ(entry.path().filename(), "store") << "stray file " << entry.path();
  }
  for (const auto& entry : std::filesystem::directory_iterator(dir.path() + "/store")) {
    std::string name = entry.path().filename();
    EXPECT_TRUE(name == ".lock" || name.rfind("k_", 0) == 0) << "unexpected file " << name;
  }
}

TEST(FileStore, TooLongKeysAreAnInvalidArgument) {
  TempDir dir;
  auto store = make_file_store(dir.path());
  Error e = expect_error([&] { store->set(std::string(300, 'k'), "v"); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
}

TEST(FileStore, AnEmptyDirectoryIsAnInvalidArgument) {
  EXPECT_EQ(expect_error([] { make_file_store(""); }).code(), ErrorCode::kInvalidArgument);
}

TEST(FileStore, TwoProcessesShareKeysAndCountTogether) {
  TempDir dir;
  constexpr int kAddsEach = 100;
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int code = 0;
    try {
      auto store = make_file_store(dir.path());
      for (int i = 0; i < kAddsEach; ++i) store->add("counter", 1);
      store->set("child/done", "yes");
      if (store->get("parent/hello", 5s) != "from parent") code = 2;
    } catch (...) {
      code = 1;
    }
    ::_exit(code);
  }
  auto store = make_file_store(dir.path());
  store->set("parent/hello", "from parent");
  for (int i = 0; i < kAddsEach; ++i) store->add("counter", 1);
  EXPECT_EQ(store->get("child/done", 10s), "yes");
  EXPECT_EQ(store->add("counter", 0), 2 * kAddsEach);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace comms
