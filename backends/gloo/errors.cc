#include "errors.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cctype>

#include <gloo/common/error.h>
#include <gloo/common/logging.h>

#include "collectives.h"

namespace comms::gloo_backend {
namespace {

template <size_t N>
bool mentions(const std::string& what, const std::string_view (&texts)[N]) {
  for (auto t : texts) {
    if (what.find(t) != std::string::npos) return true;
  }
  return false;
}

ErrorCode code_of(cpu_algorithms::TransportError::Kind kind) {
  switch (kind) {
    case cpu_algorithms::TransportError::Kind::kTimeout: return ErrorCode::kTimeout;
    case cpu_algorithms::TransportError::Kind::kPeerFailure: return ErrorCode::kPeerFailure;
    case cpu_algorithms::TransportError::Kind::kAborted: return ErrorCode::kAborted;
  }
  return ErrorCode::kInternal;
}

}  // namespace

int peer_named_in(const std::string& message, const std::vector<std::pair<sockaddr_storage, int>>& peers) {
  // Gloo's tcp::Address::str() prints sin_port as stored, without ntohs:
  // port 60424 (0xec08) reads ":2284" on a little-endian host. That reading
  // first, for every peer, then the converted one (a Gloo that converts).
  for (const bool as_stored : {true, false}) {
    for (const auto& [ep, rank] : peers) {
      char host[INET6_ADDRSTRLEN] = {};
      uint16_t port = 0;
      if (ep.ss_family == AF_INET) {
        const auto& a = reinterpret_cast<const sockaddr_in&>(ep);
        inet_ntop(AF_INET, &a.sin_addr, host, sizeof host);
        port = a.sin_port;
      } else if (ep.ss_family == AF_INET6) {
        const auto& a = reinterpret_cast<const sockaddr_in6&>(ep);
        inet_ntop(AF_INET6, &a.sin6_addr, host, sizeof host);
        port = a.sin6_port;
      } else {
        continue;
      }
      const std::string named = "[" + std::string(host) + "]:" + std::to_string(as_stored ? port : ntohs(port));
      for (size_t at = message.find(named); at != std::string::npos; at = message.find(named, at + 1)) {
        const size_t end = at + named.size();  // ":4242" must not match ":42421"
        if (end == message.size() || !std::isdigit(static_cast<unsigned char>(message[end]))) return rank;
      }
    }
  }
  return -1;
}

Status classify_error(const std::exception& e, const ErrorContext& ctx) {
  const std::string what = e.what();
  if (const auto* m = dynamic_cast<const cpu_algorithms::CountMismatch*>(&e)) {
    return {ErrorCode::kInvalidArgument, what, m->peer()};
  }
  if (const auto* t = dynamic_cast<const cpu_algorithms::TransportError*>(&e)) {
    const int peer = t->peer() >= 0 ? t->peer() : ctx.peer;
    if (ctx.aborted || t->kind() == cpu_algorithms::TransportError::Kind::kAborted) {
      return {ErrorCode::kAborted, "aborted: " + ctx.abort_reason + " (" + what + ")", peer};
    }
    return {code_of(t->kind()), what, peer};
  }
  const int peer = ctx.peer >= 0 ? ctx.peer : ctx.peers ? peer_named_in(what, *ctx.peers) : -1;
  if (ctx.aborted) return {ErrorCode::kAborted, "aborted: " + ctx.abort_reason + " (" + what + ")", peer};
  if (const auto* c = dynamic_cast<const Error*>(&e)) return {c->code(), what, peer};
  const bool timed_out = ctx.timeout.count() > 0 && ctx.elapsed >= ctx.timeout;
  if (dynamic_cast<const ::gloo::IoException*>(&e)) {
    // Fallback: outside an op (or a read that gave up early) only the text
    // says timeout.
    return {timed_out || mentions(what, kTimeoutTexts) ? ErrorCode::kTimeout : ErrorCode::kPeerFailure, what, peer};
  }
  // Gloo's GLOO_ENFORCE checks (EnforceNotMet) and anything else: internal,
  // unless the text names a timeout or a lost connection (the fallback;
  // libgloo reports some socket errors through its enforce checks).
  if (mentions(what, kTimeoutTexts)) return {ErrorCode::kTimeout, what, peer};
  if (mentions(what, kPeerGoneTexts)) return {ErrorCode::kPeerFailure, what, peer};
  return {ErrorCode::kInternal, what, peer};
}

}  // namespace comms::gloo_backend
