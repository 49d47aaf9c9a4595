// The ranks' MASTER_PORT: a port that nothing of ours listens on, left to
// the program's own rendezvous (rank 0 of a torch program hosts torch's
// TCPStore there, as under torchrun); commsrun's store is announced in
// COMMS_STORE. Node 0 picks a free port and publishes it in its store; the
// other nodes read it from there, so that every rank sees the same one.
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "comms/error.h"
#include "comms/store.h"
#include "launcher.h"
#include "util/strutil.h"

namespace commsrun {

namespace str = comms::str;

namespace {

constexpr const char* kMasterPortKey = "commsrun/master_port";
// How long a node other than 0 waits for node 0's store: as long as a rank
// waits for its rendezvous by default (COMMS_INIT_TIMEOUT's 5m).
constexpr auto kJoinTimeout = std::chrono::minutes(5);

// A port the kernel gives a socket bound to `host`, port 0, free a moment
// ago (the socket is closed again: the program binds it). 0 with `why` set
// when no address of `host` can be bound.
uint16_t free_port_on(const std::string& host, std::string* why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), "0", &hints, &found); rc != 0) {
    *why = str::cat("cannot resolve ", host, ": ", ::gai_strerror(rc));
    return 0;
  }
  uint16_t port = 0;
  for (addrinfo* a = found; a != nullptr && port == 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    sockaddr_storage bound{};
    socklen_t length = sizeof(bound);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) == 0) {
      port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    } else {
      *why = str::cat("cannot bind ", host, ": ", std::strerror(errno));
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return port;
}

}  // namespace

std::optional<uint16_t> Launcher::choose_master_port(uint16_t store_port) {
  if (options_.node_rank == 0) {
    std::string why;
    const uint16_t port = free_port_on(options_.master_addr, &why);
    if (port == 0) {
      say(str::cat("error: no free port for MASTER_PORT: ", why));
      return std::nullopt;
    }
    if (options_.nnodes == 1) return port;
    try {
      comms::connect_tcp_store(options_.master_addr, store_port, std::chrono::seconds(5), options_.store_token)
          ->set(kMasterPortKey, std::to_string(port));
    } catch (const comms::Error& e) {
      say(str::cat("error: cannot publish MASTER_PORT in the store: ", e.what()));
      return std::nullopt;
    }
    return port;
  }
  // In slices, so that a signal still ends the wait for node 0.
  const auto deadline = Clock::now() + kJoinTimeout;
  std::string last_error;
  while (Clock::now() < deadline) {
    try {
      auto store =
          comms::connect_tcp_store(options_.master_addr, store_port, std::chrono::seconds(1), options_.store_token);
      int port = 0;
      const std::string text = store->get(kMasterPortKey, std::chrono::seconds(30));
      if (!str::parse_int(text, &port) || port <= 0 || port > 65535) {
        say(str::cat("error: node 0 published MASTER_PORT '", text, "', not a port"));
        return std::nullopt;
      }
      return static_cast<uint16_t>(port);
    } catch (const comms::Error& e) {
      if (e.code() != comms::ErrorCode::kTimeout) {
        say(str::cat("error: cannot read MASTER_PORT from node 0's store: ", e.what()));
        return std::nullopt;
      }
      last_error = e.what();
    }
    if (int sig = pending_stop_signal()) {
      say(str::cat("received ", signal_name(sig), " while waiting for node 0's store"));
      exit_code_ = 128 + sig;
      return std::nullopt;
    }
  }
  say(str::cat("error: node 0's store at ", options_.master_addr, ":", store_port, " did not answer within ",
               std::chrono::duration_cast<std::chrono::seconds>(kJoinTimeout).count(), " s: ", last_error));
  return std::nullopt;
}

}  // namespace commsrun
