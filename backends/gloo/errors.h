// Turning what libgloo throws into a comms status.
//
// By type first: comms::Error keeps its code; a TransportError from the CPU
// algorithms (gloo_transport.h) says timeout, peer failure or abort and the
// peer; gloo::IoException is a timeout when the op had run its whole
// timeout, else a peer failure; gloo::EnforceNotMet and other exceptions are
// internal. libgloo has no type for a timeout, and its I/O errors outside an
// op (connecting, with no op timeout to compare) are told apart only by
// their text: kTimeoutTexts and kPeerGoneTexts, the fallback, which
// tests/backends/gloo/gloo_errors_test.cc pins against the real libgloo so that a
// reworded message fails a test instead of turning into `internal`.
#pragma once

#include <chrono>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include <sys/socket.h>

#include "comms/error.h"

namespace comms::gloo_backend {

inline constexpr std::string_view kTimeoutTexts[] = {"Timed out", "timeout", "Timeout"};
inline constexpr std::string_view kPeerGoneTexts[] = {"closed", "reset", "Broken pipe", "Connection refused"};

struct ErrorContext {
  bool aborted = false;
  std::string abort_reason;
  // How long the op ran and its timeout; zero timeout: not in an op.
  std::chrono::milliseconds elapsed{0}, timeout{0};
  int peer = -1;  // the op's peer (send/recv), else -1: found from the message
  // Remote ends of the mesh's connections, for "[addr]:port" in Gloo's text.
  const std::vector<std::pair<sockaddr_storage, int>>* peers = nullptr;
};

Status classify_error(const std::exception& e, const ErrorContext& ctx);

// The rank whose endpoint "[<address>]:<port>" the message names, or -1.
// The port as Gloo prints it (in network byte order, unconverted) or
// converted.
int peer_named_in(const std::string& message, const std::vector<std::pair<sockaddr_storage, int>>& peers);

}  // namespace comms::gloo_backend
