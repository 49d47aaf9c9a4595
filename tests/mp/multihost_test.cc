// Multi-host jobs, each host a network namespace the test makes (netns.h):
// commsrun --nnodes N per namespace gives the single-host final loss, Gloo
// binds the interface COMMS_GLOO_IFNAME names, a link taken down mid-run
// ends every rank within the op timeout, and a slow or distant link slows a
// run without failing it (the distance made by a delay line, since this
// kernel has no sch_netem). Runs only as root with `ip netns`; skipped
// otherwise. Every namespace and process is gone afterwards, also when a
// case fails. The conformance suite's reductions and gathers pass with two
// ranks on each of two hosts, on every CPU backend built.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "netns.h"

namespace {

using namespace comms::testing::netns;
using namespace std::chrono_literals;

constexpr int kStorePort = 29500;
constexpr int kRanksPerNode = 2;
constexpr char kToken[] = "multihost-test-secret";

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double final_loss(const std::string& output) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex(R"(final_loss=([-0-9.eE+na]+))"))) return NAN;
  return std::stod(m[1]);
}

// The environment of every rank: the store's token (ignored by a library
// without store authentication) and nothing inherited that would change the
// Gloo binding.
std::map<std::string, std::string> env(const std::map<std::string, std::string>& extra = {}) {
  std::map<std::string, std::string> e = {{"COMMS_STORE_TOKEN", kToken},
                                          {"COMMS_BACKEND", "cpu:gloo"},
                                          {"COMMS_GLOO_IFNAME", ""},
                                          {"COMMS_GLOO_HOSTNAME", ""},
                                          {"COMMS_OP_TIMEOUT", "30s"},
                                          {"COMMS_INIT_TIMEOUT", "30s"}};
  for (const auto& [k, v] : extra) e[k] = v;
  return e;
}

// commsrun for node i of a `nodes`-node job with the store on node 0's eth0.
std::unique_ptr<Job> start_node(const Network& net, int i, int nodes, const std::vector<std::string>& trainer_args,
                                const std::map<std::string, std::string>& environment, bool keep_going = false) {
  std::vector<std::string> argv = {COMMSRUN, "-n", std::to_string(kRanksPerNode), "--nnodes", std::to_string(nodes),
                                   "--node-rank", std::to_string(i), "--master-addr", Network::address(0, 0),
                                   "--master-port", std::to_string(kStorePort), "--timeout", "50",
                                   "--exit-barrier-timeout", "20"};
  if (keep_going) argv.push_back("--keep-going");
  argv.insert(argv.end(), {"--", TRAINER});
  argv.insert(argv.end(), trainer_args.begin(), trainer_args.end());
  return std::make_unique<Job>(net.node(i), argv, environment);
}

std::vector<std::unique_ptr<Job>> start_job(const Network& net, int nodes, const std::vector<std::string>& trainer_args,
                                            const std::map<std::string, std::string>& environment) {
  std::vector<std::unique_ptr<Job>> jobs;
  for (int i = 0; i < nodes; ++i) jobs.push_back(start_node(net, i, nodes, trainer_args, environment));
  return jobs;
}

std::vector<Job*> raw(const std::vector<std::unique_ptr<Job>>& jobs) {
  std::vector<Job*> out;
  for (const auto& j : jobs) out.push_back(j.get());
  return out;
}

std::string outputs(const std::vector<std::unique_ptr<Job>>& jobs) {
  std::string out;
  for (size_t i = 0; i < jobs.size(); ++i) out += "--- node " + std::to_string(i) + ":\n" + jobs[i]->output();
  return out;
}

// Waits for a job and checks that every node exited 0; returns node 0's output.
std::string finish(const std::vector<std::unique_ptr<Job>>& jobs) {
  EXPECT_TRUE(wait_all(raw(jobs), Clock::now() + 55s)) << outputs(jobs);
  for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(jobs[i]->exit_code(), 0) << outputs(jobs);
  return jobs[0]->output();
}

// The same trainer on one host (node 0's loopback) with the same world size.
double single_host_loss(const Network& net, int world, const std::vector<std::string>& trainer_args) {
  std::vector<std::string> argv = {COMMSRUN, "-n", std::to_string(world), "--timeout", "50", "--", TRAINER};
  argv.insert(argv.end(), trainer_args.begin(), trainer_args.end());
  Job job(net.node(0), argv, env());
  EXPECT_TRUE(wait_all({&job}, Clock::now() + 55s)) << job.output();
  EXPECT_EQ(job.exit_code(), 0) << job.output();
  const double loss = final_loss(job.output());
  EXPECT_FALSE(std::isnan(loss)) << job.output();
  return loss;
}

