// The generic hint string "k=v,k=v" (comms::parse_hints, format_hints).
//   - Rejections are comms::Error kInvalidArgument quoting the string.
//   - An accepted string gives exactly what a plain reading of it gives:
//     items split at ',', blank ones skipped, key and value split at the
//     first '=' and stripped (a key given twice: the last value).
//   - format_hints of the result parses back to the same hints.
#include <cstdint>
#include <string>
#include <string_view>

#include "comms/options.h"
#include "fuzz_check.h"
#include "util/strutil.h"

namespace {

// An independent reading of the documented format.
comms::Hints reference(std::string_view text) {
  comms::Hints h;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == text.npos) end = text.size();
    const std::string_view item = comms::str::strip(text.substr(start, end - start));
    if (!item.empty()) {
      const size_t eq = item.find('=');
      h[std::string(comms::str::strip(item.substr(0, eq)))] = std::string(comms::str::strip(item.substr(eq + 1)));
    }
    start = end + 1;
  }
  return h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  comms::Hints hints;
  if (!fuzz::accepts([&] { hints = comms::parse_hints(text); }, {comms::ErrorCode::kInvalidArgument}, text,
                     FUZZ_HERE)) {
    return 0;
  }
  for (const auto& [k, v] : hints) {
    FUZZ_CHECK(!k.empty() && k.find_first_of(",=") == k.npos && comms::str::strip(k) == k, "bad key '" + k + "'");
    FUZZ_CHECK(v.find(',') == v.npos && comms::str::strip(v) == v, "bad value '" + v + "' of '" + k + "'");
  }
  FUZZ_CHECK(hints == reference(text), "'" + text + "' read differently from the documented format");
  const std::string formatted = comms::format_hints(hints);
  comms::Hints again;
  FUZZ_CHECK(fuzz::accepts([&] { again = comms::parse_hints(formatted); }, {}, "", FUZZ_HERE) && again == hints,
             "'" + formatted + "' (formatted from '" + text + "') does not parse back");
  return 0;
}
