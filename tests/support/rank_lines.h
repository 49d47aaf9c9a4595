// Reading a job's output where each rank prints one line per tag:
// "<tag> rank <r> <rest>" (prefixes such as commsrun's "[r] " allowed).
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>
#include <string>

namespace comms::testing {

// rank -> the rest of its line; a rank that printed the tag twice fails.
inline std::map<int, std::string> rank_lines(const std::string& output, const std::string& tag) {
  std::map<int, std::string> out;
  std::regex re(tag + R"( rank (\d+) ([^\n]*))");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), re); it != std::sregex_iterator(); ++it) {
    EXPECT_TRUE(out.emplace(std::stoi((*it)[1]), (*it)[2]).second) << tag << " rank " << (*it)[1] << " twice";
  }
  return out;
}

inline std::set<int> ranks_of(const std::map<int, std::string>& m) {
  std::set<int> out;
  for (const auto& [r, rest] : m) out.insert(r);
  return out;
}

}  // namespace comms::testing
