// backends/gloo/sockets.h: a pair's socket is found only among the sockets
// its mesh's connect opened (an older socket with the same local address
// belongs to another comm), on both sides of a real Gloo mesh, and abort()
// shuts a descriptor down only while it is still that socket.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include <memory>
#include <thread>
#include <vector>

#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>

#include "memory_store_for_tests.h"
#include "sockets.h"
#include "store_adapter.h"

namespace comms::gloo_backend {
namespace {

struct Listener {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_storage addr{};
  Listener() {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(listen(fd, 8), 0);
    socklen_t len = sizeof addr;
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  }
  ~Listener() { close(fd); }
  // A connection to this listener: {connecting end, accepted end}.
  std::pair<int, int> connection() const {
    const int c = socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_EQ(connect(c, reinterpret_cast<const sockaddr*>(&addr), sizeof(sockaddr_in)), 0);
    return {c, accept(fd, nullptr, nullptr)};
  }
};

TEST(GlooSockets, AnOlderSocketWithThePairsLocalAddressIsNotTakenForThePairs) {
  Listener l;
  const auto [older_client, older_accepted] = l.connection();  // another comm's connection
  const SocketFds before = socket_fds();
  const auto [client, accepted] = l.connection();
  const std::set<int> opened = sockets_opened_since(before);
  EXPECT_EQ(opened, (std::set<int>{client, accepted}));

  // Both accepted ends have the listener's address as their local one.
  const auto found = sockets_bound_to(opened, {l.addr});
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].first.fd, accepted);
  EXPECT_EQ(found[0].second, 0u);
  std::set<int> all;
  for (const auto& [fd, inode] : socket_fds()) all.insert(fd);
  EXPECT_TRUE(sockets_bound_to(all, {l.addr}).size() == 2u) << "the test's premise: two sockets match";
  for (int fd : {older_client, older_accepted, client, accepted}) close(fd);
}

TEST(GlooSockets, ADescriptorNumberReusedByAnotherSocketIsNoLongerThatSocket) {
  Listener l;
  const SocketFds before = socket_fds();
  auto [client, accepted] = l.connection();
  const auto found = sockets_bound_to(sockets_opened_since(before), {l.addr});
  ASSERT_EQ(found.size(), 1u);
  const FoundSocket pair_socket = found[0].first;
  EXPECT_TRUE(still_the_same(pair_socket));

  // The pair's socket closes and its number goes to a new connection.
  const auto [other_client, other_accepted] = l.connection();
  ASSERT_EQ(dup2(other_accepted, accepted), accepted);
  EXPECT_FALSE(still_the_same(pair_socket));
  close(accepted);
  EXPECT_FALSE(still_the_same(pair_socket));
  for (int fd : {client, other_client, other_accepted}) close(fd);
}

// Gloo's device thread closes a pair's socket when its peer goes, at any
// moment: a mesh connecting then may get that number for one of its own
// sockets, which is still a socket it opened (else abort() would miss it and
// a read on it would wait out the op's timeout).
TEST(GlooSockets, ASocketOpenedUnderANumberClosedSinceTheSnapshotCountsAsOpened) {
  Listener l;
  const auto [old_client, old_accepted] = l.connection();
  const SocketFds before = socket_fds();
  ASSERT_TRUE(before.count(old_accepted));
  close(old_accepted);
  const auto [client, accepted] = l.connection();  // the lowest free numbers: old_accepted's first
  ASSERT_TRUE(client == old_accepted || accepted == old_accepted) << "the test's premise: the number is reused";
  EXPECT_EQ(sockets_opened_since(before), (std::set<int>{client, accepted}));
  const auto found = sockets_bound_to(sockets_opened_since(before), {l.addr});
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].first.fd, accepted);
  for (int fd : {old_client, client, accepted}) close(fd);
}

// abort() and the sync mesh's spinning rely on it: in a real 3-rank mesh
// every rank finds one socket per peer by its pairs' addresses, whichever
// side of each pair connected, and the two sockets found for a pair are the
// two ends of one connection (Gloo resets a connected pair's address to its
// socket's local end on both sides). The peers' listen addresses read back
// in Gloo's own store format are those the connections were made to.
TEST(GlooSockets, EveryRankFindsItsSocketForEveryPeerOnBothSidesOfAGlooMesh) {
  constexpr int kSize = 3;
  comms::nccl::testing::MemoryStore store;
  ::gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = ::gloo::transport::tcp::CreateDevice(attr);
  const SocketFds before = socket_fds();
  std::vector<std::shared_ptr<::gloo::rendezvous::Context>> ctx(kSize);
  std::vector<std::vector<sockaddr_storage>> listened(kSize, std::vector<sockaddr_storage>(kSize));
  std::vector<std::thread> ranks;
  for (int r = 0; r < kSize; ++r) {
    ranks.emplace_back([&, r] {
      ctx[r] = std::make_shared<::gloo::rendezvous::Context>(r, kSize);
      ctx[r]->setTimeout(std::chrono::seconds(30));
      StoreAdapter adapter(store, "mesh/", std::chrono::seconds(30));
      ctx[r]->connectFullMesh(adapter, device);
      for (int p = 0; p < kSize; ++p) {
        if (p != r) listened[r][p] = adapter.pair_listen_address(p, r, kSize);  // p's pair for r
      }
    });
  }
  for (auto& t : ranks) t.join();
  const std::set<int> opened = sockets_opened_since(before);
  ASSERT_EQ(opened.size(), size_t{kSize * (kSize - 1)}) << "both ends of each pair's connection";

  std::vector<std::vector<FoundSocket>> found(kSize, std::vector<FoundSocket>(kSize));
  for (int r = 0; r < kSize; ++r) {
    std::vector<sockaddr_storage> locals;
    std::vector<int> peers;
    for (int p = 0; p < kSize; ++p) {
      if (p == r) continue;
      locals.push_back(static_cast<const ::gloo::transport::tcp::Address&>(ctx[r]->getPair(p)->address()).getSockaddr());
      peers.push_back(p);
    }
    for (const auto& [socket, i] : sockets_bound_to(opened, locals)) {
      EXPECT_EQ(found[r][peers[i]].fd, -1) << "rank " << r << " found two sockets for peer " << peers[i];
      found[r][peers[i]] = socket;
    }
  }
  for (int r = 0; r < kSize; ++r) {
    for (int p = r + 1; p < kSize; ++p) {
      const FoundSocket& a = found[r][p];
      const FoundSocket& b = found[p][r];
      ASSERT_NE(a.fd, -1) << "rank " << r << " found no socket for peer " << p;
      ASSERT_NE(b.fd, -1) << "rank " << p << " found no socket for peer " << r;
      EXPECT_TRUE(same_endpoint(a.local, b.remote) && same_endpoint(a.remote, b.local))
          << "ranks " << r << " and " << p << " found sockets of different connections";
      // The side that accepted kept its listen address; the other connected to it.
      const bool r_accepted = same_endpoint(a.local, listened[p][r]);
      const bool p_accepted = same_endpoint(b.local, listened[r][p]);
      EXPECT_NE(r_accepted, p_accepted) << "ranks " << r << " and " << p
                                        << ": the published addresses are not the connection's listening end";
    }
  }
  for (auto& c : ctx) c->closeConnections();
}

}  // namespace
}  // namespace comms::gloo_backend
