// comms-bench refuses ranges it cannot run, naming the flag, instead of
// silently running something else or dying of std::bad_alloc; nccl-tests'
// flags keep nccl-tests' meanings.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include <nlohmann/json.hpp>

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
      {{"-b", "4K", "-e", "4104", "-d", "float64", "-C", "all_gather"},
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
  const auto p = bench(2, {"-C", "all_gather", "-b", "16", "-e", "128", "-f", "1.5", "-c", "1", "--outofplace"});
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

TEST(BenchFlags, CpuOnlyBaselinesOnCudaBuffersAreRefusedPointingAtTheCudaOnes) {
  expect_refused(bench(1, {"--device", "cuda", "--gloo-native"}),
                 "comms-bench: --gloo-native times Gloo on CPU buffers; with --device cuda, --raw-plugin (the nccl "
                 "plugin), --raw-nccl or --overhead is the baseline");
  expect_refused(bench(1, {"--device", "cuda", "--raw-gloo"}),
                 "comms-bench: --raw-gloo times the cpu backend's plugin on CPU buffers; with --device cuda, "
                 "--raw-plugin (the nccl plugin), --raw-nccl or --overhead is the baseline");
}

// CUDA_VISIBLE_DEVICES=-1 hides every device, so this holds on a GPU machine
// too. Without CUDA in the build the reason is the build.
TEST(BenchFlags, DeviceCudaWithoutADeviceFailsWithOneErrorNamingTheReason) {
  const std::string why = COMMS_BENCH_CUDA ? "comms-bench: --device cuda: no usable CUDA device for local rank 0: "
                                           : "comms-bench: --device cuda: this comms-bench was built without CUDA";
  const std::vector<std::vector<std::string>> runs = {
      {"--device", "cuda"}, {"--device", "cuda", "--overhead", "-c", "1"}, {"--device", "cuda", "--raw-nccl", "-C", "all_gather"}};
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
  expect_refused(bench(1, {"--device", "cuda", "-d", "int32", "-o", "bor"}, {{"CUDA_VISIBLE_DEVICES", "-1"}}),
                 "comms-bench: --device cuda: nccl cannot reduce int32 with bor: NCCL has no bitwise reductions "
                 "(-C/--coll=all_reduce, -d/--datatype=int32, -o/--op=bor)");
  expect_refused(bench(1, {"--device", "cuda", "-C", "reduce_scatter", "-d", "bool", "-o", "bxor", "--overhead"},
                       {{"CUDA_VISIBLE_DEVICES", "-1"}}),
                 "nccl cannot reduce bool with bxor: NCCL has no logical xor (-C/--coll=reduce_scatter");
}

// A folder of its own, removed at the end.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string templ = (std::filesystem::temp_directory_path() / "bench_flags_XXXXXX").string();
    path = ::mkdtemp(templ.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

// nccl-tests' habits: -o is the reduce op, -r the root, -b/-e/-f the sizes.
// A reduce to root 1 with max is checked on rank 1 against max over ranks,
// so an -o or -r read as anything else shows as wrong results or a refusal.
TEST(BenchFlags, NcclTestsFlagsKeepNcclTestsMeanings) {
  TempDir dir;
  const std::string json = (dir.path / "out.json").string();
  const auto p = bench(2, {"-C", "reduce", "-o", "max", "-r", "1", "-b", "8", "-e", "1M", "-f", "2", "-d", "int32",
                           "--json", json});
  ASSERT_EQ(p.exit_code(), 0) << p.output;
  EXPECT_NE(p.output.find("# no wrong results"), std::string::npos) << p.output;
  const auto rows = nlohmann::json::parse(std::ifstream(json));
  ASSERT_EQ(rows.size(), 2u * 18) << "8 B to 1 MiB doubling, in and out of place: " << rows.dump();
  EXPECT_EQ(rows.front()["bytes"], 8);
  EXPECT_EQ(rows.back()["bytes"], 1 << 20);
  for (const auto& r : rows) {
    EXPECT_EQ(r["op"], "reduce");
    EXPECT_EQ(r["redop"], "max");
    EXPECT_EQ(r["root"], 1);
    EXPECT_EQ(r["dtype"], "int32");
    EXPECT_EQ(r["wrong"], 0);
  }
  // The check is on by default (nccl-tests' -c 1): broadcast from root 1
  // compares every rank's buffer with rank 1's values.
  const auto b = bench(2, {"-C", "broadcast", "-r", "1", "-b", "4K", "-e", "4K"});
  ASSERT_EQ(b.exit_code(), 0) << b.output;
  EXPECT_NE(b.output.find("# no wrong results"), std::string::npos) << b.output;
}

// Every CPU baseline runs at one rank (a one-rank plugin, a one-rank copy
// for Gloo's own) and every row reports checked numbers.
TEST(BenchFlags, BaselinesRunOnOneRank) {
  TempDir dir;
  const std::string json = (dir.path / "out.json").string();
  for (const std::string flag : {"--overhead", "--raw-plugin", "--raw-gloo", "--gloo-native"}) {
    const auto p = bench(1, {flag, "-C", "all_reduce", "-b", "4K", "-e", "8K", "--json", json});
    ASSERT_EQ(p.exit_code(), 0) << flag << "\n" << p.output;
    EXPECT_NE(p.output.find("# no wrong results"), std::string::npos) << flag << "\n" << p.output;
    const auto rows = nlohmann::json::parse(std::ifstream(json));
    ASSERT_EQ(rows.size(), 2u) << flag << ": 4K and 8K (a baseline runs out of place): " << rows.dump();
    for (const auto& r : rows) {
      EXPECT_EQ(r["ranks"], 1) << flag;
      EXPECT_EQ(r["wrong"], 0) << flag << ": " << r.dump();
      EXPECT_GT(r["p50_us"].get<double>(), 0) << flag << ": " << r.dump();
      if (flag == "--overhead") {
        EXPECT_EQ(r["baseline"], "comms") << r.dump();
        EXPECT_EQ(r["overhead_baseline"], "plugin:gloo") << r.dump();
        EXPECT_GT(r["raw_p50_us"].get<double>(), 0) << r.dump();
      } else {
        EXPECT_EQ(r["baseline"], flag == "--gloo-native" ? "gloo-native" : "plugin:gloo") << r.dump();
      }
    }
  }
}

// The overhead baseline is the comm's own plugin, whichever it is, and both
// sides' results are checked; Gloo's own algorithms are checked across the
// size where they change from the algorithm classes to the collectives.
TEST(BenchFlags, BaselinesAtTwoRanksGiveRightResults) {
  TempDir dir;
  const std::string json = (dir.path / "out.json").string();
  for (const std::string backend : {"cpu:gloo", "cpu:ucx"}) {
    const auto p = bench(2, {"--overhead", "-C", "all_reduce", "-b", "8", "-e", "1M", "-f", "64", "--json", json},
                         {{"COMMS_BACKEND", backend}});
    ASSERT_EQ(p.exit_code(), 0) << backend << "\n" << p.output;
    const auto rows = nlohmann::json::parse(std::ifstream(json));
    EXPECT_EQ(rows.size(), 3u) << backend << ": 8 B, 512 B and 32 KiB: " << rows.dump();
    for (const auto& r : rows) {
      EXPECT_EQ(r["wrong"], 0) << backend << ": " << r.dump();
      EXPECT_EQ(r["overhead_baseline"], "plugin:" + backend.substr(4)) << r.dump();
      EXPECT_GT(r["raw_p50_us"].get<double>(), 0) << r.dump();
    }
  }
  for (const std::string op : {"all_reduce", "broadcast", "reduce_scatter", "all_gather", "send_recv"}) {
    const auto p = bench(2, {"--gloo-native", "-C", op, "-b", "64K", "-e", "1M", "-f", "16", "-o", "avg", "--json",
                             json});
    ASSERT_EQ(p.exit_code(), 0) << op << "\n" << p.output;
    const auto rows = nlohmann::json::parse(std::ifstream(json));
    EXPECT_EQ(rows.size(), 2u) << op << ": 64 KiB and 1 MiB: " << rows.dump();
    for (const auto& r : rows) {
      EXPECT_EQ(r["wrong"], 0) << op << ": " << r.dump();
      EXPECT_EQ(r["baseline"], "gloo-native") << r.dump();
    }
  }
}

// -i steps by bytes instead of -f's factor; -a picks how ranks' times
// combine and is reported; -a 4 is not one of nccl-tests' values.
TEST(BenchFlags, StepBytesAndAverageFollowNcclTests) {
  TempDir dir;
  const std::string json = (dir.path / "out.json").string();
  const auto p = bench(2, {"-b", "4K", "-e", "16K", "-i", "4K", "-a", "1", "--outofplace", "--json", json});
  ASSERT_EQ(p.exit_code(), 0) << p.output;
  std::vector<long> sizes;
  for (const auto& r : nlohmann::json::parse(std::ifstream(json))) {
    sizes.push_back(r["bytes"].get<long>());
    EXPECT_EQ(r["average"], 1);
  }
  EXPECT_EQ(sizes, (std::vector<long>{4096, 8192, 12288, 16384}));
  const auto refused = bench(1, {"-a", "4"});
  EXPECT_NE(refused.exit_code(), 0) << refused.output;
  EXPECT_NE(refused.output.find("-a"), std::string::npos) << refused.output;
}

// --floor: every row carries the floor and p50 / floor; without it, no row
// does. (The floor's values are checked in tests/unit/bench_floor_test.cc.)
TEST(BenchFlags, FloorAddsTheFloorAndTheRatioToEveryRow) {
  TempDir dir;
  const std::string json = (dir.path / "out.json").string();
  for (const char* op : {"all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "barrier"}) {
    const auto p = bench(2, {"-C", op, "-b", "4K", "-e", "16K", "-f", "4", "--floor", "--json", json});
    ASSERT_EQ(p.exit_code(), 0) << op << "\n" << p.output;
    EXPECT_NE(p.output.find("x floor"), std::string::npos) << p.output;
    const auto rows = nlohmann::json::parse(std::ifstream(json));
    ASSERT_FALSE(rows.empty()) << op;
    for (const auto& r : rows) {
      EXPECT_EQ(r["wrong"], 0) << r.dump();
      const double floor = r.at("floor_us").get<double>(), p50 = r.at("p50_us").get<double>();
      EXPECT_GT(floor, 0) << r.dump();
      EXPECT_GE(r.at("floor_p99_us").get<double>(), floor) << r.dump();
      EXPECT_NEAR(r.at("floor_ratio").get<double>(), p50 / floor, 1e-9 * p50 / floor) << r.dump();
    }
  }
  ASSERT_EQ(bench(2, {"-b", "4K", "-e", "4K", "--json", json}).exit_code(), 0);
  for (const auto& r : nlohmann::json::parse(std::ifstream(json))) EXPECT_FALSE(r.contains("floor_us")) << r.dump();
  expect_refused(bench(1, {"--device", "cuda", "--floor"}),
                 "comms-bench: --floor is the floor of host memory; it has none for --device cuda");
}

TEST(BenchFlags, RootOutsideTheJobSeveralDevicesPerProcessAndACollectiveAsTheReduceOpAreRefused) {
  expect_refused(bench(2, {"-C", "broadcast", "-r", "2"}),
                 "comms-bench: -r/--root=2 is not a rank of this 2-rank job (0 to 1)");
  expect_refused(bench(1, {"-g", "2"}), "comms-bench: -g/--ngpus=2: comms-bench drives one device per process");
  // The old meaning of -o is refused pointing at the new flag.
  expect_refused(bench(1, {"-o", "all_gather"}),
                 "comms-bench: -o/--op='all_gather' is a collective, but -o is the reduce op (sum, max, ...) as in "
                 "nccl-tests: give the collective with -C/--coll all_gather");
}

// all_reduce_perf & co. (links to comms-bench, as make install lays them
// out) run the collective their name says.
TEST(BenchFlags, TheProgramNameChoosesTheCollective) {
  TempDir dir;
  for (const auto& [name, op] : std::map<std::string, std::string>{{"all_gather_perf", "all_gather"},
                                                                   {"alltoall_perf", "all_to_all"}}) {
    const auto link = dir.path / name;
    std::filesystem::create_symlink(COMMS_BENCH, link);
    const auto p = run({COMMSRUN, "-n", "2", "--timeout", "60", link.string(), "-n", "1", "-w", "0", "-b", "4K", "-e",
                        "4K", "--outofplace"},
                       {{"COMMS_BACKEND", "cpu:gloo"}}, 90s);
    ASSERT_EQ(p.exit_code(), 0) << p.output;
    EXPECT_NE(p.output.find("# comms-bench " + op + ", 2 ranks"), std::string::npos) << p.output;
    EXPECT_NE(p.output.find("# no wrong results"), std::string::npos) << p.output;
  }
}

TEST(BenchFlags, HelpShowsEveryDefault) {
  const auto p = run({COMMS_BENCH, "--help"}, {}, 30s);
  ASSERT_EQ(p.exit_code(), 0) << p.output;
  for (const char* shown : {R"(-c,--check INT:INT in \[0 - 1\]=1)", R"(-o,--op TEXT=sum)",
                            R"(-r,--root INT:NONNEGATIVE=0)", R"(-b,--minbytes TEXT=4K)", R"(-n,--iters INT:POSITIVE=20)",
                            R"(-a,--average INT:INT in \[0 - 3\]=3)", R"(-C,--coll TEXT:\{.*\}=all_reduce)"}) {
    EXPECT_TRUE(std::regex_search(p.output, std::regex(shown))) << shown << "\n" << p.output;
  }
}

// --json -: the JSON alone on rank 0's stdout (the same rule as comms-info
// and comms-conformance).
TEST(BenchFlags, JsonDashWritesOnlyTheJsonToStdout) {
  const auto p = bench(1, {"-b", "4K", "-e", "8K", "--outofplace", "--json", "-"});
  ASSERT_EQ(p.exit_code(), 0) << p.output;
  std::string json;
  std::istringstream lines(p.output);
  for (std::string line; std::getline(lines, line);) {
    ASSERT_EQ(line.rfind("[0] ", 0), 0u) << "not rank 0's output: " << line << "\n" << p.output;
    json += line.substr(4) + "\n";
  }
  const auto rows = nlohmann::json::parse(json);
  ASSERT_EQ(rows.size(), 2u) << json;
  EXPECT_EQ(rows[1]["bytes"], 8192);
}

}  // namespace

namespace {

// -C put: on a backend without windows, and with a flag it cannot honour,
// refused naming why; on UCX, the four rows of each size and no wrong data.
TEST(BenchFlags, PutNeedsWindowsAndPrintsPutBesideSendRecv) {
  expect_refused(bench(2, {"-C", "put"}), "needs a backend with windows");
#if UCX_PLUGIN_BUILT
  expect_refused(bench(2, {"-C", "put", "--json", "out.json"}, {{"COMMS_BACKEND", "cpu:ucx"}}),
                 "takes none of --device");
  expect_refused(bench(3, {"-C", "put"}, {{"COMMS_BACKEND", "cpu:ucx"}}), "pairs ranks r and r ^ 1");
  auto p = bench(2, {"-C", "put", "-b", "8", "-e", "4K", "-f", "512"}, {{"COMMS_BACKEND", "cpu:ucx"}});
  EXPECT_EQ(p.exit_code(), 0) << p.output;
  for (const std::string size : {"8", "4096"}) {
    for (const std::string mode : {"put lat", "send_recv lat", "put bw", "send_recv bw"}) {
      const std::regex row(" " + size + " +" + mode + " +[0-9.]+ +[0-9.]+ +[0-9.]+ +0\n");
      EXPECT_TRUE(std::regex_search(p.output, row)) << size << " " << mode << "\n" << p.output;
    }
  }
  EXPECT_NE(p.output.find("# no wrong results"), std::string::npos) << p.output;
#endif
}

// -R 1: buffers from the comm's allocator, registered; results checked on them.
TEST(BenchFlags, LocalRegisterTakesTheCommsAllocatorWhereThereIsOne) {
  expect_refused(bench(1, {"--device", "cuda", "-R", "1"}), "comms-bench: -R/--local_register=1 allocates cpu buffers");
  const auto gloo = bench(2, {"-R", "1"});
  EXPECT_EQ(gloo.exit_code(), 1) << gloo.output;
  EXPECT_NE(gloo.output.find("has no allocator of its own"), std::string::npos) << gloo.output;
#if UCX_PLUGIN_BUILT
  for (const std::string op : {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv"}) {
    auto p = bench(2, {"-C", op, "-R", "1", "-b", "8", "-e", "64K", "-f", "64"}, {{"COMMS_BACKEND", "cpu:ucx"}});
    EXPECT_EQ(p.exit_code(), 0) << op << "\n" << p.output;
    EXPECT_NE(p.output.find("# no wrong results"), std::string::npos) << op << "\n" << p.output;
  }
  auto put = bench(2, {"-C", "put", "-R", "1", "-b", "8", "-e", "4K", "-f", "512"}, {{"COMMS_BACKEND", "cpu:ucx"}});
  EXPECT_EQ(put.exit_code(), 0) << put.output;
  EXPECT_NE(put.output.find("from the comm's allocator, registered (-R 1)"), std::string::npos) << put.output;
  EXPECT_NE(put.output.find("# no wrong results"), std::string::npos) << put.output;
#endif
}

// --huge-pages: plain memory in huge pages, the floor's too; results checked
// on it, and the JSON says where the buffers were.
TEST(BenchFlags, HugePagesPlaceTheBuffersAndTheFloorsAndKeepTheResults) {
  expect_refused(bench(1, {"--device", "cuda", "--huge-pages"}),
                 "comms-bench: --huge-pages places cpu buffers; --device cuda keeps its own buffers");
  const auto both = bench(1, {"--huge-pages", "-R", "1"});
  EXPECT_NE(both.exit_code(), 0) << both.output;
  EXPECT_NE(both.output.find("excludes --huge-pages"), std::string::npos) << both.output;
  TempDir dir;
  const std::string json = (dir.path / "out.json").string();
  std::vector<std::string> backends = {"cpu:gloo"};
#if UCX_PLUGIN_BUILT
  backends.push_back("cpu:ucx");
#endif
  for (const std::string& backend : backends) {
    for (const std::string op : {"all_reduce", "broadcast", "all_gather", "reduce_scatter"}) {
      // 4 MiB: two huge pages per buffer, past the sizes the warning skips.
      const auto p = bench(2, {"-C", op, "-b", "64K", "-e", "4M", "-f", "64", "--floor", "--huge-pages", "--json", json},
                           {{"COMMS_BACKEND", backend}});
      ASSERT_EQ(p.exit_code(), 0) << backend << " " << op << "\n" << p.output;
      EXPECT_NE(p.output.find("cpu (huge pages) buffers"), std::string::npos) << p.output;
      const auto rows = nlohmann::json::parse(std::ifstream(json));
      ASSERT_EQ(rows.size(), 4u) << rows.dump();  // 64 KiB and 4 MiB, in place and out of place
      for (const auto& r : rows) {
        EXPECT_EQ(r["wrong"], 0) << r.dump();
        EXPECT_EQ(r["memory"], "huge_pages") << r.dump();
        EXPECT_GT(r.at("floor_us").get<double>(), 0) << r.dump();
      }
    }
  }
  ASSERT_EQ(bench(2, {"-b", "4K", "-e", "4K", "--json", json}).exit_code(), 0);
  for (const auto& r : nlohmann::json::parse(std::ifstream(json))) EXPECT_EQ(r["memory"], "plain") << r.dump();
}

}  // namespace
