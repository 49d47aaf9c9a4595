// JSON text out of libcomms. Names, hints and environment values are the
// user's bytes and need not be UTF-8, and nlohmann's plain dump() throws on
// those; everything libcomms prints as JSON goes through here, which writes
// U+FFFD for invalid bytes instead.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace comms {

template <class Json>
std::string json_text(const Json& j, int indent = -1) {
  return j.dump(indent, ' ', false, Json::error_handler_t::replace);
}

}  // namespace comms
