#include "bind_address.h"
#include "text.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <vector>

namespace comms::gloo_backend {
namespace {

std::string address_text(const sockaddr* a) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a->sa_family == AF_INET) inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a)->sin_addr, buf, sizeof buf);
  else if (a->sa_family == AF_INET6) inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr, buf, sizeof buf);
  return buf;
}

// The value as a message shows it: control bytes as \xNN.
std::string shown(const std::string& value) {
  std::string out;
  for (unsigned char c : value) {
    if (c >= 0x20 && c != 0x7f) {
      out += static_cast<char>(c);
      continue;
    }
    static const char kHex[] = "0123456789abcdef";
    out += "\\x";
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

// A NUL would cut the value where getaddrinfo or Gloo's C strings see it
// (the check would pass on a prefix); other control bytes are in no host or
// interface name.
bool has_control_byte(const std::string& value) {
  for (unsigned char c : value) {
    if (c < 0x20 || c == 0x7f) return true;
  }
  return false;
}

bool is_loopback_v4(const sockaddr* a) {
  return a->sa_family == AF_INET &&
         (ntohl(reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr) >> 24) == 127;
}

bool same_address(const sockaddr* a, const sockaddr* b) {
  if (a->sa_family != b->sa_family) return false;
  if (a->sa_family == AF_INET) {
    return std::memcmp(&reinterpret_cast<const sockaddr_in*>(a)->sin_addr,
                       &reinterpret_cast<const sockaddr_in*>(b)->sin_addr, sizeof(in_addr)) == 0;
  }
  return a->sa_family == AF_INET6 &&
         std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                     &reinterpret_cast<const sockaddr_in6*>(b)->sin6_addr, sizeof(in6_addr)) == 0;
}

struct Interfaces {
  ifaddrs* list = nullptr;
  Interfaces() {
    if (getifaddrs(&list) != 0) list = nullptr;
  }
  ~Interfaces() {
    if (list) freeifaddrs(list);
  }
  Interfaces(const Interfaces&) = delete;
  Interfaces& operator=(const Interfaces&) = delete;

  // Gloo finds the interface of a bound address this way: the same address,
  // or any 127/8 address when the bound one is 127/8.
  bool owns(const sockaddr* a) const {
    for (const ifaddrs* i = list; i; i = i->ifa_next) {
      if (!i->ifa_addr) continue;
      if (same_address(i->ifa_addr, a) || (is_loopback_v4(a) && is_loopback_v4(i->ifa_addr))) return true;
    }
    return false;
  }

  std::string names() const {
    std::set<std::string> out;
    for (const ifaddrs* i = list; i; i = i->ifa_next) out.insert(i->ifa_name);
    std::string joined;
    for (const auto& n : out) joined.append(joined.empty() ? "" : ", ").append(n);
    return joined.empty() ? "none" : joined;
  }
};

}  // namespace

Status check_hostname(const std::string& hostname, const std::string& source) {
  const std::string named = cat({source, "='", shown(hostname), "'"});
  if (hostname.empty()) {
    return {ErrorCode::kInvalidArgument, cat({named, " is empty; give a host name or address of this host"})};
  }
  if (has_control_byte(hostname)) {
    return {ErrorCode::kInvalidArgument,
            cat({named, " contains a control character (a NUL, newline, ...); give a host name or address of this "
                 "host"})};
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const int rc = getaddrinfo(hostname.c_str(), nullptr, &hints, &result);
  if (rc != 0 || result == nullptr) {
    const std::string why = rc == EAI_SYSTEM ? std::strerror(errno) : gai_strerror(rc);
    if (result) freeaddrinfo(result);
    return {ErrorCode::kInvalidArgument,
            cat({named, " does not resolve (", why, "); use a host name or address of this host, or an interface "
                 "(COMMS_GLOO_IFNAME, hint gloo.interface)"})};
  }
  // As Gloo: the first address that binds is the one it uses.
  std::string tried, bind_error;
  const sockaddr* bound = nullptr;
  for (const addrinfo* ai = result; ai && !bound; ai = ai->ai_next) {
    tried.append(tried.empty() ? "" : ", ").append(address_text(ai->ai_addr));
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      bind_error = std::strerror(errno);
      continue;
    }
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0) bound = ai->ai_addr;
    else bind_error = std::strerror(errno);
    ::close(fd);
  }
  Status status;
  if (!bound) {
    status = {ErrorCode::kInvalidArgument,
              cat({named, " resolves to ", tried, ", which this host cannot bind (", bind_error,
                   "); use a host name or address of this host, or an interface (COMMS_GLOO_IFNAME, hint "
                   "gloo.interface)"})};
  } else if (!Interfaces().owns(bound)) {
    status = {ErrorCode::kInvalidArgument,
              cat({named, " resolves to ", address_text(bound),
                   ", which is no interface's address; Gloo binds one interface: use its address or name it "
                   "(COMMS_GLOO_IFNAME, hint gloo.interface)"})};
  }
  freeaddrinfo(result);
  return status;
}

Status check_interface(const std::string& interface, const std::string& source) {
  const std::string named = cat({source, "='", shown(interface), "'"});
  if (interface.empty()) {
    return {ErrorCode::kInvalidArgument, cat({named, " is empty; give the name of a network interface"})};
  }
  if (has_control_byte(interface)) {
    return {ErrorCode::kInvalidArgument,
            cat({named, " contains a control character (a NUL, newline, ...); give the name of a network "
                 "interface"})};
  }
  Interfaces ifs;
  if (!ifs.list) {
    return {ErrorCode::kInternal, cat({"getifaddrs failed while checking ", named, ": ", std::strerror(errno)})};
  }
  bool exists = false, up = false, has_ip = false;
  for (const ifaddrs* i = ifs.list; i; i = i->ifa_next) {
    if (interface != i->ifa_name) continue;
    exists = true;
    up = up || (i->ifa_flags & IFF_UP);
    has_ip = has_ip || (i->ifa_addr && (i->ifa_addr->sa_family == AF_INET || i->ifa_addr->sa_family == AF_INET6));
  }
  if (!exists) {
    return {ErrorCode::kInvalidArgument,
            cat({named, " is not a network interface of this host; its interfaces are ", ifs.names()})};
  }
  if (!has_ip) {
    return {ErrorCode::kInvalidArgument,
            cat({named, " has no IPv4 or IPv6 address; give it one, or choose another interface (",
                 ifs.names(), ")"})};
  }
  if (!up) {
    return {ErrorCode::kInvalidArgument, cat({named, " is down; bring it up, or choose another interface"})};
  }
  return {};
}

}  // namespace comms::gloo_backend
