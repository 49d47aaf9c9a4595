// Test suite names are unique across the test files, so a name in a report
// (or a --gtest_filter) points at one file and one binary.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

TEST(TestSuiteNames, EverySuiteNameIsUsedByOneTestFileOnly) {
  const std::filesystem::path tests = std::filesystem::path(COMMS_SOURCE_ROOT) / "tests";
  const std::regex test_macro(R"(^\s*TEST(?:_F|_P)?\(\s*(\w+)\s*,)");
  std::map<std::string, std::set<std::string>> files_of;
  size_t files = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(tests)) {
    if (entry.path().extension() != ".cc") continue;
    ++files;
    std::ifstream in(entry.path());
    std::string line;
    while (std::getline(in, line)) {
      std::smatch m;
      if (std::regex_search(line, m, test_macro)) {
        files_of[m[1]].insert(std::filesystem::relative(entry.path(), tests).string());
      }
    }
  }
  EXPECT_GT(files, 20u) << "found too few test files under " << tests;
  EXPECT_GT(files_of.size(), 50u) << "found too few suites under " << tests;
  for (const auto& [suite, where] : files_of) {
    if (where.size() < 2) continue;
    std::ostringstream list;
    for (const auto& f : where) list << " " << f;
    ADD_FAILURE() << "suite " << suite << " is defined in several files:" << list.str();
  }
}

}  // namespace
