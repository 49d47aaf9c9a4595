// The TCP store's wire format (core/store/store_wire.h), as the server and client
// meet it. The first byte picks a mode:
//   0  a frame header of any length against a limit: the length decoded is
//      exactly the little-endian u32 when 1..limit, else rejected;
//   1  a server connection's byte stream: frames read as store_tcp.cc reads
//      them; every request accepted re-encodes to exactly the bytes received;
//   2  the same for a client reading responses;
//   3  encode -> decode round trip of a request and a response built from
//      the bytes: decode(encode(x)) == x.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "comms/store.h"
#include "fuzz_check.h"
#include "store/store_wire.h"
#include "util/strutil.h"

namespace {

using comms::wire::Op;
using comms::wire::Request;
using comms::wire::Response;
using comms::wire::Status;

uint32_t le32(std::string_view b) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(b[i])) << (8 * i);
  return v;
}

std::string framed(std::string_view body) {
  std::string out;
  const auto n = static_cast<uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out.append(body);
  return out;
}

bool ops_with_many_keys(Op op) { return op == Op::kWait || op == Op::kCheck; }

bool same(const Request& a, const Request& b) {
  return a.op == b.op && a.keys == b.keys && a.value == b.value && a.desired == b.desired &&
         a.delta == b.delta && a.timeout_ms == b.timeout_ms;
}

void frame_length(FuzzedDataProvider& in) {
  const size_t limit = in.ConsumeBool() ? comms::TcpStoreServer::kDefaultMaxFrameBytes : in.ConsumeIntegral<size_t>();
  const std::string header = in.ConsumeRemainingBytesAsString().substr(0, 8);
  std::string error;
  const auto length = comms::wire::decode_frame_length(header, limit, &error);
  if (header.size() != comms::wire::kFrameHeaderBytes) {
    FUZZ_CHECK(!length && !error.empty(), "a header of " + std::to_string(header.size()) + " bytes was accepted");
    return;
  }
  const uint32_t announced = le32(header);
  if (announced == 0 || announced > limit) {
    FUZZ_CHECK(!length, "length " + std::to_string(announced) + " accepted with limit " + std::to_string(limit));
    FUZZ_CHECK(!error.empty(), "rejected without a reason");
  } else {
    FUZZ_CHECK(length && *length == announced, "length " + std::to_string(announced) + " misread");
  }
}

// Splits `stream` into frames as a connection does: header, limit check,
// body; stops at the first rejected header or a truncated body.
template <class Decode>
void each_frame(std::string_view stream, Decode&& decode) {
  const size_t limit = 1 << 16;
  while (stream.size() >= comms::wire::kFrameHeaderBytes) {
    std::string error;
    const auto length = comms::wire::decode_frame_length(stream.substr(0, 4), limit, &error);
    if (!length) return;
    stream.remove_prefix(4);
    if (stream.size() < *length) return;
    const std::string_view body = stream.substr(0, *length);
    stream.remove_prefix(*length);
    if (!decode(body)) return;  // a bad body closes the connection
  }
}

void server_stream(std::string_view stream) {
  each_frame(stream, [](std::string_view body) {
    std::string error;
    const auto request = comms::wire::decode_request(body, &error);
    if (!request) {
      FUZZ_CHECK(!error.empty(), "a request was rejected without a reason");
      return false;
    }
    FUZZ_CHECK(ops_with_many_keys(request->op) || request->keys.size() == 1,
               "a single-key op decoded with " + std::to_string(request->keys.size()) + " keys");
    // Nothing is lost or invented: the canonical encoding is the input.
    FUZZ_CHECK(comms::wire::encode_request(*request) == framed(body),
               "re-encoding a decoded request gives other bytes");
    return true;
  });
}

void client_stream(std::string_view stream) {
  each_frame(stream, [](std::string_view body) {
    std::string error;
    const auto response = comms::wire::decode_response(body, &error);
    if (!response) {
      FUZZ_CHECK(!error.empty(), "a response was rejected without a reason");
      return false;
    }
    FUZZ_CHECK(static_cast<uint8_t>(response->status) <= static_cast<uint8_t>(Status::kError),
               "an unknown status was accepted");
    FUZZ_CHECK(comms::wire::encode_response(*response) == framed(body),
               "re-encoding a decoded response gives other bytes");
    return true;
  });
}

void round_trip(FuzzedDataProvider& in) {
  Request r;
  r.op = static_cast<Op>(in.ConsumeIntegralInRange<int>(1, 7));
  auto text = [&] { return in.ConsumeRandomLengthString(256); };
  if (ops_with_many_keys(r.op)) {
    const int n = in.ConsumeIntegralInRange(0, 8);
    for (int i = 0; i < n; ++i) r.keys.push_back(text());
  } else {
    r.keys.push_back(text());
  }
  if (r.op == Op::kSet || r.op == Op::kCompareSet) r.value = text();
  if (r.op == Op::kCompareSet) r.desired = text();
  if (r.op == Op::kAdd) r.delta = in.ConsumeIntegral<int64_t>();
  if (r.op == Op::kGet || r.op == Op::kWait) r.timeout_ms = in.ConsumeIntegral<uint64_t>();

  const std::string frame = comms::wire::encode_request(r);
  std::string error;
  const auto length = comms::wire::decode_frame_length(std::string_view(frame).substr(0, 4), SIZE_MAX, &error);
  FUZZ_CHECK(length && *length == frame.size() - 4, "the header does not announce the body: " + error);
  const auto back = comms::wire::decode_request(std::string_view(frame).substr(4), &error);
  FUZZ_CHECK(back.has_value(), "an encoded request does not decode: " + error);
  FUZZ_CHECK(same(*back, r), "decode(encode(request)) differs for op " + std::string(comms::wire::op_name(r.op)));

  Response s;
  s.status = static_cast<Status>(in.ConsumeIntegralInRange<int>(0, 2));
  s.text = text();
  s.number = in.ConsumeIntegral<int64_t>();
  const std::string rframe = comms::wire::encode_response(s);
  const auto rback = comms::wire::decode_response(std::string_view(rframe).substr(4), &error);
  FUZZ_CHECK(rback && rback->status == s.status && rback->text == s.text && rback->number == s.number,
             "decode(encode(response)) differs: " + error);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  FuzzedDataProvider in(data + 1, size - 1);
  switch (data[0] % 4) {
    case 0: frame_length(in); break;
    case 1: server_stream(rest); break;
    case 2: client_stream(rest); break;
    case 3: round_trip(in); break;
  }
  return 0;
}
