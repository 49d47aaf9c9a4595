// comms-bench refuses ranges it cannot run, naming the flag, instead of
// silently running something else or dying of std::bad_alloc.
#include <gtest/gtest.h>

#include <map>
#include <regex>

#include "subprocess.h"

namespace {

using comms::testing::run;
using namespace std::chrono_literals;

struct Refused {
  std::vector<std::string> args;
  std::string why;
};

comms::testing::Process bench(int ranks, const std::vector<std::string>& args,
                              std::map<std::string, std::string> env = {{"COMMS_BACKEND", "cpu:gloo"}}) {
  std::vector<std::string> argv = {COMMSRUN, "-n", std::to_string(ranks), "--timeout", "60", "--", COMMS_BENCH,
                                   "-n", "1", "-w", "0"};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv, env, 90s);
}

// Refused: exit 1 (no signal), `why` said, and nothing ran.
void expect_refused(const comms::testing::Process& p, const std::string& why) {
  EXPECT_EQ(p.exit_code(), 1) << why << "\n" << p.output;
  EXPECT_NE(p.output.find(why), std::string::npos) << "wanted: " << why << "\n" << p.output;
  EXPECT_EQ(p.output.find("# comms-bench"), std::string::npos) << "it ran: " << p.output;
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

TEST(BenchFlags, RawNcclWithoutDeviceCudaIsRefused) {
  expect_refused(bench(1, {"--raw-nccl"}), "comms-bench: --raw-nccl times NCCL on CUDA buffers; give --device cuda as well");
}

TEST(BenchFlags, GlooBaselinesOnCudaBuffersAreRefusedPointingAtRawNccl) {
  for (const char* flag : {"--raw-gloo", "--gloo-native"}) {
    expect_refused(bench(1, {"--device", "cuda", flag}),
                   std::string("comms-bench: ") + flag +
                       " times Gloo on CPU buffers; with --device cuda, --raw-nccl (or --overhead) is the baseline");
  }
}

// CUDA_VISIBLE_DEVICES=-1 hides every device, so this holds on a GPU machine
// too. Without CUDA in the build the reason is the build.
TEST(BenchFlags, DeviceCudaWithoutADeviceFailsWithOneErrorNamingTheReason) {
  const std::string why = COMMS_BENCH_CUDA ? "comms-bench: --device cuda: no usable CUDA device for local rank 0: "
                                           : "comms-bench: --device cuda: this comms-bench was built without CUDA";
  const std::vector<std::vector<std::string>> runs = {
      {"--device", "cuda"}, {"--device", "cuda", "--overhead", "-c", "1"}, {"--device", "cuda", "--raw-nccl", "-o", "all_gather"}};
  for (const auto& args : runs) {
    const auto p = bench(1, args, {{"CUDA_VISIBLE_DEVICES", "-1"}});
    expect_refused(p, why);
    size_t errors = 0;
    for (size_t at = p.output.find("comms-bench: "); at != std::string::npos; at = p.output.find("comms-bench: ", at + 1)) {
      ++errors;
    }
    EXPECT_EQ(errors, 1u) << p.output;
  }
}

TEST(BenchFlags, ReductionsNcclLacksAreRefusedOnCudaNamingTheFlags) {
  if (!COMMS_BENCH_CUDA) GTEST_SKIP() << "built without CUDA: --device cuda is refused before any op is looked at";
  // Refused before the device is looked for, so it holds here without one.
  expect_refused(bench(1, {"--device", "cuda", "-d", "int32", "-r", "bor"}, {{"CUDA_VISIBLE_DEVICES", "-1"}}),
                 "comms-bench: --device cuda: nccl cannot reduce int32 with bor: NCCL has no bitwise reductions "
                 "(-o/--op=all_reduce, -d/--datatype=int32, -r/--redop=bor)");
  expect_refused(bench(1, {"--device", "cuda", "-o", "reduce_scatter", "-d", "bool", "-r", "bxor", "--overhead"},
                       {{"CUDA_VISIBLE_DEVICES", "-1"}}),
                 "nccl cannot reduce bool with bxor: NCCL has no logical xor (-o/--op=reduce_scatter");
}

}  // namespace
