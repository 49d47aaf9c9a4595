// Finding the sockets behind Gloo's pairs. Gloo keeps its file descriptors
// private (and Debian's Gloo headers cannot declare its TCP pair); abort()
// shuts them down and the sync mesh spins on them, so both find them among
// the sockets this process opened while the mesh connected, by the pair's
// address (its connection's local end).
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

namespace comms::gloo_backend {

bool same_endpoint(const sockaddr_storage& a, const sockaddr_storage& b);

// A socket and both its ends, as seen when it was found.
struct FoundSocket {
  int fd = -1;
  sockaddr_storage local{}, remote{};
};

// The sockets among `opened` (those a mesh's connect opened) whose local
// address is one of `locals`, each with the index of that address. Once
// connected, a Gloo pair's address is its connection's local end on either
// side (tcp::Pair::handleConnected takes it from getsockname), so this finds
// the accepting and the connecting side alike. Only the sockets this
// connect opened are candidates: an accepted connection keeps the address
// of the pair's closed listener, which a later listener of any comm in the
// process may get.
std::vector<std::pair<FoundSocket, size_t>> sockets_bound_to(const std::set<int>& opened,
                                                             const std::vector<sockaddr_storage>& locals);

// Whether s.fd is still that socket (a closed descriptor's number is reused).
bool still_the_same(const FoundSocket& s);

// The descriptors of this process that are sockets, each with its socket's
// inode: a number closed and reused in between (another comm's pair, closed
// by Gloo's device thread once its peer went) is another socket.
using SocketFds = std::map<int, uint64_t>;
SocketFds socket_fds();

// The sockets opened since `before`, reused numbers included.
std::set<int> sockets_opened_since(const SocketFds& before);

// Gloo opens its sockets without close-on-exec, so a program a rank runs
// would hold the rank's connections open after the rank died and its peers
// would not see it go. Marks every socket opened since `before` (taken just
// ahead of Gloo's connect) close-on-exec.
void set_cloexec_on_sockets_since(const SocketFds& before);

}  // namespace comms::gloo_backend