// Waits until node 0's rank 0 has finished its first step (every
// communicator is connected by then).
bool past_first_step(const std::vector<std::unique_ptr<Job>>& jobs) {
  const bool ok = pump_until(raw(jobs), [&] { return jobs[0]->find("] step 1 ") != nullptr; }, Clock::now() + 40s);
  EXPECT_TRUE(ok) << "no step 1 within 40 s\n" << outputs(jobs);
  return ok;
}

// Runs `while_held` with node i's ranks stopped (SIGSTOP): the other ranks
// block in their next collective, every connection stays as it is.
void with_node_stopped(const Job& node, const std::function<void()>& while_held) {
  const auto ranks = comms::testing::children_of(node.pid());
  EXPECT_EQ(ranks.size(), size_t{kRanksPerNode});
  for (pid_t r : ranks) ::kill(r, SIGSTOP);
  while_held();
  for (pid_t r : ranks) ::kill(r, SIGCONT);
}

class MultiHost : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
    remove_stale();
  }
  void TearDown() override {
    if (IsSkipped()) return;
    // Each case's Network is gone by now: nothing of ours may remain.
    const std::string ours = kPrefix + std::to_string(::getpid()) + "-";
    EXPECT_TRUE(namespaces_with_prefix(ours).empty()) << command({"ip", "netns", "list"}).output;
  }
};

TEST_F(MultiHost, ThreeHostsGiveTheSameFinalLossAsOneHostWithTheSameWorldSize) {
  Network net(3);
  const std::vector<std::string> args = {"--steps", "40", "--print-every", "20"};
  const double one_host = single_host_loss(net, 3 * kRanksPerNode, args);
  const std::string output = finish(start_job(net, 3, args, env()));
  EXPECT_NE(output.find("trainer: 6 ranks"), std::string::npos) << output;
  EXPECT_EQ(final_loss(output), one_host) << output;
}

// argv run on node i as its own host: in a UTS namespace named after the
// node as well, since comms' UCX tells hosts apart by boot id, host name and
// PID namespace (the network namespace alone would leave the four ranks on
// one host for it, talking through shared memory).
std::vector<std::string> as_own_host(const Network& net, int i, std::vector<std::string> argv) {
  argv.insert(argv.begin(), {"unshare", "--uts", "sh", "-c", "hostname \"$0\" && exec \"$@\"", net.node(i)});
  return argv;
}

// Waits (at most 10 s) until node i's eth0 runs: the kernel reports a
// veth's carrier up to a second after `link set up`, and UCX leaves the
// interfaces that do not run yet out of a worker's address (its peers on
// other hosts then find it unreachable).
bool eth0_running(const Network& net, int nodes) {
  const auto deadline = Clock::now() + 10s;
  for (int i = 0; i < nodes; ++i) {
    while (net.in_node(i, {"ip", "link", "show", "eth0"}).output.find("state UP") == std::string::npos) {
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(50ms);
    }
  }
  return true;
}

// `program` on 2 hosts x kRanksPerNode ranks, each host its own (as_own_host).
std::vector<std::unique_ptr<Job>> start_on_own_hosts(const Network& net, const std::vector<std::string>& program,
                                                     const std::map<std::string, std::string>& environment) {
  std::vector<std::unique_ptr<Job>> jobs;
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> argv = {COMMSRUN, "-n", std::to_string(kRanksPerNode), "--nnodes", "2", "--node-rank",
                                     std::to_string(i), "--master-addr", Network::address(0, 0), "--master-port",
                                     std::to_string(kStorePort), "--timeout", "100", "--"};
    argv.insert(argv.end(), program.begin(), program.end());
    jobs.push_back(std::make_unique<Job>(net.node(i), as_own_host(net, i, argv), environment));
  }
  return jobs;
}

