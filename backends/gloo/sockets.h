// Finding the sockets behind Gloo's pairs. Gloo keeps its file descriptors
// private; abort() shuts them down and the sync mesh spins on them, so both
// find them by the pair's local address among this process's descriptors.
#pragma once

#include <sys/socket.h>

#include <functional>
#include <set>
#include <vector>

namespace comms::gloo_backend {

bool same_endpoint(const sockaddr_storage& a, const sockaddr_storage& b);

// Calls fn(fd, index) for every socket of this process whose local address
// is locals[index].
void for_each_socket_bound_to(const std::vector<sockaddr_storage>& locals,
                              const std::function<void(int fd, size_t index)>& fn);

// The descriptors of this process that are sockets.
std::set<int> socket_fds();

// Gloo opens its sockets without close-on-exec, so a program a rank runs
// would hold the rank's connections open after the rank died and its peers
// would not see it go. Marks every socket opened since `before` (taken just
// ahead of Gloo's connect) close-on-exec.
void set_cloexec_on_sockets_since(const std::set<int>& before);

}  // namespace comms::gloo_backend
