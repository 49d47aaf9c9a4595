// The one exception type of the public API, and the status value that crosses
// the plugin boundary (plugins never throw into libcomms).
#pragma once

#include "comms/export.h"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace comms {

enum class ErrorCode : uint8_t {
  kOk = 0,
  kInvalidArgument,  // bad input; nothing was sent and the comm stays usable
  kUnsupported,      // valid request this backend or build cannot do
  kTimeout,          // an op or init passed its timeout
  kPeerFailure,      // a peer died or closed its connection
  kAborted,          // abort() was called, or the comm failed earlier
  kNotFound,         // a plugin, key or device that does not exist
  kInternal,         // a bug or an unexpected failure of a lower layer
  kRevoked,          // the comm was revoked (comms/elastic.h): recover, then use the shrunk comm
};

constexpr std::string_view to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kPeerFailure: return "peer_failure";
    case ErrorCode::kAborted: return "aborted";
    case ErrorCode::kNotFound: return "not_found";
    case ErrorCode::kInternal: return "internal";
    case ErrorCode::kRevoked: return "revoked";
  }
  return "unknown";
}

// A result that plugins return instead of throwing. `peer` is the rank of the
// peer that caused a timeout or failure, when the backend knows it.
struct Status {
  ErrorCode code = ErrorCode::kOk;
  std::string message;
  int peer = -1;

  Status() = default;
  Status(ErrorCode c, std::string msg, int peer_rank = -1)
      : code(c), message(std::move(msg)), peer(peer_rank) {}
  static Status ok() { return {}; }
  bool is_ok() const { return code == ErrorCode::kOk; }
};

// Thrown by every public call. An op's error reads
//   "comms[world rank 0/2] all_reduce #3: timeout: <the backend's text> (peer rank 1)"
// (a Gloo read timeout: "... timeout: [...pair.cc:574] Read timeout [127.0.0.1]:9394
// (peer rank 1)"), and the parts are available separately for programs that
// branch on them: comm() "world", op() "all_reduce", seq() 3, rank() 0,
// peer() 1. Errors of new_comm's checks before any backend exists (bad
// hints, timeouts, bootstrap) have op() "new_comm"; errors of comms::dist
// group creation have op() "new_group" and comm() the group's name; both
// have seq() 0, and rank() is this process's rank in the comm (new_comm) or
// in the world (groups).
class COMMS_API Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  Error(ErrorCode code, const std::string& message, std::string comm,
        std::string op, uint64_t seq, int rank, int peer = -1)
      : std::runtime_error(message),
        code_(code),
        comm_(std::move(comm)),
        op_(std::move(op)),
        seq_(seq),
        rank_(rank),
        peer_(peer) {}

  ErrorCode code() const { return code_; }
  const std::string& comm() const { return comm_; }  // empty when not about a comm
  const std::string& op() const { return op_; }      // empty when not about an op
  uint64_t seq() const { return seq_; }              // 0 when not about an op
  int rank() const { return rank_; }                 // -1 when unknown
  int peer() const { return peer_; }                 // -1 when unknown

 private:
  ErrorCode code_;
  std::string comm_;
  std::string op_;
  uint64_t seq_ = 0;
  int rank_ = -1;
  int peer_ = -1;
};

}  // namespace comms