// The ops whose paths know hosts (the UCX plan's hierarchical all_reduce and
// all_gather), every dtype, reduction, placement and count (the large one
// runs each phase's large-message algorithm, and all_gather's the flat one).
TEST_F(MultiHost, ConformanceReductionsAndGathersPassWithTwoRanksOnEachOfTwoHosts) {
  if (find_tool("unshare").empty()) GTEST_SKIP() << "needs util-linux's unshare (a host name per node)";
  std::vector<std::string> backends = {"cpu:gloo"};
#if UCX_PLUGIN_BUILT
  backends.push_back("cpu:ucx");
#endif
  Network net(2);
  ASSERT_TRUE(eth0_running(net, 2)) << command({"ip", "-n", net.node(1), "link", "show"}).output;
  for (const auto& backend : backends) {
    SCOPED_TRACE(backend);
    const auto e = env({{"COMMS_BACKEND", backend}});
    auto jobs = start_on_own_hosts(
        net, {CONFORMANCE, "--backend", backend, "--filter", "world/all_reduce/*,world/all_gather/*"}, e);
    ASSERT_TRUE(wait_all(raw(jobs), Clock::now() + 110s)) << outputs(jobs);
    for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(jobs[i]->exit_code(), 0) << outputs(jobs);
    std::smatch m;
    const std::string report = jobs[0]->output();
    ASSERT_TRUE(std::regex_search(report, m, std::regex(R"((\d+) passed, (\d+) failed, \d+ skipped)"))) << report;
    EXPECT_GT(std::stoi(m[1]), 100) << report;
    EXPECT_EQ(m[2], "0") << report;
#if UCX_PLUGIN_BUILT
    if (backend != "cpu:ucx") continue;
    // The same placement takes the hierarchical paths (so the cases above ran them).
    const std::pair<std::string, std::string> paths[] = {{"all_reduce", "hierarchical: reduce in each host"},
                                                         {"all_gather", "hierarchical: all_gather in each host"}};
    for (const auto& [op, path] : paths) {
      auto bench = start_on_own_hosts(net, {COMMS_BENCH, "-C", op, "-b", "4K", "-e", "4K", "--iters", "3",
                                            "--warmup", "1", "--check", "1", "--backend", backend}, e);
      ASSERT_TRUE(wait_all(raw(bench), Clock::now() + 110s)) << outputs(bench);
      for (size_t i = 0; i < bench.size(); ++i) EXPECT_EQ(bench[i]->exit_code(), 0) << outputs(bench);
      EXPECT_NE(bench[0]->find(path), nullptr) << outputs(bench);
    }
#endif
  }
}

// An established TCP connection as `ss -tn` shows it.
struct Connection {
  std::string local, peer;  // addresses without the port
  int local_port = 0, peer_port = 0;
};

std::vector<Connection> established(const Network& net, int node) {
  std::vector<Connection> out;
  const CommandResult r = net.in_node(node, {"ss", "-tnH", "state", "established"});
  EXPECT_EQ(r.code, 0) << r.output;
  const std::regex re(R"((\d+\.\d+\.\d+\.\d+):(\d+)\s+(\d+\.\d+\.\d+\.\d+):(\d+))");
  for (const auto& line : lines_of(r.output)) {
    std::smatch m;
    if (std::regex_search(line, m, re)) out.push_back({m[1], m[3], std::stoi(m[2]), std::stoi(m[4])});
  }
  return out;
}

TEST_F(MultiHost, GlooPairsConnectOverTheInterfaceThatCommsGlooIfnameNames) {
  Network net(2, /*second_net=*/true);
  // The store is on net A (eth0). Unset, Gloo binds the address that reaches
  // the store; COMMS_GLOO_IFNAME=eth1 must move every pair to net B.
  for (const std::string iface : {"", "eth1"}) {
    SCOPED_TRACE("COMMS_GLOO_IFNAME='" + iface + "'");
    const int on = iface.empty() ? 0 : 1;
    auto jobs = start_job(net, 2, {"--steps", "40", "--print-every", "20"}, env({{"COMMS_GLOO_IFNAME", iface}}));
    std::vector<Connection> connections;
    if (past_first_step(jobs)) with_node_stopped(*jobs[1], [&] { connections = established(net, 0); });
    const std::string output = finish(jobs);
    EXPECT_FALSE(std::isnan(final_loss(output))) << output;

    int store = 0, gloo = 0;
    std::set<std::string> gloo_locals, gloo_peers;
    for (const auto& c : connections) {
      if (c.local_port == kStorePort || c.peer_port == kStorePort) {
        ++store;
        EXPECT_EQ(c.local, Network::address(0, 0)) << "a store connection off net A";
        continue;
      }
      ++gloo;
      gloo_locals.insert(c.local);
      gloo_peers.insert(c.peer);
    }
    // Two ranks here, each with two meshes to three peers per communicator
    // (the world and the trainer's data-parallel group).
    EXPECT_GE(gloo, 2 * 2 * 3 * 2);
    EXPECT_GE(store, 2) << "the ranks' store connections";
    EXPECT_EQ(gloo_locals, std::set<std::string>{Network::address(0, on)});
    EXPECT_EQ(gloo_peers, (std::set<std::string>{Network::address(0, on), Network::address(1, on)}));
  }
}

