#include "util/strutil.h"
#include "store_wire.h"

#include <cstring>


namespace comms::wire {
namespace {

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_string(std::string& out, std::string_view s) {
  put_u32(out, static_cast<uint32_t>(s.size()));
  out.append(s);
}

// Prepends the header once the body is complete.
std::string frame(std::string body) {
  std::string out;
  out.reserve(kFrameHeaderBytes + body.size());
  put_u32(out, static_cast<uint32_t>(body.size()));
  out += body;
  return out;
}

uint64_t load_le(std::string_view bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  }
  return v;
}

// Reads fields off a body; the first failure sticks and names the field.
class Reader {
 public:
  explicit Reader(std::string_view body) : rest_(body) {}

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  size_t remaining() const { return rest_.size(); }

  uint8_t u8(const char* field) {
    auto bytes = take(1, field);
    return bytes.empty() ? 0 : static_cast<uint8_t>(bytes[0]);
  }
  uint32_t u32(const char* field) { return static_cast<uint32_t>(load_le(take(4, field))); }
  uint64_t u64(const char* field) { return load_le(take(8, field)); }
  std::string string(const char* field) {
    uint32_t size = u32(field);
    return std::string(take(size, field));
  }

  void fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
  }

  void expect_end() {
    if (ok() && !rest_.empty()) fail(str::cat(rest_.size(), " trailing bytes after the last field"));
  }

 private:
  std::string_view take(size_t n, const char* field) {
    if (!ok()) return {};
    if (rest_.size() < n) {
      fail(str::cat("truncated field '", field, "': needs ", n, " bytes, ", rest_.size(), " left"));
      return {};
    }
    auto out = rest_.substr(0, n);
    rest_.remove_prefix(n);
    return out;
  }

  std::string_view rest_;
  std::string error_;
};

}  // namespace

std::string_view op_name(Op op) {
  switch (op) {
    case Op::kSet: return "set";
    case Op::kGet: return "get";
    case Op::kWait: return "wait";
    case Op::kAdd: return "add";
    case Op::kCheck: return "check";
    case Op::kDelete: return "delete_key";
    case Op::kCompareSet: return "compare_set";
  }
  return "unknown";
}

std::string encode_request(const Request& r) {
  std::string body;
  body.push_back(static_cast<char>(r.op));
  const std::string empty;
  const std::string& key = r.keys.empty() ? empty : r.keys.front();
  switch (r.op) {
    case Op::kSet:
      put_string(body, key);
      put_string(body, r.value);
      break;
    case Op::kGet:
      put_u64(body, r.timeout_ms);
      put_string(body, key);
      break;
    case Op::kWait:
      put_u64(body, r.timeout_ms);
      [[fallthrough]];
    case Op::kCheck:
      put_u32(body, static_cast<uint32_t>(r.keys.size()));
      for (const auto& k : r.keys) put_string(body, k);
      break;
    case Op::kAdd:
      put_string(body, key);
      put_u64(body, static_cast<uint64_t>(r.delta));
      break;
    case Op::kDelete:
      put_string(body, key);
      break;
    case Op::kCompareSet:
      put_string(body, key);
      put_string(body, r.value);
      put_string(body, r.desired);
      break;
  }
  return frame(std::move(body));
}

std::string encode_response(const Response& r) {
  std::string body;
  body.push_back(static_cast<char>(r.status));
  put_string(body, r.text);
  put_u64(body, static_cast<uint64_t>(r.number));
  return frame(std::move(body));
}

std::string encode_hello(const Hello& h) {
  std::string body;
  put_string(body, kProtocolMagic);
  body.push_back(static_cast<char>(h.token_required ? 1 : 0));
  put_string(body, h.nonce);
  return frame(std::move(body));
}

std::string encode_auth(const Auth& a) {
  std::string body;
  put_string(body, kProtocolMagic);
  put_string(body, a.nonce);
  put_string(body, a.proof);
  return frame(std::move(body));
}

std::optional<uint32_t> decode_frame_length(std::string_view header, size_t max_frame_bytes,
                                            std::string* error) {
  if (header.size() != kFrameHeaderBytes) {
    *error = str::cat("frame header has ", header.size(), " bytes, expected ", kFrameHeaderBytes);
    return std::nullopt;
  }
  uint64_t length = load_le(header);
  if (length == 0) {
    *error = "empty frame (length 0)";
    return std::nullopt;
  }
  if (length > max_frame_bytes) {
    *error = str::cat("frame of ", length, " bytes exceeds the limit of ", max_frame_bytes, " bytes");
    return std::nullopt;
  }
  return static_cast<uint32_t>(length);
}

