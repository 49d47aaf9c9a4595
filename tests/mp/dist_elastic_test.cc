// comms::dist recovery across processes, through commsrun --keep-going (the
// helper SIGKILLs one rank inside a world all_reduce): groups holding the lost
// rank rebuilt with the right members and sums, a group without it kept
// (same Comm object) and working; a model-parallel layout shrunk by the
// drop-replicas rule (the dropped rank told so), and refused with the reason
// when no rule is given. DIST_ELASTIC_BACKENDS runs gloo and, when built, ucx.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "subprocess.h"
#include "cpu_backends.h"

namespace {

using comms::testing::Process;
using comms::testing::run;
using namespace std::chrono_literals;

std::vector<std::string> backends() { return comms::testing::cpu_backends_built(); }

// COMMS_ROUTE as the test job has it (DistElastic.*SplitRoute* sets "split").
std::string route = "direct";

Process helper(int n, const std::string& backend, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {COMMSRUN, "-n", std::to_string(n), "--keep-going", "--timeout", "50", "--",
                                   DIST_ELASTIC_HELPER};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv,
             {{"COMMS_BACKEND", backend}, {"COMMS_ELASTIC", "1"}, {"COMMS_OP_TIMEOUT", "20s"},
              {"COMMS_INIT_TIMEOUT", "20s"}, {"COMMS_ROUTE", route}},
             55s);
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

long long mask(const std::vector<int>& old_ranks) {
  long long m = 0;
  for (int r : old_ranks) m += 1LL << r;
  return m;
}

void expect_lines(const Process& p, const std::vector<std::string>& lines) {
  EXPECT_EQ(p.exit_code(), 0) << p.output;
  for (const auto& l : lines) EXPECT_NE(p.output.find(l), std::string::npos) << "missing: " << l << "\n" << p.output;
}

// groups K=1: A = [0..n-2], B = [n-2,n-1], C = [1,n-1], D = [1], E = split
// {0,1,2} | {3..n-1}. Old rank o becomes o - (o > 1).
void expect_groups(int n) {
  const int lost = 1;
  auto renum = [&](int o) { return o - (o > lost ? 1 : 0); };
  std::vector<int> a, high;
  for (int r = 0; r + 1 < n; ++r) a.push_back(r);
  for (int r = 3; r < n; ++r) high.push_back(r);
  std::map<std::string, std::vector<int>> before = {
      {"A", a}, {"B", {n - 2, n - 1}}, {"C", {1, n - 1}}, {"D", {1}}, {"E", {}}};
  for (const auto& backend : backends()) {
    SCOPED_TRACE(backend + " at " + std::to_string(n) + " ranks");
    Process p = helper(n, backend, {"groups", std::to_string(lost)});
    std::vector<std::string> want;
    std::vector<int> survivors, renumbered;
    for (int o = 0; o < n; ++o) {
      if (o != lost) {
        survivors.push_back(o);
        renumbered.push_back(renum(o));
      }
    }
    for (int o : survivors) {
      want.push_back("RESULT old " + std::to_string(o) + " new " + std::to_string(renum(o)) + " world " +
                     std::to_string(n - 1) + " epoch 1 lost [1] rebuilt [A,C,E] kept [B] removed [D]\n");
      want.push_back("GROUP " + std::to_string(o) + " world ranks [" + join(renumbered) + "] sum " +
                     std::to_string(mask(survivors)) + "\n");
      for (auto [name, members] : before) {
        if (name == "E") members = o <= 2 ? std::vector<int>{0, 1, 2} : high;
        std::vector<int> left, left_new;
        for (int m : members) {
          if (m != lost) {
            left.push_back(m);
            left_new.push_back(renum(m));
          }
        }
        const auto me = std::find(left.begin(), left.end(), o);
        if (me == left.end()) {
          want.push_back("GROUP " + std::to_string(o) + " " + name + " none\n");
          continue;
        }
        want.push_back("GROUP " + std::to_string(o) + " " + name + " ranks [" + join(left_new) + "] rank " +
                       std::to_string(me - left.begin()) + " sum " + std::to_string(mask(left)) + " same_comm " +
                       (name == "B" ? "1" : "0") + "\n");
      }
    }
    expect_lines(p, want);
    EXPECT_NE(p.output.find("lost ranks [1]"), std::string::npos) << p.output;
  }
}

TEST(DistElastic, GroupsHoldingTheLostRankAreRebuiltAndOthersKeptAt4Ranks) { expect_groups(4); }
TEST(DistElastic, GroupsHoldingTheLostRankAreRebuiltAndOthersKeptAt8Ranks) { expect_groups(8); }
// Groups carved from the world with Comm::split: rebuilt by splitting the
// recovered world (every rank takes part), kept ones untouched.
TEST(DistElastic, GroupsOnTheSplitRouteAreRebuiltFromTheRecoveredWorldAt4Ranks) {
  route = "split";
  expect_groups(4);
  route = "direct";
}

// tp=2, rank `lost` killed, drop_replicas(): its tp partner is dropped; the
// rest are renumbered in order with dp = (n - 2) / 2.
void expect_drop_replica(int n, int lost) {
  const int partner = lost ^ 1;
  std::vector<int> survivors;
  for (int o = 0; o < n; ++o) {
    if (o != lost && o != partner) survivors.push_back(o);
  }
  const int m = static_cast<int>(survivors.size());
  for (const auto& backend : backends()) {
    SCOPED_TRACE(backend + " at " + std::to_string(n) + " ranks");
    Process p = helper(n, backend, {"mp", "2", "drop", std::to_string(lost)});
    std::vector<std::string> want = {"EXCLUDED old " + std::to_string(partner) + " lost [" + std::to_string(lost) +
                                     "] dropped [" + std::to_string(partner) + "] initialized 0\n"};
    for (int r = 0; r < m; ++r) {
      const std::vector<int> tp = {r & ~1, r | 1};
      std::vector<int> dp;
      for (int x = r % 2; x < m; x += 2) dp.push_back(x);
      std::vector<int> tp_old, dp_old;
      for (int x : tp) tp_old.push_back(survivors[x]);
      for (int x : dp) dp_old.push_back(survivors[x]);
      want.push_back("MP old " + std::to_string(survivors[r]) + " new " + std::to_string(r) + " world " +
                     std::to_string(m) + " dp_size " + std::to_string(m / 2) + " dropped [" + std::to_string(partner) +
                     "] tp [" + join(tp) + "] dp [" + join(dp) + "] tp_sum " + std::to_string(mask(tp_old)) +
                     " dp_sum " + std::to_string(mask(dp_old)) + " tp_same 1\n");
    }
    expect_lines(p, want);
  }
}

TEST(DistElastic, ModelParallelLayoutDropsTheReplicaOfTheLostRankAt8Ranks) { expect_drop_replica(8, 3); }
TEST(DistElastic, ModelParallelLayoutDropsTheReplicaOfTheLostRankAt4Ranks) { expect_drop_replica(4, 1); }

TEST(DistElastic, ModelParallelLayoutThatCannotShrinkWithoutARuleSaysWhy) {
  for (const auto& backend : backends()) {
    SCOPED_TRACE(backend);
    Process p = helper(4, backend, {"mp", "2", "none", "1"});
    std::vector<std::string> want;
    for (int o : {0, 2, 3}) {
      want.push_back("WORLD " + std::to_string(o) + " size 3 sum 13 has_tp 0\n");
    }
    want.push_back("REFUSED invalid_argument comms::dist model parallel: collection 'mp1' cannot shrink: losing ranks "
                   "[1] of 4 leaves 3 ranks, which the layout (tp=2 pp=1 cp=1 ep=1 order=tp-cp-ep-dp-pp) cannot "
                   "take: comms::dist model parallel: the world size 3 is not divisible by tp*pp*cp = 2*1*1 = 2. "
                   "Pass a ShrinkRule");
    expect_lines(p, want);
    // Every survivor gets the same refusal.
    size_t refusals = 0;
    for (size_t at = p.output.find("REFUSED"); at != std::string::npos; at = p.output.find("REFUSED", at + 1)) ++refusals;
    EXPECT_EQ(refusals, 3u) << p.output;
  }
}

}  // namespace
