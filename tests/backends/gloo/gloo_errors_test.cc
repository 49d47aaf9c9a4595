// How the Gloo backend turns libgloo's exceptions into statuses
// (backends/gloo/errors.h): by type first, by the op's elapsed time for
// timeouts, and by text only as the fallback. The last tests pin the texts
// the fallback relies on against the real libgloo, so a reworded libgloo
// fails here instead of quietly turning errors into `internal`.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>

#include "errors.h"
#include "collectives.h"  // CountMismatch; includes transport.h

namespace comms::gloo_backend {
namespace {

using namespace std::chrono_literals;

ErrorContext in_op(std::chrono::milliseconds elapsed, std::chrono::milliseconds timeout) {
  ErrorContext c;
  c.elapsed = elapsed;
  c.timeout = timeout;
  return c;
}

TEST(GlooErrors, AnIoErrorAfterTheOpRanItsTimeoutIsATimeoutWhateverItsText) {
  const ::gloo::IoException e("some reworded message");
  EXPECT_EQ(classify_error(e, in_op(1000ms, 1000ms)).code, ErrorCode::kTimeout);
  EXPECT_EQ(classify_error(e, in_op(10ms, 1000ms)).code, ErrorCode::kPeerFailure);
}

TEST(GlooErrors, AnEnforceCheckIsInternalAndAStatusOfTheTransportKeepsItsKindAndPeer) {
  const ::gloo::EnforceNotMet enforce("f.cc", 1, "x == y", "sizes differ");
  EXPECT_EQ(classify_error(enforce, in_op(10ms, 1000ms)).code, ErrorCode::kInternal);
  using Kind = cpu_algorithms::TransportError::Kind;
  const Status t = classify_error(cpu_algorithms::TransportError(Kind::kTimeout, 3, "x"), {});
  EXPECT_EQ(t.code, ErrorCode::kTimeout);
  EXPECT_EQ(t.peer, 3);
  EXPECT_EQ(classify_error(cpu_algorithms::TransportError(Kind::kPeerFailure, 1, "x"), {}).code,
            ErrorCode::kPeerFailure);
  ErrorContext aborted;
  aborted.aborted = true;
  aborted.abort_reason = "stop";
  const Status a = classify_error(::gloo::IoException("Connection closed by peer"), aborted);
  EXPECT_EQ(a.code, ErrorCode::kAborted);
  EXPECT_NE(a.message.find("stop"), std::string::npos) << a.message;
}

TEST(GlooErrors, ACountMismatchOfTheExchangeIsAnInvalidArgumentNamingThePeer) {
  const Status s = classify_error(cpu_algorithms::CountMismatch(2, "rank 0 expects 4096 bytes, rank 2 sent 4000"), {});
  EXPECT_EQ(s.code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(s.peer, 2);
  EXPECT_EQ(s.message, "rank 0 expects 4096 bytes, rank 2 sent 4000");
}

// Libgloo prints the port as stored, in network byte order (4242 = 0x1092
// reads 37392 on a little-endian host); a converted port is named too.
TEST(GlooErrors, TheMessageNamesThePeerByItsEndpoint) {
  sockaddr_storage ep{};
  auto& in4 = reinterpret_cast<sockaddr_in&>(ep);
  in4.sin_family = AF_INET;
  in4.sin_port = htons(4242);
  inet_pton(AF_INET, "127.0.0.1", &in4.sin_addr);
  const std::vector<std::pair<sockaddr_storage, int>> peers = {{ep, 2}};
  const std::string as_gloo_prints = "[127.0.0.1]:" + std::to_string(in4.sin_port);
  EXPECT_EQ(peer_named_in("Connection closed by peer " + as_gloo_prints, peers), 2);
  EXPECT_EQ(peer_named_in("Read error " + as_gloo_prints + ": Connection reset by peer", peers), 2);
  EXPECT_EQ(peer_named_in("Connection closed by peer [127.0.0.1]:4242", peers), 2);
  EXPECT_EQ(peer_named_in("Connection closed by peer [127.0.0.1]:4243", peers), -1);
  EXPECT_EQ(peer_named_in("Connection closed by peer [127.0.0.1]:42421", peers), -1);
  EXPECT_EQ(peer_named_in("Connection closed by peer [127.0.0.2]:4242", peers), -1);
}

// Two ranks of a real Gloo mesh in this process, over a HashStore.
struct Mesh {
  std::shared_ptr<::gloo::rendezvous::Context> ctx[2];
  explicit Mesh(std::chrono::milliseconds timeout) {
    ::gloo::rendezvous::HashStore store;
    ::gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto device = ::gloo::transport::tcp::CreateDevice(attr);
    std::thread other([&] {
      ctx[1] = std::make_shared<::gloo::rendezvous::Context>(1, 2);
      ctx[1]->setTimeout(timeout);
      ctx[1]->connectFullMesh(store, device);
    });
    ctx[0] = std::make_shared<::gloo::rendezvous::Context>(0, 2);
    ctx[0]->setTimeout(timeout);
    ctx[0]->connectFullMesh(store, device);
    other.join();
  }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ::gloo::IoException& e) {
    return e.what();
  }
  ADD_FAILURE() << "no gloo::IoException";
  return {};
}

// The fallback's first text: a read that runs out of time outside an op.
TEST(GlooErrors, LibglooSaysTimedOutWhenAReadRunsOutOfTime) {
  Mesh mesh(300ms);
  char byte = 0;
  auto recv = mesh.ctx[0]->getPair(1)->createRecvBuffer(0, &byte, 1);
  mesh.ctx[0]->getPair(1)->setSync(true, false);
  const std::string what = error_of([&] { recv->waitRecv(); });
  EXPECT_TRUE(std::any_of(std::begin(kTimeoutTexts), std::end(kTimeoutTexts),
                          [&](std::string_view t) { return what.find(t) != std::string::npos; }))
      << what;
  EXPECT_EQ(classify_error(::gloo::IoException(what), {}).code, ErrorCode::kTimeout);
}

// The fallback's second text and the endpoint the peer is found by.
// The backend records a peer by its connection's remote end, which is the
// peer pair's address (once connected, its local end): the text must name it.
TEST(GlooErrors, LibglooSaysClosedAndNamesThePeersEndpointWhenThePeerGoes) {
  Mesh mesh(10s);
  char byte = 0;
  auto recv = mesh.ctx[0]->getPair(1)->createRecvBuffer(0, &byte, 1);
  mesh.ctx[0]->getPair(1)->setSync(true, false);
  const std::vector<std::pair<sockaddr_storage, int>> peers = {
      {static_cast<const ::gloo::transport::tcp::Address&>(mesh.ctx[1]->getPair(0)->address()).getSockaddr(), 1}};
  mesh.ctx[1]->getPair(0)->close();
  mesh.ctx[1].reset();
  const std::string what = error_of([&] { recv->waitRecv(); });
  EXPECT_TRUE(std::any_of(std::begin(kPeerGoneTexts), std::end(kPeerGoneTexts),
                          [&](std::string_view t) { return what.find(t) != std::string::npos; }))
      << what;
  EXPECT_NE(what.find("[127.0.0.1]:"), std::string::npos) << what;
  EXPECT_EQ(peer_named_in(what, peers), 1) << what;
  ErrorContext ctx;
  ctx.peers = &peers;
  const Status s = classify_error(::gloo::EnforceNotMet("f", 1, "c", what), ctx);
  EXPECT_EQ(s.code, ErrorCode::kPeerFailure);
  EXPECT_EQ(s.peer, 1) << what;
}

}  // namespace
}  // namespace comms::gloo_backend
