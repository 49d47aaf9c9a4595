// gtest main shared by every test binary. When COMMS_TEST_REPORT_DIR is set
// (scripts/run_tests.py sets it), each process writes
// <dir>/<binary>.rank<R>.json so that a multi-process test counts each case
// once, failed if it failed on any rank.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  // Set before InitGoogleTest, which is where gtest reads the output flag.
  if (const char* dir = std::getenv("COMMS_TEST_REPORT_DIR"); dir && *dir) {
    std::string binary = argv[0];
    if (auto slash = binary.rfind('/'); slash != std::string::npos) binary = binary.substr(slash + 1);
    const char* rank = std::getenv("RANK");
    GTEST_FLAG_SET(output, std::string("json:") + dir + "/" + binary + ".rank" +
                               (rank && *rank ? rank : "0") + ".json");
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
