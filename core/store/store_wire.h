// The TCP store's wire format, kept apart from the sockets so that it can be
// unit-tested byte by byte.
//
// Every message is a frame: a u32 body length (little endian) and the body.
// A request body is a u8 opcode and that op's fields; a response body is a u8
// status, a string and an i64. Strings are a u32 length and the bytes, i64 and
// u64 are 8 bytes little endian. Decoding never trusts a length: every field
// is checked against the bytes actually present before anything is allocated.
//
// A connection opens with a handshake (store_auth.h has the proofs):
//   server -> client  Hello: magic, u8 flags (bit 0: a token is required),
//                     string server nonce
//   client -> server  Auth: magic, string client nonce, string proof (empty
//                     without a token)
//   server -> client  Response: ok with the server's proof as text (empty
//                     without a token), or error with the reason, then close.
// Only then are requests served.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace comms::wire {

inline constexpr size_t kFrameHeaderBytes = 4;
// The start of every Hello and Auth body: tells a comms store from anything
// else listening on the port, and the protocol's version.
inline constexpr std::string_view kProtocolMagic = "comms-store/1";
// A handshake frame is small; the server reads no more before the client has
// authenticated.
inline constexpr size_t kHandshakeMaxFrameBytes = 1024;

enum class Op : uint8_t {
  kSet = 1,         // key, value
  kGet = 2,         // timeout_ms, key
  kWait = 3,        // timeout_ms, count, keys
  kAdd = 4,         // key, delta
  kCheck = 5,       // count, keys
  kDelete = 6,      // key
  kCompareSet = 7,  // key, expected, desired
};

struct Request {
  Op op = Op::kSet;
  std::vector<std::string> keys;  // exactly one for every op but wait and check
  std::string value;              // set: value; compare_set: expected
  std::string desired;            // compare_set only
  int64_t delta = 0;              // add only
  uint64_t timeout_ms = 0;        // get and wait only
};

enum class Status : uint8_t {
  kOk = 0,
  kTimeout = 1,  // get/wait: the keys did not appear before the deadline
  kError = 2,    // the request was well formed but failed; `text` says why
};

// `text` carries get's value, compare_set's result or an error message;
// `number` carries add's result and check/delete's boolean.
struct Response {
  Status status = Status::kOk;
  std::string text;
  int64_t number = 0;
};

struct Hello {
  bool token_required = false;
  std::string nonce;
};

struct Auth {
  std::string nonce;
  std::string proof;  // empty: the client has no token
};

// Whole frames: header and body.
std::string encode_request(const Request& request);
std::string encode_response(const Response& response);
std::string encode_hello(const Hello& hello);
std::string encode_auth(const Auth& auth);

// The body length announced by a frame header, or nullopt (with `error` set)
// when it is zero or above `max_frame_bytes`: the caller must not allocate it.
std::optional<uint32_t> decode_frame_length(std::string_view header, size_t max_frame_bytes,
                                            std::string* error);

// Bodies, without the header. nullopt (with `error` set) on an unknown opcode
// or status, a truncated field, or trailing bytes.
std::optional<Request> decode_request(std::string_view body, std::string* error);
std::optional<Response> decode_response(std::string_view body, std::string* error);
// nullopt (with `error` set) also when the magic is not kProtocolMagic.
std::optional<Hello> decode_hello(std::string_view body, std::string* error);
std::optional<Auth> decode_auth(std::string_view body, std::string* error);

std::string_view op_name(Op op);

}  // namespace comms::wire
