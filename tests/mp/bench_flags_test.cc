// comms-bench refuses ranges it cannot run, naming the flag, instead of
// silently running something else or dying of std::bad_alloc.
#include <gtest/gtest.h>

#include <regex>

#include "subprocess.h"

namespace {

using comms::testing::run;
using namespace std::chrono_literals;

struct Refused {
  std::vector<std::string> args;
  std::string why;
};

comms::testing::Process bench(int ranks, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {COMMSRUN, "-n", std::to_string(ranks), "--timeout", "60", "--", COMMS_BENCH,
                                   "-n", "1", "-w", "0"};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv, {{"COMMS_BACKEND", "cpu:gloo"}}, 90s);
}

TEST(BenchFlags, RangesThatCannotRunAreRefusedNamingTheFlag) {
  const Refused cases[] = {
      // Ran 64K alone: the maximum was raised to the minimum.
      {{"-b", "64K", "-e", "4K"},
       "-b/--minbytes='64K' (65536 bytes) is above -e/--maxbytes='4K' (4096 bytes)"},
      // Ran 0 bytes: the size was truncated to whole elements.
      {{"-b", "3", "-e", "3", "-d", "float32"},
       "-b/--minbytes='3' (3 bytes) is not a multiple of 4 bytes (one float32 element)"},
      {{"-b", "4K", "-e", "4104", "-d", "float64", "-o", "all_gather"},
       "-e/--maxbytes='4104' (4104 bytes) is not a multiple of 16 bytes (one float64 element per rank, 2 ranks"},
      // Died with a bare std::bad_alloc.
      {{"-b", "99999999G"}, "-b/--minbytes='99999999G' is more than comms-bench runs, 1024G"},
      {{"-b", "4K", "-e", "1000G"}, "-e/--maxbytes='1000G' needs two buffers of 1073741824000 bytes on each of the 2"},
      {{"-b", "1.5"}, "-b/--minbytes='1.5' is not a size in bytes"},
      {{"-b", "nan"}, "-b/--minbytes='nan' is not a size in bytes"},
  };
  for (const auto& c : cases) {
    const auto p = bench(2, c.args);
    EXPECT_EQ(p.exit_code(), 1) << c.why << "\n" << p.output;
    EXPECT_NE(p.output.find(c.why), std::string::npos) << p.output;
    EXPECT_EQ(p.output.find("# comms-bench"), std::string::npos) << "it ran: " << p.output;
  }
}

TEST(BenchFlags, StepsBetweenTheFlagsAreWholeElementsPerRankAndGrowFromThem) {
  // -f 1.5 from 16 bytes gives 36 and 54, which are not multiples of 8
  // (float32 x 2 ranks for all_gather): each step rounds down to one, and
  // the next grows from the size that ran.
  const auto p = bench(2, {"-o", "all_gather", "-b", "16", "-e", "128", "-f", "1.5", "-c", "1", "--outofplace"});
  ASSERT_EQ(p.exit_code(), 0) << p.output;
  std::vector<long> sizes;
  const std::regex row(R"(\[0\] +(\d+) +(\d+) +float32 )");
  for (std::sregex_iterator it(p.output.begin(), p.output.end(), row), end; it != end; ++it) {
    sizes.push_back(std::stol((*it)[1]));
    EXPECT_EQ(std::stol((*it)[1]), 8 * std::stol((*it)[2])) << "bytes = count x 2 ranks x 4: " << (*it)[0];
  }
  EXPECT_EQ(sizes, (std::vector<long>{16, 24, 32, 48, 72, 104})) << p.output;
  EXPECT_NE(p.output.find("# no wrong results"), std::string::npos) << p.output;
}

}  // namespace
