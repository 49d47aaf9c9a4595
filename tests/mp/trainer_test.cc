// The example trainer, as the README promises it works: the same final loss
// at every world size and backend spelling, a clear error for an unknown
// backend, and no hang when a rank is killed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <regex>
#include <thread>

#include "subprocess.h"

namespace {

using comms::testing::Process;
using comms::testing::run;
using namespace std::chrono_literals;

double final_loss(const std::string& output) {
  std::smatch m;
  std::regex re(R"(final_loss=([-0-9.eE+na]+))");
  if (!std::regex_search(output, m, re)) return NAN;
  return std::stod(m[1]);
}

double train(int ranks, const std::string& backend, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv = {COMMSRUN, "-n", std::to_string(ranks), "--", TRAINER, "--steps", "60"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto p = run(argv, {{"COMMS_BACKEND", backend}}, 120s);
  EXPECT_EQ(p.exit_code(), 0) << p.output;
  const double loss = final_loss(p.output);
  EXPECT_FALSE(std::isnan(loss)) << p.output;
  return loss;
}

TEST(Trainer, FinalLossAgreesAcrossWorldSizesAndBackendSpellings) {
  const double four = train(4, "cpu:gloo");
  EXPECT_EQ(train(4, "gloo"), four);
  for (int n : {1, 2}) {
    const double loss = train(n, "cpu:gloo");
    EXPECT_NEAR(loss, four, 1e-5 * std::fabs(four)) << n << " ranks";
  }
  EXPECT_LT(four, 0.05) << "the model did not learn";
}

TEST(Trainer, ModelParallelLayoutsKeepTheFinalLossOfThePureDataParallelRun) {
  // Averaging over the collection's dp group with each dp rank on its slice
  // of the global batch: the same sums as dp ranks alone.
  const double dp2 = train(2, "cpu:gloo");
  EXPECT_EQ(train(4, "cpu:gloo", {"--parallel", "tp=2,dp=2"}), dp2);
  EXPECT_EQ(train(4, "cpu:gloo", {"--parallel", "pp=2,order=tp-pp-dp", "--offload-every", "20"}), dp2);
  EXPECT_EQ(train(8, "cpu:gloo", {"--parallel", "tp=2,pp=2,dp=2"}), dp2);
  const double dp4 = train(4, "cpu:gloo");
  EXPECT_EQ(train(8, "cpu:gloo", {"--parallel", "tp=2,ep=2,etp=1"}), dp4);
}

TEST(Trainer, AParallelLayoutThatDoesNotFitTheJobFailsSayingWhy) {
  auto p = run({COMMSRUN, "-n", "4", "--", TRAINER, "--steps", "5", "--parallel", "tp=2,dp=4"},
               {{"COMMS_BACKEND", "cpu:gloo"}}, 30s);
  EXPECT_NE(p.exit_code(), 0);
  EXPECT_NE(p.output.find("--parallel dp=4 but 4 ranks / (tp*pp*cp) give dp=2"), std::string::npos) << p.output;
  p = run({COMMSRUN, "-n", "4", "--", TRAINER, "--steps", "5", "--parallel", "tp=3"}, {{"COMMS_BACKEND", "cpu:gloo"}}, 30s);
  EXPECT_NE(p.exit_code(), 0);
  EXPECT_NE(p.output.find("not divisible by tp*pp*cp"), std::string::npos) << p.output;
}

TEST(Trainer, AnUnknownBackendFailsFastNamingItAndTheAvailableOnes) {
  auto p = run({COMMSRUN, "-n", "2", "--", TRAINER, "--steps", "5"}, {{"COMMS_BACKEND", "cpu:nope"}}, 30s);
  EXPECT_NE(p.exit_code(), 0);
  EXPECT_LT(p.elapsed_s(), 10.0);
  EXPECT_NE(p.output.find("'nope'"), std::string::npos) << p.output;
  EXPECT_NE(p.output.find("available backends: gloo"), std::string::npos) << p.output;
}

TEST(Trainer, AGlooHostNameThatDoesNotResolveFailsNamingItInsteadOfCrashingInGloo) {
  // Gloo's CreateDevice used to get this value unchecked: ranks died of SIGSEGV.
  auto p = run({COMMSRUN, "-n", "2", "--", TRAINER, "--steps", "2"},
               {{"COMMS_BACKEND", "cpu:gloo"}, {"COMMS_GLOO_HOSTNAME", "-1"}}, 60s);
  EXPECT_EQ(p.exit_code(), 1) << p.output;
  // The first rank to fail exits with an error; commsrun then stops the
  // other (SIGTERM), which is no crash.
  EXPECT_NE(p.output.find(") exited with status 1\n"), std::string::npos) << p.output;
  for (const char* crash : {"SIGSEGV", "SIGABRT", "SIGBUS"}) EXPECT_EQ(p.output.find(crash), std::string::npos) << p.output;
  EXPECT_NE(p.output.find("COMMS_GLOO_HOSTNAME='-1' does not resolve"), std::string::npos) << p.output;
}

TEST(Trainer, ACommunicatorConfigWithAListAsAKeyFailsNamingTheFileAndLine) {
  // yaml-cpp's BadConversion escaped the trainer's catch and aborted it.
  const std::string path = ::testing::TempDir() + "/trainer_list_key.yaml";
  std::ofstream(path) << "tp: {}\n[dp]: {max_ctas: 1}\n";
  auto p = run({COMMSRUN, "-n", "2", "--", TRAINER, "--steps", "2", "--parallel", "tp=2",
                "--nccl-communicator-config-path", path},
               {{"COMMS_BACKEND", "cpu:gloo"}}, 60s);
  std::remove(path.c_str());
  EXPECT_EQ(p.exit_code(), 1) << p.output;
  EXPECT_NE(p.output.find(") exited with status 1\n"), std::string::npos) << p.output;
  for (const char* crash : {"SIGSEGV", "SIGABRT", "SIGBUS"}) EXPECT_EQ(p.output.find(crash), std::string::npos) << p.output;
  EXPECT_NE(p.output.find(path + ": communicator config (line 2): a key must be a plain name"), std::string::npos)
      << p.output;
}

TEST(Trainer, ARankKilledMidRunMakesTheOthersFailWithoutHanging) {
  // --keep-going: commsrun must not stop the survivors before each has seen
  // the failure itself (that is what this test is about).
  Process p = Process::start({COMMSRUN, "-n", "4", "--keep-going", "--", TRAINER, "--steps", "100000000",
                              "--print-every", "100"},
                             {{"COMMS_BACKEND", "cpu:gloo"}, {"COMMS_OP_TIMEOUT", "30s"}});
  ASSERT_TRUE(p.read_until([](const std::string& o) { return o.find("step 100 ") != std::string::npos; }, 60s))
      << p.output;
  auto ranks = comms::testing::children_of(p.pid);
  ASSERT_EQ(ranks.size(), 4u);
  const auto killed_at = std::chrono::steady_clock::now();
  kill(ranks[2], SIGKILL);
  ASSERT_TRUE(p.wait(30s + 5s)) << p.output;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  EXPECT_LT(seconds, 30.0 + 5.0);
  EXPECT_NE(p.exit_code(), 0);
  EXPECT_NE(p.output.find("was killed by signal 9"), std::string::npos) << p.output;
  // Each survivor reported a comms error (it did not just get killed).
  int errors = 0;
  for (size_t pos = 0; (pos = p.output.find("trainer: comms[", pos)) != std::string::npos; ++pos) ++errors;
  EXPECT_EQ(errors, 3) << p.output;
}

TEST(Trainer, ASignalEndsARankBlockedWaitingForAStoppedPeerWithinTwoSeconds) {
  // Offload and reload every step: most of a step is the reload's
  // rendezvous, where rank 0 ends up waiting once rank 1 is stopped. The
  // timeouts are long, so only the signal can end the wait in time.
  Process p = Process::start({COMMSRUN, "-n", "2", "--grace", "30", "--", TRAINER, "--steps", "100000000",
                              "--print-every", "20", "--offload-every", "1"},
                             {{"COMMS_BACKEND", "cpu:gloo"}, {"COMMS_OP_TIMEOUT", "60s"},
                              {"COMMS_INIT_TIMEOUT", "60s"}});
  ASSERT_TRUE(p.read_until([](const std::string& o) { return o.find("step 20 ") != std::string::npos; }, 60s))
      << p.output;
  auto ranks = comms::testing::children_of(p.pid);
  ASSERT_EQ(ranks.size(), 2u);
  kill(ranks[1], SIGSTOP);
  std::this_thread::sleep_for(300ms);  // rank 0 reaches the point where it needs rank 1
  const auto signalled_at = std::chrono::steady_clock::now();
  kill(ranks[0], SIGTERM);
  const std::string ended = "rank 0 (pid " + std::to_string(ranks[0]) + ") exited with status 143";
  const bool in_time = p.read_until([&](const std::string& o) { return o.find(ended) != std::string::npos; }, 10s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - signalled_at).count();
  kill(ranks[1], SIGCONT);  // it takes commsrun's SIGTERM now
  p.wait(40s);
  ASSERT_TRUE(in_time) << p.output;
  EXPECT_LT(seconds, 2.0 + 1.5) << p.output;
  EXPECT_NE(p.output.find("trainer: stopped by SIGTERM while blocked in "), std::string::npos) << p.output;
  EXPECT_NE(p.exit_code(), 0);
}

#if UCX_PLUGIN_BUILT
TEST(Trainer, UcxGivesTheFinalLossOfGlooAlsoWithOffloadAndReload) {
  EXPECT_EQ(train(4, "cpu:ucx"), train(4, "cpu:gloo"));
  EXPECT_EQ(train(2, "cpu:ucx"), train(2, "cpu:gloo"));
  EXPECT_EQ(train(4, "cpu:ucx", {"--offload-every", "5"}), train(4, "cpu:gloo", {"--offload-every", "5"}));
}

TEST(Trainer, AUcxRankKilledMidRunMakesTheOthersFailWithoutHanging) {
  // --keep-going: commsrun must not stop the survivors before each has seen
  // the failure itself (that is what this test is about).
  Process p = Process::start({COMMSRUN, "-n", "4", "--keep-going", "--", TRAINER, "--steps", "100000000",
                              "--print-every", "100"},
                             {{"COMMS_BACKEND", "cpu:ucx"}, {"COMMS_OP_TIMEOUT", "20s"}});
  ASSERT_TRUE(p.read_until([](const std::string& o) { return o.find("step 100 ") != std::string::npos; }, 60s))
      << p.output;
  auto ranks = comms::testing::children_of(p.pid);
  ASSERT_EQ(ranks.size(), 4u);
  const auto killed_at = std::chrono::steady_clock::now();
  kill(ranks[2], SIGKILL);
  ASSERT_TRUE(p.wait(20s + 5s)) << p.output;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  EXPECT_LT(seconds, 20.0 + 5.0);
  EXPECT_NE(p.exit_code(), 0);
  EXPECT_NE(p.output.find("was killed by signal 9"), std::string::npos) << p.output;
  int errors = 0;
  for (size_t pos = 0; (pos = p.output.find("trainer: comms[", pos)) != std::string::npos; ++pos) ++errors;
  EXPECT_EQ(errors, 3) << p.output;
  for (size_t pos = 0; (pos = p.output.find("trainer: comms[", pos)) != std::string::npos; ++pos) {
    const std::string line = p.output.substr(pos, p.output.find('\n', pos) - pos);
    EXPECT_TRUE(line.find("peer_failure") != std::string::npos || line.find("timeout") != std::string::npos) << line;
  }
}
#endif

}  // namespace