TEST_F(MultiHost, AnElasticJobThatLosesAHostFinishesOnTheOtherHostsRanks) {
  std::vector<std::string> backends = {"cpu:gloo"};
#if UCX_PLUGIN_BUILT
  backends.push_back("cpu:ucx");  // ucx across hosts
#endif
  for (const auto& backend : backends) {
    SCOPED_TRACE(backend);
    Network net(2);
    const auto e = env({{"COMMS_OP_TIMEOUT", "3s"}, {"COMMS_BACKEND", backend}});
    std::vector<std::unique_ptr<Job>> jobs;
    for (int i = 0; i < 2; ++i) {
      jobs.push_back(start_node(net, i, 2, {"--elastic", "--steps", "1500", "--print-every", "50"}, e, true));
    }
    const auto all = raw(jobs);
    ASSERT_TRUE(pump_until(all, [&] { return jobs[0]->find("] step 50 ") != nullptr; }, Clock::now() + 40s))
        << outputs(jobs);
    must({"ip", "-n", net.switch_ns(), "link", "set", Network::switch_port(1, 0), "down"});
    ASSERT_TRUE(pump_until(all, [&] { return jobs[0]->find("final_loss=") != nullptr; }, Clock::now() + 40s))
        << outputs(jobs);
    // Node 0's ranks exit 0 (commsrun then reports nothing for them); node
    // 1's, cut off from the store, are killed with their jobs.
    pump_until(all, [] { return false; }, Clock::now() + 3s);
    const Job& node0 = *jobs[0];
    EXPECT_NE(node0.find("recovered: lost ranks [2,3] in "), nullptr) << outputs(jobs);
    EXPECT_NE(node0.find("world=2"), nullptr) << outputs(jobs);
    for (int rank = 0; rank < kRanksPerNode; ++rank) {
      EXPECT_EQ(node0.find("rank " + std::to_string(rank) + " (pid "), nullptr) << "rank " << rank << " failed\n"
                                                                               << outputs(jobs);
    }
  }
}

TEST_F(MultiHost, ALinkTakenDownMidRunEndsEveryRankWithinTheOpTimeoutAndFailsTheJob) {
  Network net(2);
  constexpr auto kOpTimeout = 3s;
  auto jobs = start_job(net, 2, {"--steps", "100000000", "--print-every", "50"}, env({{"COMMS_OP_TIMEOUT", "3s"}}));
  const auto all = raw(jobs);
  ASSERT_TRUE(pump_until(all, [&] { return jobs[0]->find("] step 50 ") != nullptr; }, Clock::now() + 40s))
      << outputs(jobs);

  // Pull node 1's cable out of the switch.
  const auto down_at = Clock::now();
  must({"ip", "-n", net.switch_ns(), "link", "set", Network::switch_port(1, 0), "down"});
  // A node whose ranks failed still tries (5 s) to report to node 0's store.
  EXPECT_TRUE(wait_all(all, down_at + kOpTimeout + 5s + 7s)) << outputs(jobs);

  for (int i = 0; i < 2; ++i) {
    const Job& job = *jobs[i];
    SCOPED_TRACE("node " + std::to_string(i) + ":\n" + job.output());
    EXPECT_NE(job.exit_code(), 0);
    for (int local = 0; local < kRanksPerNode; ++local) {
      const int rank = i * kRanksPerNode + local;
      const Job::Line* error = job.find("[" + std::to_string(rank) + "] trainer: comms[");
      ASSERT_NE(error, nullptr) << "rank " << rank << " reported no comms error";
      EXPECT_TRUE(error->text.find(": timeout: ") != std::string::npos ||
                  error->text.find(": peer_failure: ") != std::string::npos)
          << error->text;
      // commsrun reports each rank's exit as it happens.
      const Job::Line* ended = job.find("rank " + std::to_string(rank) + " (pid ");
      ASSERT_NE(ended, nullptr) << "no exit reported for rank " << rank;
      EXPECT_LT(seconds(ended->at - down_at), seconds(kOpTimeout + 5s)) << ended->text;
      std::printf("rank %d ended %.2f s after the link went down: %s\n", rank, seconds(ended->at - down_at),
                  error->text.c_str());
    }
  }
}

// Seconds from a link was slowed to the job's end, and to node 0's report
// of its last step (the steps alone, without the job's teardown).
struct Slowed {
  double to_end = 0, to_last_step = 0;
};

