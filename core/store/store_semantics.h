// The semantics of add and compare_set, shared by every store so that they
// cannot drift apart (they follow PyTorch c10d's stores).
#pragma once

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/strutil.h"
#include "comms/error.h"

namespace comms::store_semantics {

// The new value of an integer stored as decimal text (`current` is nullopt
// when the key is missing, which counts as 0). Throws kInvalidArgument when
// the stored value is not an integer or the sum overflows.
inline int64_t added_value(const std::string& key, const std::optional<std::string>& current,
                           int64_t delta) {
  int64_t base = 0;
  if (current) {
    const char* begin = current->data();
    const char* end = begin + current->size();
    auto [ptr, ec] = std::from_chars(begin, end, base);
    if (current->empty() || ec != std::errc() || ptr != end) {
      throw Error(ErrorCode::kInvalidArgument,
                  str::cat("add('", key, "', ", delta, "): the stored value '",
                               current->substr(0, 64), "' is not an integer"));
    }
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(base, delta, &sum)) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("add('", key, "', ", delta, "): overflows the stored value ", base));
  }
  return sum;
}

// What compare_set leaves in the key (nullopt: the key stays missing) and
// what it returns.
struct CompareSetOutcome {
  std::optional<std::string> stored;
  std::string returned;
  bool swapped = false;
};

inline CompareSetOutcome compare_set_outcome(const std::optional<std::string>& current,
                                             const std::string& expected,
                                             const std::string& desired) {
  if (!current) {
    // A missing key matches only an empty `expected`.
    if (expected.empty()) return {desired, desired, true};
    return {std::nullopt, expected, false};
  }
  if (*current == expected) return {desired, desired, true};
  return {current, *current, false};
}

// now + timeout, saturated so that "wait forever" (milliseconds::max()) does
// not overflow the clock; a negative timeout means now.
inline std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  constexpr auto kLongest = std::chrono::hours(24 * 365 * 10);
  auto bounded = std::clamp<std::chrono::milliseconds>(
      timeout, std::chrono::milliseconds(0),
      std::chrono::duration_cast<std::chrono::milliseconds>(kLongest));
  return std::chrono::steady_clock::now() + bounded;
}

// "'a', 'b'" for error messages, cut short for long key lists.
inline std::string quoted_keys(const std::vector<std::string>& keys) {
  constexpr size_t kShown = 8;
  std::vector<std::string> quoted;
  for (size_t i = 0; i < keys.size() && i < kShown; ++i) quoted.push_back("'" + keys[i] + "'");
  std::string out = str::join(quoted, ", ");
  if (keys.size() > kShown) str::append(out, ", ... (", keys.size(), " keys)");
  return out;
}

}  // namespace comms::store_semantics
