#include "sockets.h"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace comms::gloo_backend {

bool same_endpoint(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    auto& x = reinterpret_cast<const sockaddr_in&>(a);
    auto& y = reinterpret_cast<const sockaddr_in&>(b);
    return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    auto& x = reinterpret_cast<const sockaddr_in6&>(a);
    auto& y = reinterpret_cast<const sockaddr_in6&>(b);
    return x.sin6_port == y.sin6_port && std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof x.sin6_addr) == 0;
  }
  return false;
}

namespace {
bool ends_of(int fd, sockaddr_storage* local, sockaddr_storage* remote) {
  socklen_t a = sizeof *local, b = sizeof *remote;
  return getsockname(fd, reinterpret_cast<sockaddr*>(local), &a) == 0 &&
         getpeername(fd, reinterpret_cast<sockaddr*>(remote), &b) == 0;
}
}  // namespace

std::vector<std::pair<FoundSocket, size_t>> sockets_bound_to(const std::set<int>& opened,
                                                             const std::vector<sockaddr_storage>& locals) {
  std::vector<std::pair<FoundSocket, size_t>> out;
  for (int fd : opened) {
    FoundSocket s{fd, {}, {}};
    if (!ends_of(fd, &s.local, &s.remote)) continue;
    for (size_t i = 0; i < locals.size(); ++i) {
      if (same_endpoint(s.local, locals[i])) {
        out.emplace_back(s, i);
        break;
      }
    }
  }
  return out;
}

bool still_the_same(const FoundSocket& s) {
  sockaddr_storage local{}, remote{};
  return s.fd >= 0 && ends_of(s.fd, &local, &remote) && same_endpoint(local, s.local) &&
         same_endpoint(remote, s.remote);
}

SocketFds socket_fds() {
  SocketFds out;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return out;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    // The link's text ("socket:[inode]"), not fstat(fd): the descriptor may
    // belong to another thread that is closing it (Gloo's pairs), and
    // reading it would race with that close (TSan reported it).
    char target[64] = {};
    const ssize_t n = readlinkat(dirfd(dir), e->d_name, target, sizeof target - 1);
    if (n <= 0 || std::strncmp(target, "socket:[", 8) != 0) continue;
    out[static_cast<int>(fd)] = std::strtoull(target + 8, nullptr, 10);
  }
  closedir(dir);
  return out;
}

std::set<int> sockets_opened_since(const SocketFds& before) {
  std::set<int> out;
  for (const auto& [fd, inode] : socket_fds()) {
    auto it = before.find(fd);
    if (it == before.end() || it->second != inode) out.insert(fd);
  }
  return out;
}

void set_cloexec_on_sockets_since(const SocketFds& before) {
  for (int fd : sockets_opened_since(before)) {
    const int flags = fcntl(fd, F_GETFD);
    if (flags >= 0 && !(flags & FD_CLOEXEC)) fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
  }
}

}  // namespace comms::gloo_backend
