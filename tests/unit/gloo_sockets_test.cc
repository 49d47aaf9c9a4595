// backends/gloo/sockets.h: a pair's socket is found only among the sockets
// its mesh's connect opened (an older socket with the same local address
// belongs to another comm), and abort() shuts a descriptor down only while
// it is still that socket.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include "sockets.h"

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
  const std::set<int> before = socket_fds();
  const auto [client, accepted] = l.connection();
  const std::set<int> opened = sockets_opened_since(before);
  EXPECT_EQ(opened, (std::set<int>{client, accepted}));

  // Both accepted ends have the listener's address as their local one.
  const auto found = sockets_bound_to(opened, {l.addr});
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].first.fd, accepted);
  EXPECT_EQ(found[0].second, 0u);
  EXPECT_TRUE(sockets_bound_to(socket_fds(), {l.addr}).size() == 2u) << "the test's premise: two sockets match";
  for (int fd : {older_client, older_accepted, client, accepted}) close(fd);
}

TEST(GlooSockets, ADescriptorNumberReusedByAnotherSocketIsNoLongerThatSocket) {
  Listener l;
  const std::set<int> before = socket_fds();
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

}  // namespace
}  // namespace comms::gloo_backend
