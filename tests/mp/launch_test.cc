// Launching as people already do: torchrun's spellings of commsrun's
// options, a program's own flags after it without "--", ranks started by
// srun (only SLURM_* set) or by hand against `commsrun --store-only`, and a
// file store that is per job or refused when an earlier run left keys.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <utime.h>

#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>

#include "subprocess.h"

namespace {

using comms::testing::Process;
using comms::testing::run;
using namespace std::chrono_literals;

const std::map<std::string, std::string> kGloo = {{"COMMS_BACKEND", "cpu:gloo"}};

// Every launcher variable unset, so only what a case sets is in play.
std::map<std::string, std::string> bare_environment() {
  std::map<std::string, std::string> env = kGloo;
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                           "COMMS_STORE", "COMMS_RANK", "COMMS_WORLD_SIZE", "COMMS_LOCAL_RANK", "COMMS_JOB_ID",
                           "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_JOB_ID",
                           "SLURM_STEP_ID", "SLURM_NODELIST", "SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST",
                           "COMMS_STORE_TOKEN", "COMMS_STORE_TOKEN_FILE", "OMPI_COMM_WORLD_RANK",
                           "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE"}) {
    env[name] = "";
  }
  return env;
}

std::string final_loss(const std::string& output) {
  std::smatch m;
  return std::regex_search(output, m, std::regex(R"(final_loss=(\S+))")) ? m[1].str() : "none";
}

std::string trainer_loss(const std::vector<std::string>& commsrun_args) {
  std::vector<std::string> argv = {COMMSRUN};
  argv.insert(argv.end(), commsrun_args.begin(), commsrun_args.end());
  const auto p = run(argv, kGloo, 120s);
  EXPECT_EQ(p.exit_code(), 0) << p.output;
  return final_loss(p.output);
}

// Ranks started directly, each with `common` plus its own variables.
std::vector<Process> start_ranks(int n, std::map<std::string, std::string> common,
                                 const std::function<std::map<std::string, std::string>(int)>& per_rank,
                                 const std::vector<std::string>& trainer_args) {
  std::vector<Process> ranks;
  for (int r = 0; r < n; ++r) {
    auto env = common;
    for (const auto& [k, v] : per_rank(r)) env[k] = v;
    std::vector<std::string> argv = {TRAINER};
    argv.insert(argv.end(), trainer_args.begin(), trainer_args.end());
    ranks.push_back(Process::start(argv, env));
  }
  return ranks;
}

// Every rank exits 0 and reports `loss`.
void expect_all_succeed(std::vector<Process>& ranks, const std::string& loss) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    ranks[r].wait(90s);
    EXPECT_EQ(ranks[r].exit_code(), 0) << "rank " << r << ":\n" << ranks[r].output;
    if (r == 0) EXPECT_EQ(final_loss(ranks[r].output), loss) << ranks[r].output;
  }
}

