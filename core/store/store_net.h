// Socket helpers shared by the TCP store's server and client (Asio-based,
// so included only by their .cc files).
#pragma once

#include <sys/socket.h>

#include <cerrno>
#include <string>

#include "asio.hpp"
#include "util/strutil.h"

namespace comms::store_net {

inline std::string endpoint_text(const asio::ip::tcp::endpoint& endpoint) {
  const auto address = endpoint.address();
  if (address.is_v6()) return str::cat("[", address.to_string(), "]:", endpoint.port());
  return str::cat(address.to_string(), ":", endpoint.port());
}

inline std::string host_port(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return str::cat("[", host, "]:", port);
  return str::cat(host, ":", port);
}

// Opens a TCP socket that is close-on-exec from its first instant (Asio opens
// sockets without it, and a descriptor inherited across a fork+exec in
// another thread keeps the port or connection alive in the child) and hands
// it to `socket`, which must be closed.
template <typename Socket>
void open_cloexec(Socket& socket, const asio::ip::tcp& protocol, asio::error_code& ec) {
  int fd = ::socket(protocol.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, IPPROTO_TCP);
  if (fd < 0) {
    ec = asio::error_code(errno, asio::system_category());
    return;
  }
  socket.assign(protocol, fd, ec);
  if (ec) ::close(fd);
}

}  // namespace comms::store_net