// Runs `args` (with `--steps N`) on 2 hosts; after the first step
// (rendezvous and buffer sizing done on the healthy link) calls `degrade`
// (slowing node 1's link) while node 1's ranks are held. Returns node 0's
// output and the times from then.
Slowed degraded_run(const Network& net, const std::vector<std::string>& args, const std::function<void()>& degrade,
                    std::string* output) {
  auto jobs = start_job(net, 2, args, env());
  if (!past_first_step(jobs)) return {};
  Clock::time_point from;
  with_node_stopped(*jobs[1], [&] {
    degrade();
    from = Clock::now();
  });
  *output = finish(jobs);
  const auto steps = std::find(args.begin(), args.end(), "--steps");
  const Job::Line* last = steps == args.end() ? nullptr : jobs[0]->find("] step " + *(steps + 1) + " ");
  EXPECT_NE(last, nullptr) << "no report of the last step\n" << *output;
  return {seconds(jobs[0]->exited_at() - from), last ? seconds(last->at - from) : 0};
}

// A tc command for node 1's eth0, as a degradation.
std::function<void()> tc_on_node_1(const Network& net, const std::vector<std::string>& argv) {
  return [&net, argv] {
    const CommandResult r = net.in_node(1, argv);
    EXPECT_EQ(r.code, 0) << r.output;
  };
}

size_t open_fds() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// This kernel, like many, lacks sch_netem, so the latency is added by a
// delay line (delay_line.h) in place of node 1's cable rather than by
// `tc ... netem delay 5ms`: every frame each way is held 5 ms.
TEST_F(MultiHost, FiveMillisecondsOfAddedLatencySlowsButDoesNotFailARun) {
  if (::access("/dev/net/tun", R_OK | W_OK) != 0) GTEST_SKIP() << "the delay line needs /dev/net/tun (TAP devices)";
  const size_t fds_before = open_fds();
  {
    Network net(2, false, /*delayed_node=*/1);
    DelayLine& line = *net.delay_line();
    const int steps = 60;
    const std::vector<std::string> args = {"--steps", std::to_string(steps), "--print-every", "20"};
    const double one_host = single_host_loss(net, 2 * kRanksPerNode, args);
    std::string output;
    const uint64_t delayed_before = line.frames_delayed();
    const double elapsed = degraded_run(net, args, [&] { line.set_delay(5ms); }, &output).to_last_step;
    EXPECT_EQ(final_loss(output), one_host) << output;
    // Every step after the first needs node 1's gradients, which now cross a
    // link that holds each frame 5 ms each way. (Timed to the last step: the
    // job's teardown alone takes about as long as the bound, with no delay.)
    EXPECT_GE(elapsed, (steps - 1) * 0.005) << output;
    EXPECT_EQ(delayed_before, 0u);
    EXPECT_GT(line.frames_delayed(), uint64_t{steps}) << "frames the line held 5 ms";
    std::printf("5 ms link: %d steps took %.2f s to the last step; %llu frames forwarded, %llu held 5 ms, %llu dropped\n", steps - 1,
                elapsed, static_cast<unsigned long long>(line.frames_forwarded()),
                static_cast<unsigned long long>(line.frames_delayed()),
                static_cast<unsigned long long>(line.frames_dropped()));
  }
  // The delay line's TAP devices, eventfd and thread are gone with the network.
  EXPECT_EQ(open_fds(), fds_before);
}

TEST_F(MultiHost, ALinkLimitedToTwoMegabitsMidRunSlowsButDoesNotFailARun) {
  Network net(2);
  const std::vector<std::string> args = {"--steps", "40", "--print-every", "20", "--model", "mlp"};
  const double one_host = single_host_loss(net, 2 * kRanksPerNode, args);
  constexpr double kRateBytesPerS = 2e6 / 8;
  constexpr double kBurstBytes = 16 * 1024;
  std::string output;
  const double elapsed = degraded_run(
      net, args,
      tc_on_node_1(net, {"tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "2mbit", "burst", "16kb",
                         "latency", "2s"}),
      &output).to_end;
  EXPECT_EQ(final_loss(output), one_host) << output;
  // A token bucket passes at most burst + rate * t bytes in t seconds, so
  // what node 1 sent through it bounds the run's time from below.
  const std::string stats = net.in_node(1, {"tc", "-s", "qdisc", "show", "dev", "eth0"}).output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(stats, m, std::regex(R"(Sent (\d+) bytes)"))) << stats;
  const double bound = (std::stod(m[1]) - kBurstBytes) / kRateBytesPerS;
  std::printf("slow link: %s bytes sent, so at least %.2f s; took %.2f s\n", m[1].str().c_str(), bound, elapsed);
  EXPECT_GE(bound, 0.5) << "too little crossed the slow link to slow the run: " << stats;
  EXPECT_GE(elapsed, bound) << stats;
}

}  // namespace