bool loopback_port_is_free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return free;
}

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string templ = (std::filesystem::temp_directory_path() / "launch_test_XXXXXX").string();
    path = ::mkdtemp(templ.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

TEST(Launch, TorchrunSpellingsRunTheTrainerAsTheShortOnesDo) {
  const std::string loss = trainer_loss({"-n", "2", "--", TRAINER});
  EXPECT_EQ(trainer_loss({"--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--", TRAINER}), loss);
  EXPECT_EQ(trainer_loss({"--nproc-per-node=2", "--nnodes=1", "--node_rank=0", "--master-port=0", "--standalone",
                          TRAINER}),
            loss);
  EXPECT_NE(loss, "none");
}

TEST(Launch, TheProgramsOwnFlagsNeedNoSeparator) {
  const std::string ten = trainer_loss({"-n", "2", "--", TRAINER, "--steps", "10"});
  EXPECT_EQ(trainer_loss({"-n", "2", TRAINER, "--steps", "10"}), ten);
  EXPECT_NE(trainer_loss({"-n", "2", TRAINER}), ten) << "--steps 10 did not reach the trainer";
  // -n and -- after the program are the program's.
  const auto p = run({COMMSRUN, "-n", "1", "echo", "-n", "--", "x"}, {}, 30s);
  ASSERT_EQ(p.exit_code(), 0) << p.output;
  EXPECT_EQ(p.output, "[0] -- x\n");
}

TEST(Launch, NprocPerNodeAutoCountsTheVisibleDevices) {
  const auto p = run({COMMSRUN, "--nproc-per-node=auto", "printenv", "WORLD_SIZE"}, {{"CUDA_VISIBLE_DEVICES", "0,1,2"}},
                     30s);
  ASSERT_EQ(p.exit_code(), 0) << p.output;
  for (const char* line : {"[0] 3\n", "[1] 3\n", "[2] 3\n"}) EXPECT_NE(p.output.find(line), std::string::npos) << p.output;
}

// srun sets only SLURM_*: the store is on the node list's first host, at a
// port from the job id, hosted by rank 0.
TEST(Launch, RanksStartedBySrunFindTheirStoreFromSlurmVariablesAlone) {
  const std::string loss = trainer_loss({"-n", "2", "--", TRAINER, "--steps", "10"});
  std::mt19937 random(static_cast<unsigned>(::getpid()) ^ static_cast<unsigned>(std::time(nullptr)));
  int job_id = 0;
  for (int tries = 0; tries < 100; ++tries) {
    job_id = 1000000 + static_cast<int>(random() % 1000000);
    if (loopback_port_is_free(15000 + job_id % 20000)) break;
  }
  auto env = bare_environment();
  env["SLURM_NTASKS"] = "2";
  env["SLURM_NODELIST"] = "localhost";
  env["SLURM_JOB_ID"] = std::to_string(job_id);
  env["COMMS_INIT_TIMEOUT"] = "60s";
  auto ranks = start_ranks(
      2, env, [](int r) { return std::map<std::string, std::string>{{"SLURM_PROCID", std::to_string(r)},
                                                                    {"SLURM_LOCALID", std::to_string(r)}}; },
      {"--steps", "10"});
  expect_all_succeed(ranks, loss);
}

// Ranks started by hand (or by another launcher) against a store that
// commsrun --store-only hosts.
TEST(Launch, StoreOnlyHostsTheStoreForRanksStartedOtherwise) {
  const std::string loss = trainer_loss({"-n", "2", "--", TRAINER, "--steps", "10"});
  auto env = bare_environment();
  env["COMMS_STORE_TOKEN"] = "launch-test-token";
  Process store = Process::start({COMMSRUN, "--store-only", "--timeout", "100"}, env);
  std::smatch address;
  const std::regex printed(R"((tcp://127\.0\.0\.1:\d+)\n)");
  ASSERT_TRUE(store.read_until([&](const std::string& o) { return std::regex_search(o, address, printed); }, 30s))
      << store.output;
  env["COMMS_STORE"] = address[1].str();
  env["WORLD_SIZE"] = "2";
  auto ranks = start_ranks(
      2, env, [](int r) { return std::map<std::string, std::string>{{"RANK", std::to_string(r)}}; }, {"--steps", "10"});
  expect_all_succeed(ranks, loss);
  ::kill(store.pid, SIGTERM);
  EXPECT_TRUE(store.wait(10s)) << store.output;
  EXPECT_EQ(store.exit_code(), 0) << store.output;
  EXPECT_NE(store.output.find("store-only: SIGTERM; the store stops"), std::string::npos) << store.output;
}

// A COMMS_STORE that nothing hosts: the error says who must host it.
TEST(Launch, ACommsStoreNobodyHostsFailsSayingHowToHostOne) {
  auto env = bare_environment();
  const std::string store = "tcp://127.0.0.1:" + std::to_string(comms::testing::free_loopback_port());
  env["COMMS_STORE"] = store;
  env["COMMS_INIT_TIMEOUT"] = "1s";
  env["RANK"] = "0";
  env["WORLD_SIZE"] = "2";
  const auto p = run({TRAINER, "--steps", "1"}, env, 30s);
  EXPECT_NE(p.exit_code(), 0) << p.output;
  EXPECT_NE(p.output.find("COMMS_STORE='" + store + "': could not connect to the TCP store"), std::string::npos)
      << p.output;
  EXPECT_NE(p.output.find("start one first, e.g. commsrun --store-only"), std::string::npos) << p.output;
}

// A key an earlier run left in a shared file store is refused with what to
// do; with a job id each job gets its own subfolder and runs.
TEST(Launch, AFileStoreIsPerJobOrRefusedWhenAnEarlierRunLeftKeys) {
  TempDir dir;
  const auto stale = dir.path / "comms%2Fworld%2Fold";
  std::ofstream(stale) << "127.0.0.1:1";
  const std::time_t hour_ago = std::time(nullptr) - 3600;
  const utimbuf times{hour_ago, hour_ago};
  ASSERT_EQ(::utime(stale.c_str(), &times), 0);
  const std::string store = "file://" + dir.path.string();
  auto env = bare_environment();
  env["COMMS_STORE"] = store;
  env["COMMS_INIT_TIMEOUT"] = "30s";
  env["WORLD_SIZE"] = "2";
  // Started by hand: under commsrun, the ranks' COMMS_STORE is commsrun's own store.
  const auto rank_variables = [](int r) { return std::map<std::string, std::string>{{"RANK", std::to_string(r)}}; };
  auto refused = start_ranks(2, env, rank_variables, {"--steps", "5"});
  for (auto& rank : refused) {
    ASSERT_TRUE(rank.wait(60s)) << rank.output;
    EXPECT_NE(rank.exit_code(), 0) << rank.output;
    EXPECT_NE(rank.output.find("COMMS_STORE='" + store + "' holds keys from an earlier run ('comms%2Fworld%2Fold' "
                               "was written 36"),
              std::string::npos)
        << rank.output;
    EXPECT_NE(rank.output.find("or set COMMS_JOB_ID to a value unique to each job"), std::string::npos)
        << rank.output;
    EXPECT_LT(rank.elapsed_s(), 20) << "it waited instead of refusing";
  }

  env["COMMS_JOB_ID"] = "job-7";
  auto ran = start_ranks(2, env, rank_variables, {"--steps", "5"});
  for (auto& rank : ran) {
    ASSERT_TRUE(rank.wait(60s)) << rank.output;
    EXPECT_EQ(rank.exit_code(), 0) << rank.output;
  }
  EXPECT_TRUE(std::filesystem::is_directory(dir.path / "job-7")) << "the job's keys are not in its own subfolder";
}

}  // namespace