std::optional<Request> decode_request(std::string_view body, std::string* error) {
  Reader in(body);
  Request r;
  uint8_t op = in.u8("opcode");
  if (!in.ok()) {
    *error = in.error();
    return std::nullopt;
  }
  auto read_keys = [&] {
    uint32_t count = in.u32("key count");
    // Each key needs at least its 4-byte length: a larger count is a lie, and
    // rejecting it here keeps a hostile count from sizing an allocation.
    if (in.ok() && count > in.remaining() / 4) {
      in.fail(str::cat("key count ", count, " does not fit in the ", in.remaining(), " bytes left"));
      return;
    }
    for (uint32_t i = 0; i < count && in.ok(); ++i) r.keys.push_back(in.string("key"));
  };
  switch (op) {
    case static_cast<uint8_t>(Op::kSet):
      r.keys.push_back(in.string("key"));
      r.value = in.string("value");
      break;
    case static_cast<uint8_t>(Op::kGet):
      r.timeout_ms = in.u64("timeout_ms");
      r.keys.push_back(in.string("key"));
      break;
    case static_cast<uint8_t>(Op::kWait):
      r.timeout_ms = in.u64("timeout_ms");
      read_keys();
      break;
    case static_cast<uint8_t>(Op::kCheck):
      read_keys();
      break;
    case static_cast<uint8_t>(Op::kAdd):
      r.keys.push_back(in.string("key"));
      r.delta = static_cast<int64_t>(in.u64("delta"));
      break;
    case static_cast<uint8_t>(Op::kDelete):
      r.keys.push_back(in.string("key"));
      break;
    case static_cast<uint8_t>(Op::kCompareSet):
      r.keys.push_back(in.string("key"));
      r.value = in.string("expected");
      r.desired = in.string("desired");
      break;
    default:
      *error = str::cat("unknown opcode ", static_cast<int>(op));
      return std::nullopt;
  }
  r.op = static_cast<Op>(op);
  in.expect_end();
  if (!in.ok()) {
    *error = str::cat(std::string(op_name(r.op)), " request: ", in.error());
    return std::nullopt;
  }
  return r;
}

std::optional<Response> decode_response(std::string_view body, std::string* error) {
  Reader in(body);
  Response r;
  uint8_t status = in.u8("status");
  if (in.ok() && status > static_cast<uint8_t>(Status::kError)) {
    *error = str::cat("unknown response status ", static_cast<int>(status));
    return std::nullopt;
  }
  r.status = static_cast<Status>(status);
  r.text = in.string("text");
  r.number = static_cast<int64_t>(in.u64("number"));
  in.expect_end();
  if (!in.ok()) {
    *error = str::cat("response: ", in.error());
    return std::nullopt;
  }
  return r;
}

namespace {

// Reads and checks the magic that opens Hello and Auth.
void expect_magic(Reader& in) {
  std::string magic = in.string("magic");
  if (in.ok() && magic != kProtocolMagic) {
    in.fail(str::cat("not the comms store protocol (expected '", kProtocolMagic, "')"));
  }
}

}  // namespace

std::optional<Hello> decode_hello(std::string_view body, std::string* error) {
  Reader in(body);
  Hello h;
  expect_magic(in);
  uint8_t flags = in.u8("flags");
  if (in.ok() && flags > 1) in.fail(str::cat("unknown hello flags ", static_cast<int>(flags)));
  h.token_required = flags == 1;
  h.nonce = in.string("nonce");
  in.expect_end();
  if (!in.ok()) {
    *error = str::cat("hello: ", in.error());
    return std::nullopt;
  }
  return h;
}

std::optional<Auth> decode_auth(std::string_view body, std::string* error) {
  Reader in(body);
  Auth a;
  expect_magic(in);
  a.nonce = in.string("nonce");
  a.proof = in.string("proof");
  in.expect_end();
  if (!in.ok()) {
    *error = str::cat("auth: ", in.error());
    return std::nullopt;
  }
  return a;
}

}  // namespace comms::wire
