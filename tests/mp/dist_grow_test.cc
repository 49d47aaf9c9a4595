// comms::dist growth across processes, through commsrun --keep-going
// (dist_grow_helper.cc does the ranks' side): a killed rank's replica is
// dropped by the recovery, the dropped rank and a replacement join through
// join_process_group, the members admit them and the world is back to 4
// ranks with every group right (sums of 2^rank name each membership), on
// both routes; an admission with nobody waiting changes no Comm object; a
// size the layout cannot take grows the world and says why; a plain
// admit() keeps the groups and hands the newcomer the group list and name
// counter.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "rank_lines.h"
#include "subprocess.h"
#include "cpu_backends.h"

namespace {

using comms::testing::rank_lines;
using comms::testing::ranks_of;
using comms::testing::Process;
using comms::testing::run;
using namespace std::chrono_literals;

std::vector<std::string> backends() { return comms::testing::cpu_backends_built(); }

Process helper(int n, const std::string& backend, const std::string& mode, const std::string& route = "direct") {
  return run({COMMSRUN, "-n", std::to_string(n), "--keep-going", "--timeout", "80", "--", DIST_GROW_HELPER, mode},
             {{"COMMS_BACKEND", backend}, {"COMMS_ELASTIC", "1"}, {"COMMS_OP_TIMEOUT", "20s"},
              {"COMMS_INIT_TIMEOUT", "20s"}, {"COMMS_ROUTE", route}},
             85s);
}

const std::set<int> kFour = {0, 1, 2, 3};

// The names in "<list> [a,b,...]" of an ADMIT line.
std::set<std::string> names_in(const std::string& line, const std::string& list) {
  std::smatch m;
  std::set<std::string> out;
  if (!std::regex_search(line, m, std::regex(list + R"( \[([^\]]*)\])"))) return out;
  const std::string text = m[1];
  for (size_t start = 0; start < text.size();) {
    const size_t comma = std::min(text.find(',', start), text.size());
    out.insert(text.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

// Every participant reports the same admission: `joined` came in, from
// `members` to 4 ranks; the newcomers are exactly the joined ranks; each
// of `lists` ("rebuilt", "created", "kept") holds exactly the given names.
void expect_admission(const std::string& output, const std::string& joined, int members,
                      const std::set<int>& newcomers, const std::map<std::string, std::set<std::string>>& lists) {
  const auto admit = rank_lines(output, "ADMIT");
  ASSERT_EQ(ranks_of(admit), kFour) << output;
  const std::regex re(R"(newcomer (\d) (grown 1 joined \[([\d,]*)\] members (\d+) world 4 epoch \d+ .*))");
  std::string common;
  for (const auto& [r, rest] : admit) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(rest, m, re)) << rest;
    EXPECT_EQ(m[1], newcomers.count(r) ? "1" : "0") << "rank " << r;
    EXPECT_EQ(m[3], joined) << "rank " << r;
    EXPECT_EQ(std::stoi(m[4]), members) << "rank " << r;
    if (common.empty()) common = m[2];
    EXPECT_EQ(m[2], common) << "rank " << r << ": another admission than rank 0's";
  }
  for (const auto& [list, names] : lists) EXPECT_EQ(names_in(common, list), names) << list << " in " << common;
}

void expect_heal(const std::string& route) {
  for (const auto& backend : backends()) {
    SCOPED_TRACE(backend + " route " + route);
    Process p = helper(4, backend, "heal", route);
    EXPECT_EQ(p.exit_code(), 0) << p.output;
    EXPECT_NE(p.output.find("EXCLUDED old 2"), std::string::npos) << p.output;
    // tp=2 from 2 to 4 ranks: the groups spanning data-parallel replicas
    // (dp, dp_cp, tp_dp, ...: [0], [1] or [0,1]) get the newcomers; the
    // groups of the second replica ([2], [3], [2,3]) are new; the groups of
    // ranks 0 and 1 alone, A and E keep their comms.
    expect_admission(p.output, "2,3", 2, {2, 3},
                     {{"rebuilt", {"mp.dp_cp.0", "mp.dp_cp.1", "mp.dp.0", "mp.dp.1", "mp.tp_dp_cp.0", "mp.tp_dp.0",
                                   "mp.expt_dp.0", "mp.expt_dp.1"}},
                      {"created", {"mp.cp.2", "mp.cp.3", "mp.mp.1", "mp.tp.1", "mp.pp.2", "mp.pp.3", "mp.embd.2",
                                   "mp.embd.3", "mp.pos_embd.2", "mp.pos_embd.3", "mp.tp_cp.1", "mp.ep.2", "mp.ep.3",
                                   "mp.expt_tp.1", "mp.tp_ep.1", "mp.tp_ep_pp.1"}},
                      {"kept", {"A", "E", "mp.cp.0", "mp.cp.1", "mp.mp.0", "mp.tp.0", "mp.pp.0", "mp.pp.1",
                                "mp.embd.0", "mp.embd.1", "mp.pos_embd.0", "mp.pos_embd.1", "mp.tp_cp.0", "mp.ep.0",
                                "mp.ep.1", "mp.expt_tp.0", "mp.tp_ep.0", "mp.tp_ep_pp.0"}}});
    const auto groups = rank_lines(p.output, "GROUPS");
    ASSERT_EQ(ranks_of(groups), kFour) << p.output;
    const std::map<int, std::string> expected = {
        {0, "newcomer 0 world [0,1,2,3] 15 A [0,1] 3 E [0,1] 3 tp [0,1] 3 dp [0,2] 5"},
        {1, "newcomer 0 world [0,1,2,3] 15 A [0,1] 3 E [0,1] 3 tp [0,1] 3 dp [1,3] 10"},
        {2, "newcomer 1 world [0,1,2,3] 15 A none E none tp [2,3] 12 dp [0,2] 5"},
        {3, "newcomer 1 world [0,1,2,3] 15 A none E none tp [2,3] 12 dp [1,3] 10"}};
    // Every rank holds the same number of group specs, members or not.
    const std::string count = groups.at(0).substr(groups.at(0).rfind(" groups "));
    for (const auto& [r, rest] : groups) EXPECT_EQ(rest, expected.at(r) + count) << "rank " << r << "\n" << p.output;
    const auto made = rank_lines(p.output, "NEW");
    ASSERT_EQ(ranks_of(made), kFour) << p.output;
    for (const auto& [r, rest] : made) {
      EXPECT_EQ(rest, r == 0 ? "none name -" : "[1,2,3] 14 name pg1") << "rank " << r;
    }
    const auto idle = rank_lines(p.output, "IDLE");
    ASSERT_EQ(ranks_of(idle), kFour) << p.output;
    for (const auto& [r, rest] : idle) EXPECT_EQ(rest, "same 1 world [0,1,2,3] 15") << "rank " << r;
  }
}

TEST(DistGrow, ADroppedReplicaAndAReplacementJoinAndEveryGroupIsRightAt4Ranks) { expect_heal("direct"); }

// The collection's groups carved from the grown world with Comm::split:
// the newcomers take part in every split, members or not.
TEST(DistGrow, ADroppedReplicaAndAReplacementJoinOnTheSplitRouteAt4Ranks) { expect_heal("split"); }

TEST(DistGrow, AWorldSizeTheLayoutCannotTakeGrowsTheWorldAndLeavesTheCollectionUnusableSayingWhy) {
  for (const auto& backend : backends()) {
    SCOPED_TRACE(backend);
    Process p = helper(2, backend, "unfit");
    EXPECT_EQ(p.exit_code(), 0) << p.output;
    const auto unfit = rank_lines(p.output, "UNFIT");
    ASSERT_EQ(ranks_of(unfit), (std::set<int>{0, 1, 2})) << p.output;
    for (const auto& [r, rest] : unfit) {
      EXPECT_EQ(rest, std::string("code ") + (r < 2 ? "invalid_argument" : "none") + " world [0,1,2] 7 has_tp 0")
          << "rank " << r;
    }
    const auto why = rank_lines(p.output, "WHY");
    ASSERT_EQ(ranks_of(why), (std::set<int>{0, 1})) << p.output;
    for (const auto& [r, rest] : why) {
      EXPECT_NE(rest.find("the world grew to 3 ranks, which its layout cannot take"), std::string::npos) << rest;
    }
  }
}

TEST(DistGrow, APlainAdmitKeepsEveryGroupAndTheNewcomerCountsGroupNamesOnAt4Ranks) {
  for (const auto& backend : backends()) {
    SCOPED_TRACE(backend);
    Process p = helper(3, backend, "plain");
    EXPECT_EQ(p.exit_code(), 0) << p.output;
    expect_admission(p.output, "3", 3, {3}, {{"rebuilt", {}}, {"created", {}}, {"kept", {"pg1", "S"}}});
    const auto plain = rank_lines(p.output, "PLAIN");
    ASSERT_EQ(ranks_of(plain), kFour) << p.output;
    const std::map<int, std::string> expected = {
        {0, "newcomer 0 world [0,1,2,3] 15 pg1 [0,2] 5 S [0,1] 3 groups 3"},
        {1, "newcomer 0 world [0,1,2,3] 15 pg1 none S [0,1] 3 groups 3"},
        {2, "newcomer 0 world [0,1,2,3] 15 pg1 [0,2] 5 S [2] 4 groups 3"},
        {3, "newcomer 1 world [0,1,2,3] 15 pg1 none S none groups 3"}};
    for (const auto& [r, rest] : plain) EXPECT_EQ(rest, expected.at(r)) << "rank " << r << "\n" << p.output;
    // The newcomer counts on from the members' pg1: the next name is pg2 everywhere.
    const auto made = rank_lines(p.output, "NEW");
    ASSERT_EQ(ranks_of(made), kFour) << p.output;
    for (const auto& [r, rest] : made) {
      EXPECT_EQ(rest, r == 1 || r == 3 ? "[1,3] 10 name pg2" : "none name -") << "rank " << r;
    }
  }
}

}  // namespace
