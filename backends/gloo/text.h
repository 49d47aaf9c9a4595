// String joining for the Gloo plugin's messages (a plugin cannot use
// libcomms' internal strutil.h).
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

namespace comms::gloo_backend {

inline std::string cat(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (auto p : parts) out.append(p);
  return out;
}

}  // namespace comms::gloo_backend
